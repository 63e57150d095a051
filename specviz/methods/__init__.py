"""The method registry: every speculative method the engine, CLI, app, Compare, lesson and trainer know.

A method is a folder ``specviz/methods/<name>/`` whose ``__init__`` defines ``METHOD`` (a
:class:`~specviz.methods.base.Method`); the built-in ones are listed in :data:`BUILTIN`, one line each, and are
registered in that order after method "none" (plain decoding, the baseline). A method from anywhere else is added
with :func:`register`. See docs/adding-a-method.md.
"""

from __future__ import annotations

import importlib

from .base import Build, HeadSpec, Method, Texts, option, option_fields

BUILTIN = (
    "ngram",
    "ngram_gpu",
    "suffix",
    "draft_model",
    "eagle",
    "eagle3",
    "medusa",
    "dflash",
    "mtp",
)

NONE = Method(
    "none", "plain decoding (the baseline)", make=lambda build: None, style=("#7f7f7f", "circle-open"),
    texts=Texts("nothing (method none)", "Method none drafts nothing: every step is one plain decoding step of the "
                "target, the baseline the other methods are compared with.",
                "method none (plain decoding: no proposer, one token per target forward)"))

_REGISTRY: dict[str, Method] = {}


def register(method: Method) -> Method:
    """Add ``method`` (a later registration of the same name replaces it) and return it."""
    if not isinstance(method, Method):
        raise TypeError(f"register() takes a specviz.methods.Method, got {type(method).__name__}")
    _REGISTRY[method.name] = method
    return method


def unregister(name: str) -> None:
    """Remove a registered method (a test's or a plugin's own; method none stays)."""
    if name != "none":
        _REGISTRY.pop(name, None)


def get(name: str) -> Method:
    """The registered method ``name``. Raises ValueError naming the registered ones."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown method {name!r}; choose one of {', '.join(_REGISTRY)}")
    return _REGISTRY[name]


def names() -> tuple[str, ...]:
    """Registered method names, in registration order ("none" first)."""
    return tuple(_REGISTRY)


def all_methods() -> tuple[Method, ...]:
    return tuple(_REGISTRY.values())


def taking(form: str) -> tuple[str, ...]:
    """The methods that draft the tree ``form`` (:data:`specviz.tree.TREE_FORMS`)."""
    return tuple(m.name for m in _REGISTRY.values() if form in m.tree_forms)


def option_names() -> set[str]:
    """Every registered method's own generate() keywords (a request may carry another method's: they are ignored)."""
    return {f.name for m in _REGISTRY.values() for f in option_fields(m.options)}


register(NONE)
for _name in BUILTIN:
    register(importlib.import_module(f"{__name__}.{_name}").METHOD)

__all__ = ["BUILTIN", "Build", "HeadSpec", "Method", "NONE", "Texts", "all_methods", "get", "names", "option",
           "option_fields", "option_names", "register", "taking", "unregister"]
