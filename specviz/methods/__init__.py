"""The method registry: every speculative method the engine, CLI, app, Compare, lesson and trainer know.

A method is a folder ``specviz/methods/<name>/`` whose ``__init__`` defines ``METHOD`` (a
:class:`~specviz.methods.base.Method`); the built-in ones are listed in :data:`BUILTIN`, one line each, and are
registered in that order after method "none" (plain decoding, the baseline). A method from anywhere else is added
with :func:`register`, or found at import: an installed package's entry point in the group ``specviz.methods``
(naming its Method), or a module named in ``$SPECVIZ_METHODS`` (comma-separated; the module defines METHOD).
See docs/adding-a-method.md.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os

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
    _check_schema(method.details_schema, f"method {method.name!r}: details_schema")
    _REGISTRY[method.name] = method
    return method


def _check_schema(schema, where: str, seen: frozenset = frozenset()) -> None:
    """Raise TypeError unless ``schema`` is in :mod:`specviz.trace.validate`'s notation (types, None, tuples of
    choices, [item], {key: schema}, or an object with ``test`` and ``text``); a schema may contain itself (a trie)."""
    if id(schema) in seen:
        return
    if isinstance(schema, dict):
        for key, sub in schema.items():
            _check_schema(sub, f"{where}.{key}", seen | {id(schema)})
    elif isinstance(schema, (list, tuple)) and (len(schema) == 1 or isinstance(schema, tuple)):
        for sub in schema:
            _check_schema(sub, where, seen | {id(schema)})
    elif not (schema is None or schema in (int, float, str, bool) or hasattr(schema, "test")):
        raise TypeError(f"{where}: {schema!r} is not a trace schema (int, float, str, bool, None, a tuple of choices, "
                        "[item schema] or {key: schema})")


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


ENTRY_POINTS = "specviz.methods"
ENV = "SPECVIZ_METHODS"


def load_plugins() -> tuple[str, ...]:
    """Register the methods of installed packages (entry point group :data:`ENTRY_POINTS`) and of the modules named
    in ``$SPECVIZ_METHODS``; returns their names. Raises ImportError naming a plugin that does not load."""
    found = []
    sources = [(ep.name, ep.load) for ep in importlib.metadata.entry_points(group=ENTRY_POINTS)]
    sources += [(mod, lambda mod=mod: importlib.import_module(mod).METHOD)
                for mod in filter(None, (m.strip() for m in os.environ.get(ENV, "").split(",")))]
    for name, load in sources:
        try:
            found.append(register(load()).name)
        except Exception as exc:  # an import error, a missing METHOD, not a Method: all the same to the user
            raise ImportError(f"specviz method plugin {name!r} did not load: {type(exc).__name__}: {exc}") from exc
    return tuple(found)


register(NONE)
for _name in BUILTIN:
    register(importlib.import_module(f"{__name__}.{_name}").METHOD)
load_plugins()

__all__ = ["BUILTIN", "ENTRY_POINTS", "ENV", "Build", "HeadSpec", "Method", "NONE", "Texts", "all_methods", "get",
           "load_plugins", "names", "option", "option_fields", "option_names", "register", "taking", "unregister"]
