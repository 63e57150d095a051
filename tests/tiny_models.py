"""Tiny random HF models (Llama, Qwen2) built from a config, with a small byte-level BPE
tokenizer, saved as safetensors so they load through the same path as real models."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "def sub(a, b):\n    return a - b\n",
    "for i in range(10):\n    print(i)\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "the quick brown fox jumps over the lazy dog. " * 3,
]
VOCAB = 320


def build_tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - 4, special_tokens=["<|endoftext|>", "<|pad|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>",
                                   pad_token="<|pad|>")


def build_model(arch: str, seed: int = 0, layers: int = 2, hidden: int = 64) -> torch.nn.Module:
    torch.manual_seed(seed)
    common = dict(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  initializer_range=0.3, bos_token_id=0, eos_token_id=0, pad_token_id=1, tie_word_embeddings=False)
    if arch == "llama":
        return LlamaForCausalLM(LlamaConfig(**common)).eval()
    if arch == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(**common)).eval()
    raise ValueError(arch)


def save_model(arch: str, path: Path, seed: int = 0, **kw) -> Path:
    model = build_model(arch, seed, **kw)
    model.save_pretrained(path, safe_serialization=True)
    build_tokenizer().save_pretrained(path)
    return path
