"""What :meth:`specviz.engine.SpecDecoder.from_pretrained` loads: the target, an optional draft, their tokenizers,
the heads of the registered methods that have one, and the runner every request of the decoder gets.

Weights load with safetensors only (:mod:`specviz.models`); each method's head through its own loader
(``Method.head.load``). The bundled demo target comes with the bundled draft and heads (``assets/models``).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any, Callable

import torch

from . import methods
from .compile_stage import initial_status, runner_compile
from .heads.formats import load_head_dir
from .models import (ASSETS_MODELS, DEFAULT_DRAFT, DEFAULT_TARGET, ModelLoadError, load_model, load_tokenizer,
                     resolve_device, resolve_dtype, source_info)
from .runner import EagerRunner
from .static_runner import StaticRunner

RUNNERS = ("auto", "eager", "static")


def load_parts(target: str | None, draft: str | None, device: Any, dtype: Any, runner: str, max_cache_len: int,
               heads: dict[str, str] | None, compile: bool | str | None) -> dict[str, Any]:
    """The keyword arguments of :class:`~specviz.engine.SpecDecoder` for :meth:`~specviz.engine.SpecDecoder.
    from_pretrained`'s arguments (documented there). Raises ValueError for an unknown runner or head method and
    :class:`~specviz.models.ModelLoadError` (a ValueError) for a model or an explicitly given head that does not
    load."""
    if runner not in RUNNERS:
        raise ValueError(f"unknown runner {runner!r}; choose one of {', '.join(RUNNERS)}")
    dev = resolve_device(device)
    factory_compile = runner_compile(compile)  # ValueError for an unknown compile value, before any loading
    bundled_target = target is None
    if bundled_target:
        target = DEFAULT_TARGET
        draft = DEFAULT_DRAFT if draft is None and DEFAULT_DRAFT.exists() else draft
    dt = resolve_dtype(dtype, dev)
    target_model = load_model(target, dev, dt)
    draft_model = load_model(draft, dev, dt) if draft is not None else None
    names = {"target": str(target), "draft": str(draft) if draft is not None else "", "dtype": str(dt).split(".")[-1],
             "model_sources": {"target": source_info(target), **({"draft": source_info(draft)} if draft else {})}}
    for role, model in (("target", target_model), ("draft", draft_model)):
        if getattr(model, "specviz_text_of", None):  # a multimodal checkpoint: decoded through its text decoder
            names["model_sources"][role]["text_decoder_of"] = model.specviz_text_of
    loaded, errors, dirs = load_heads(target_model, heads, bundled=bundled_target)
    names.update({f"{name}_head": str(dirs[name]) for name in loaded})
    factory = runner_factory(target_model, dev, runner, max_cache_len, factory_compile)
    return dict(target_model=target_model, tokenizer=load_tokenizer(target), draft_model=draft_model,
                draft_tokenizer=load_tokenizer(draft) if draft is not None else None, runner_factory=factory,
                names=names, heads=loaded, head_errors=errors,
                compile_status=initial_status(compile, dev, runner_options(factory)["static"]))


def runner_factory(target_model: torch.nn.Module, device: torch.device, runner: str, max_cache_len: int,
                   compile: bool | None) -> Callable[[torch.nn.Module], Any]:
    """The runner of every model of the decoder: "eager" (DynamicCache), "static" (a pre-allocated cache of
    ``max_cache_len`` tokens, at most the target's context; CUDA graphs on CUDA) or "auto" (static on CUDA)."""
    if runner == "static" or (runner == "auto" and device.type == "cuda"):
        limit = int(getattr(target_model.config, "max_position_embeddings", max_cache_len) or max_cache_len)
        return functools.partial(StaticRunner, max_cache_len=min(limit, max_cache_len), compile=compile)
    return EagerRunner


def runner_options(factory: Callable[[torch.nn.Module], Any]) -> dict[str, Any]:
    """What a runner factory makes: {"static": bool, "max_cache_len": slots or None, "compile", "compile_backend"
    (the static runner's, when given)}, for the methods that build runners of their own beside it."""
    fn, keywords = getattr(factory, "func", factory), dict(getattr(factory, "keywords", {}) or {})
    static = fn is StaticRunner
    out = {"static": static, "max_cache_len": keywords.get("max_cache_len", 4096) if static else None,
           "runner": fn.__name__}
    out.update({k: keywords[k] for k in ("compile", "compile_backend") if k in keywords})
    return out


def bundled_heads() -> dict[str, Path]:
    """{method: its bundled head directory under assets/models} for every registered method with one (the directory
    may not exist yet: the heads are trained by ``specviz train heads``)."""
    return {m.name: ASSETS_MODELS / m.head.bundled for m in methods.all_methods() if m.head is not None and m.head.bundled}


def load_heads(target_model: torch.nn.Module, heads: dict[str, str] | None,
               bundled: bool) -> tuple[dict[str, Any], dict[str, str], dict[str, Path]]:
    """Load each method's head onto the target: the ``heads`` given ({method: directory}), and with ``bundled`` every
    bundled head that exists. A head given explicitly that fails raises :class:`ModelLoadError`; a bundled one that
    fails is left out, its reason kept. Returns (loaded heads, {method: why it has none}, {method: its directory})."""
    with_heads = {m.name: m.head for m in methods.all_methods() if m.head is not None}
    if heads is not None and not isinstance(heads, dict):
        example = f"{{{next(iter(with_heads))!r}: 'path/to/head'}}"
        raise ValueError(f"heads= takes {{method: directory}} (e.g. {example}); got {type(heads).__name__} "
                         f"{str(heads)[:80]!r}")
    for name, directory in (heads or {}).items():
        if not isinstance(directory, (str, os.PathLike)):
            raise ValueError(f"heads[{name!r}] must be a directory path, got {type(directory).__name__}")
    for name in heads or {}:
        if name not in with_heads:
            raise ValueError(f"unknown head method {name!r} in heads=; use one of {', '.join(with_heads)}")
    dirs: dict[str, Path] = {name: d for name, d in bundled_heads().items() if d.exists()} if bundled else {}
    dirs.update({name: Path(d) for name, d in (heads or {}).items()})
    loaded, errors = {}, {}
    for name, directory in dirs.items():
        try:
            load = with_heads[name].load or functools.partial(load_head_dir, kind=name)
            loaded[name] = load(directory, target_model)
            given = name in (heads or {})  # recorded in the trace: the tables say when a head is not the bundled one
            loaded[name].source = {**(getattr(loaded[name], "source", None) or {}), "bundled": not given}
        except ValueError as exc:
            if name in (heads or {}):
                raise ModelLoadError(f"could not load the {name} head {str(directory)!r}: {exc}") from exc
            errors[name] = f"the bundled head {directory} does not load: {exc}"
    for name, spec in with_heads.items():
        if name not in loaded and name not in errors:
            there = ASSETS_MODELS / spec.bundled if spec.bundled else None
            errors[name] = (f"{there} is not there yet" if bundled and there is not None else "none was given in heads=")
    return loaded, errors, dirs
