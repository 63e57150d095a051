"""Tiny random causal LMs over a small vocabulary (V = 16-32) with a word-level tokenizer
("t0", "t1", ...), saved as safetensors: small enough that the exact distribution of the first
generated tokens can be enumerated, for the engine-level losslessness tests."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast


def build_tokenizer(vocab: int, names: list[str] | None = None) -> PreTrainedTokenizerFast:
    """Word-level tokenizer over ``names`` (default t0..t{vocab-1}); no special tokens, no EOS."""
    names = names or [f"t{i}" for i in range(vocab)]
    tok = Tokenizer(models.WordLevel({n: i for i, n in enumerate(names)}, unk_token=names[-1]))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def build_model(vocab: int, seed: int = 0, hidden: int = 32, layers: int = 1, init: float = 0.15) -> LlamaForCausalLM:
    """A random Llama with ``vocab`` output rows and no EOS (eos_token_id None)."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                      initializer_range=init, bos_token_id=None, eos_token_id=None, pad_token_id=None,
                      tie_word_embeddings=False)
    return LlamaForCausalLM(cfg).eval()


def perturb(model: torch.nn.Module, scale: float, seed: int) -> torch.nn.Module:
    """Add N(0, (scale * std)^2) noise to every weight matrix (a draft that resembles its target)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for prm in model.parameters():
            if prm.dim() > 1:
                prm.add_(torch.randn(prm.shape, generator=g) * scale * prm.std())
    return model


def save(path: Path, vocab: int, seed: int = 0, tokenizer_vocab: int | None = None,
         names: list[str] | None = None, noise: float = 0.0, noise_seed: int = 1, pad_rows: int = 0,
         **kw) -> Path:
    """Save a model with ``vocab`` rows and a tokenizer of ``tokenizer_vocab`` (default vocab) tokens;
    ``noise`` > 0: the model of ``seed`` perturbed by :func:`perturb`; ``pad_rows``: that many extra
    vocabulary rows beyond the tokenizer, with output weights large enough to win unless cut."""
    model = build_model(vocab, seed, **kw)
    if noise:
        perturb(model, noise, noise_seed)
    if pad_rows:
        model.resize_token_embeddings(vocab + pad_rows, mean_resizing=False)
        with torch.no_grad():
            model.get_output_embeddings().weight[vocab:] = 50.0 * model.get_output_embeddings().weight[:1].sign()
    model.generation_config.eos_token_id = None
    model.save_pretrained(path, safe_serialization=True)
    build_tokenizer(tokenizer_vocab or vocab, names).save_pretrained(path)
    return path
