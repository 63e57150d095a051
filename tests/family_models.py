"""Tiny random checkpoints of many transformers families (fp32, the bundled byte-level tokenizer), saved as
HF model directories so that they load through specviz's own loader. Sliding-window families get a tiny
window (:data:`WINDOW`) so that short prompts exceed it and rollbacks cross it.

``FAMILIES``: name -> (config class name in ``transformers``, causal-LM class name, config overrides).
"""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

from tiny_models import VOCAB, build_tokenizer

WINDOW = 4  # the sliding window of every windowed family here: a query sees itself and 3 keys before it
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.3, bos_token_id=0,
              eos_token_id=0, pad_token_id=1, tie_word_embeddings=False)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
GEMMA_TYPES = ["sliding_attention", "full_attention", "sliding_attention"]  # hybrid: window and full layers

FAMILIES: dict[str, tuple[str, str, dict]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen2-window": ("Qwen2Config", "Qwen2ForCausalLM",  # layer_types: layer 0 full, layer 1 sliding
                     dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=16)),
    "qwen3-moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(head_dim=16, **MOE)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(num_local_experts=4, num_experts_per_tok=2,
                                                            sliding_window=None)),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", dict(num_experts=4, num_experts_per_tok=2)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=None)),
    "mistral-window": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=WINDOW)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(pad_token_id=1)),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {}),
    "granite": ("GraniteConfig", "GraniteForCausalLM", {}),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", {}),
    "gpt-neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(use_parallel_residual=True)),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(n_embd=64, n_layer=2, n_head=4, n_positions=256)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(head_dim=16, sliding_window=WINDOW, num_hidden_layers=3,
                                                         layer_types=GEMMA_TYPES)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(head_dim=16, sliding_window=WINDOW,
                                                             num_hidden_layers=3, layer_types=GEMMA_TYPES)),
    "gemma4": ("Gemma4TextConfig", "Gemma4ForCausalLM", dict(head_dim=16, global_head_dim=32, sliding_window=WINDOW,
                                                             num_hidden_layers=3, layer_types=GEMMA_TYPES,
                                                             vocab_size_per_layer_input=VOCAB,
                                                             hidden_size_per_layer_input=8)),
    "gpt-oss": ("GptOssConfig", "GptOssForCausalLM", dict(head_dim=16, sliding_window=WINDOW, num_hidden_layers=3,
                                                         layer_types=GEMMA_TYPES, num_local_experts=4,
                                                         num_experts_per_tok=2)),
    "cohere2": ("Cohere2Config", "Cohere2ForCausalLM", dict(sliding_window=WINDOW, num_hidden_layers=3,
                                                            layer_types=GEMMA_TYPES)),
}
SLIDING = ("qwen2-window", "mistral-window", "gemma2", "gemma3", "gemma4", "gpt-oss", "cohere2")
MOE_FAMILIES = ("qwen3-moe", "mixtral", "olmoe", "gpt-oss")


def build_family(name: str, seed: int = 0, layers: int | None = None) -> torch.nn.Module:
    """A tiny random ``name`` model in eval mode (fp32). ``layers``: fewer decoder layers (a draft); the
    layer-type list is cut to match, keeping at least one of each type when there is room."""
    config_cls, model_cls, over = FAMILIES[name]
    kw = {**COMMON, **{k: list(v) if isinstance(v, list) else v for k, v in over.items()}}  # configs edit lists
    if name == "gpt2":
        kw = {k: v for k, v in kw.items() if k not in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                                        "num_attention_heads", "num_key_value_heads",
                                                        "max_position_embeddings", "tie_word_embeddings")}
    if layers is not None:
        kw["n_layer" if name == "gpt2" else "num_hidden_layers"] = layers
        if "layer_types" in kw:
            kw["layer_types"] = kw["layer_types"][:layers]
    torch.manual_seed(seed)
    config = getattr(transformers, config_cls)(**kw)
    return getattr(transformers, model_cls)(config).eval()


def save_family(name: str, path: Path, seed: int = 0, layers: int | None = None) -> Path:
    """:func:`build_family` saved as safetensors with the bundled tokenizer; returns ``path``."""
    build_family(name, seed, layers).save_pretrained(path, safe_serialization=True)
    build_tokenizer().save_pretrained(path)
    return path
