"""Loading target / draft models safely (safetensors only, no remote code).

With no model named, the bundled demo family in ``assets/models/`` is used (trained by
``python -m specviz.train``; see its model card).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

ASSETS_MODELS = Path(__file__).resolve().parent.parent / "assets" / "models"
DEFAULT_TARGET = ASSETS_MODELS / "specviz-target"
DEFAULT_DRAFT = ASSETS_MODELS / "specviz-draft"

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


class ModelLoadError(ValueError):
    """A model could not be loaded; the message says what was tried and what to change."""


def resolve_device(device: str | torch.device | None) -> torch.device:
    """None -> CUDA when available, else CPU. Raises ValueError for an unusable device."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for but no CUDA GPU is available; use device='cpu'")
    return dev


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """None -> bfloat16 on CUDA, float32 on CPU."""
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(DTYPES)}")
    return DTYPES[dtype]


def load_model(name_or_path: str | os.PathLike, device: torch.device, dtype: torch.dtype):
    """Load a causal LM (safetensors weights only, ``trust_remote_code=False``) in eval mode.

    ``name_or_path``: a local directory with config.json + *.safetensors, or a hub id (only
    where a hub is reachable). Raises :class:`ModelLoadError` with a readable message."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # no "Loading weights" bars for a 2-second load
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(name_or_path), dtype=dtype, use_safetensors=True, trust_remote_code=False
        )
    except Exception as exc:  # transformers raises OSError/ValueError/EnvironmentError variants
        raise ModelLoadError(_explain(name_or_path, exc)) from exc
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    return model.to(device).eval()


def load_tokenizer(name_or_path: str | os.PathLike):
    """The model's HF tokenizer (fast tokenizers only, no remote code)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(name_or_path), trust_remote_code=False)
    except Exception as exc:
        raise ModelLoadError(_explain(name_or_path, exc)) from exc


def _explain(name_or_path: str | os.PathLike, exc: Exception) -> str:
    path = Path(name_or_path)
    if not path.exists() and ("/" not in str(name_or_path) or str(name_or_path).startswith((".", "/"))):
        hint = "no such directory"
    elif path.exists() and not any(path.glob("*.safetensors")):
        hint = "the directory has no *.safetensors weights (specviz loads safetensors only)"
    else:
        hint = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return (f"could not load model {str(name_or_path)!r}: {hint}. Give a local model directory "
            f"(config.json + safetensors + tokenizer files) or a hub id on a machine that can reach the hub.")


SPECIAL_ATTRS = ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id")


def tokenizer_mismatch(target_tok, draft_tok, show: int = 3) -> str | None:
    """Why ``draft_tok`` cannot serve the target's token ids (None when it can).

    Compares what speculative decoding relies on (the draft's token ids must mean the target's):
    the number of tokens (added tokens included), the token string of every id, and the special
    tokens (bos / eos / pad / unk ids and the list of special tokens). Model vocabularies
    (embedding rows) may still differ by padding beyond the tokenizer (vLLM pads the draft
    distribution with zeros, e.g. 151936 vs 152064 rows in Qwen models): see
    :func:`check_vocab_rows`. Returns a message naming the first ``show`` differing ids."""
    n_t, n_d = len(target_tok), len(draft_tok)
    a = target_tok.convert_ids_to_tokens(list(range(min(n_t, n_d))))
    b = draft_tok.convert_ids_to_tokens(list(range(min(n_t, n_d))))
    diff = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
    problems = []
    if diff:
        listed = ", ".join(f"id {i}: {a[i]!r} vs {b[i]!r}" for i in diff[:show])
        problems.append(f"{len(diff)} of the {min(n_t, n_d)} shared ids have different token strings ({listed})")
    if n_t != n_d:
        problems.append(f"the target's tokenizer has {n_t} tokens, the draft's {n_d}")
    for attr in SPECIAL_ATTRS:
        x, y = getattr(target_tok, attr, None), getattr(draft_tok, attr, None)
        if x != y:
            problems.append(f"{attr} is {x} in the target's tokenizer, {y} in the draft's")
    if sorted(target_tok.all_special_tokens) != sorted(draft_tok.all_special_tokens):
        problems.append(f"special tokens differ: {sorted(target_tok.all_special_tokens)} vs "
                        f"{sorted(draft_tok.all_special_tokens)}")
    if not problems:
        return None
    return ("the draft's tokenizer differs from the target's: " + "; ".join(problems) +
            ". Speculative decoding needs a draft with the target's tokenizer (the same token for every id).")


def check_vocab_rows(target_rows: int, draft_rows: int, tokenizer_len: int) -> None:
    """Raise ValueError unless both models have a row for every token of the shared tokenizer;
    rows beyond it are padding (a difference there is fine: q is cut or padded with zeros to the
    target's rows)."""
    if min(target_rows, draft_rows) < tokenizer_len:
        raise ValueError(f"the draft's vocabulary ({draft_rows} rows) and the target's ({target_rows} rows) must both "
                         f"cover the shared tokenizer's {tokenizer_len} tokens; the draft model must share the "
                         "target's tokenizer")
