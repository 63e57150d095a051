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
