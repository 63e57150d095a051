"""Which layout a head directory holds, read from its files: config.json fields and the safetensors headers (tensor
names and shapes), never ``architectures`` (the official EAGLE-3 files call themselves a plain ``LlamaForCausalLM``)
and never by unpickling.

specviz's own formats carry a ``format`` tag in config.json ("specviz-head-v1", "specviz-dflash-v1"); every other
layout is recognised by the ``detect`` of a registered method's formats module (``HeadSpec.formats``: its
``LAYOUTS``, ``KIND_OF`` {layout: method}, ``detect(ckpt) -> layout | None``, ``load``, ``write``).
"""

from __future__ import annotations

import importlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from safetensors import safe_open

from specviz import methods

OWN_LAYOUTS = ("specviz-head-v1", "specviz-dflash-v1")  # config.json's format tag
PICKLE_SUFFIXES = (".bin", ".pt", ".pth")


@dataclass
class Checkpoint:
    """What a head directory holds, without loading a tensor.

    directory: the directory. config: config.json as a dict ({} if absent).
    shapes:    {tensor name: shape} from the safetensors headers (every ``*.safetensors`` file).
    files:     the safetensors files, sorted. pickles: ``*.bin`` / ``*.pt`` / ``*.pth`` files (never read here).
    """

    directory: Path
    config: dict
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    files: list[Path] = field(default_factory=list)
    pickles: list[Path] = field(default_factory=list)

    def has(self, name: str) -> bool:
        return name in self.shapes

    def shape(self, name: str) -> tuple[int, ...]:
        """The shape of tensor ``name``. Raises ValueError naming the directory when it is missing."""
        if name not in self.shapes:
            raise ValueError(f"{self.directory}: tensor {name!r} is missing (have {some(self.shapes)})")
        return self.shapes[name]


def read_checkpoint(directory: str | os.PathLike) -> Checkpoint:
    """Read config.json and the safetensors headers of ``directory``.
    Raises ValueError: a file or a missing directory, config.json not JSON, no weights, a safetensors file that
    cannot be read, or only pickled weights (with the command that converts them: ``specviz convert DIR``)."""
    path = Path(directory)
    if path.is_file():  # a user pointing at the weights file: the head is its directory (with config.json)
        raise ValueError(f"{path} is a file; give the head's directory (the one holding config.json and the "
                         f"weights): {path.parent}")
    if not path.is_dir():
        raise ValueError(f"head directory {path} does not exist")
    config = {}
    if (path / "config.json").is_file():
        try:
            config = json.loads((path / "config.json").read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path / 'config.json'} is not valid JSON: {exc}") from None
        if not isinstance(config, dict):
            raise ValueError(f"{path / 'config.json'} is not a JSON object")
    files = sorted(path.glob("*.safetensors"))
    _check_index(path, files)
    pickles = sorted(p for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES and p.is_file())
    ckpt = Checkpoint(path, config, files=files, pickles=pickles)
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as handle:
                for name in handle.keys():
                    ckpt.shapes[name] = tuple(handle.get_slice(name).get_shape())
        except Exception as exc:  # noqa: BLE001 - safetensors' own error type is no ValueError
            raise ValueError(f"{f} is not a readable safetensors file (truncated or corrupt?): "
                             f"{type(exc).__name__}: {exc}") from None
    if not files and not pickles:
        raise ValueError(f"{path} holds no weights (no *.safetensors file"
                         + (", only config.json" if config else "") + ")")
    if not files and pickles:
        names = ", ".join(p.name for p in pickles)
        raise ValueError(f"{path} holds only pickled weights ({names}); specviz loads safetensors only and never "
                         f"unpickles. Convert them once with: specviz convert {path}")
    return ckpt


def _check_index(path: Path, files: list[Path]) -> None:
    """A sharded checkpoint (``*.safetensors.index.json``) must hold every shard its index names: a download cut
    short is reported as such, not as a layout missing tensors. Raises ValueError naming the absent files."""
    for index in sorted(path.glob("*.safetensors.index.json")):
        try:
            weight_map = json.loads(index.read_text()).get("weight_map") or {}
        except (json.JSONDecodeError, AttributeError):
            weight_map = None
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index} is not a safetensors index (JSON with a weight_map object)")
        absent = sorted(set(map(str, weight_map.values())) - {f.name for f in files})
        if absent:
            raise ValueError(f"{path}: the shard files {absent} that {index.name} names are missing (an incomplete "
                             "download or copy?); copy every shard into the directory")


def formats_modules() -> list[ModuleType]:
    """The formats modules of the registered methods, each once, in registration order."""
    names = dict.fromkeys(m.head.formats for m in methods.all_methods() if m.head is not None and m.head.formats)
    return [importlib.import_module(name) for name in names]


def layouts() -> tuple[str, ...]:
    """Every layout that loads: specviz's own, then the registered methods' published ones."""
    return (*OWN_LAYOUTS, *(layout for module in formats_modules() for layout in module.LAYOUTS))


def kind_of(layout: str) -> str | None:
    """The method a published layout's head is for (None for specviz's own formats: their config says)."""
    return next((module.KIND_OF[layout] for module in formats_modules() if layout in module.KIND_OF), None)


def detect(ckpt: Checkpoint) -> str:
    """The layout of ``ckpt`` (one of :func:`layouts`). Raises ValueError naming what was found and the known
    layouts when nothing matches (or a layout is recognised but cannot be loaded: its detector says why)."""
    cfg, keys = ckpt.config, set(ckpt.shapes)
    fmt = cfg.get("format")
    if fmt in OWN_LAYOUTS:
        return fmt
    for module in formats_modules():
        layout = module.detect(ckpt)
        if layout is not None:
            return layout
    found = f"tensors {some(ckpt.shapes)}" if keys else "no safetensors weights"
    fields = sorted(cfg)[:12]
    raise ValueError(f"{ckpt.directory}: unknown head layout ({found}; config.json fields {fields}). " + _known())


def _known() -> str:
    return "Known layouts: " + ", ".join(layouts()) + "."


def some(shapes: dict, n: int = 8) -> str:
    names = sorted(shapes)
    return ", ".join(names[:n]) + (f", ... ({len(names)} in all)" if len(names) > n else "")
