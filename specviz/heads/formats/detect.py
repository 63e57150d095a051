"""Which layout a head directory holds, read from its files: config.json fields and the safetensors
headers (tensor names and shapes), never ``architectures`` (the official EAGLE-3 files call
themselves a plain ``LlamaForCausalLM``) and never by unpickling.

Layouts (the published sources are cited in each loader module):

=====================  ==============================================================================
specviz-head-v1        specviz's own EAGLE / EAGLE-3 / Medusa / MTP heads (``"format"`` in config.json)
specviz-dflash-v1      specviz's own DFlash drafter
eagle-safeailab        EAGLE-1/2 (SafeAILab/EAGLE ``cnets1.py``): ``fc`` [H, 2H], ``layers.N.*``
eagle3-safeailab       EAGLE-3 (SafeAILab ``cnets.py``): ``midlayer.*``, ``fc`` [H, 3H], ``d2t`` / ``t2d``
eagle3-specforge       EAGLE-3 as SpecForge writes it: SafeAILab's keys plus ``fc_norm`` / ``norm_output``
                       / a nested ``eagle_config`` in config.json
eagle3-speculators     vllm-project/speculators: ``speculators_model_type: eagle3``, ``layers.0.*``
medusa1-fasterdecoding FasterDecoding/Medusa-1: ``{h}.{l}.linear.*`` and a per-head LM head ``{h}.{L}.weight``
medusa2-fasterdecoding FasterDecoding/Medusa after "Creating medusa2": ``{h}.{l}.linear.*`` only
medusa-vllm            vLLM's Medusa: ``blocks.{h}.layers.{l}.*``, ``lm_heads.{h}.*`` / ``lm_head``, ``token_map``
dflash-zlab            z-lab/dflash ``DFlashDraftModel``: Qwen3 layers with q/k norms, ``fc``, ``hidden_norm``
=====================  ==============================================================================
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from safetensors import safe_open

LAYOUTS = ("specviz-head-v1", "specviz-dflash-v1", "eagle-safeailab", "eagle3-safeailab", "eagle3-specforge",
           "eagle3-speculators", "medusa1-fasterdecoding", "medusa2-fasterdecoding", "medusa-vllm", "dflash-zlab")
KIND_OF = {"specviz-dflash-v1": "dflash", "eagle-safeailab": "eagle", "eagle3-safeailab": "eagle3",
           "eagle3-specforge": "eagle3", "eagle3-speculators": "eagle3", "medusa1-fasterdecoding": "medusa",
           "medusa2-fasterdecoding": "medusa", "medusa-vllm": "medusa", "dflash-zlab": "dflash"}
PICKLE_SUFFIXES = (".bin", ".pt", ".pth")
MEDUSA1_BLOCK = re.compile(r"^(\d+)\.(\d+)\.linear\.(weight|bias)$")
MEDUSA1_HEAD = re.compile(r"^(\d+)\.(\d+)\.weight$")
VLLM_MEDUSA = re.compile(r"^(?:medusa_heads\.)?blocks\.(\d+)\.layers\.(\d+)\.(weight|bias)$")


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
            raise ValueError(f"{self.directory}: tensor {name!r} is missing (have {_some(self.shapes)})")
        return self.shapes[name]


def read_checkpoint(directory: str | os.PathLike) -> Checkpoint:
    """Read config.json and the safetensors headers of ``directory``.
    Raises ValueError: not a directory, config.json not JSON, or only pickled weights (with the
    command that converts them: ``specviz convert DIR``)."""
    path = Path(directory)
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
    pickles = sorted(p for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES and p.is_file())
    ckpt = Checkpoint(path, config, files=files, pickles=pickles)
    for f in files:
        with safe_open(str(f), framework="pt") as handle:
            for name in handle.keys():
                ckpt.shapes[name] = tuple(handle.get_slice(name).get_shape())
    if not files and pickles:
        names = ", ".join(p.name for p in pickles)
        raise ValueError(f"{path} holds only pickled weights ({names}); specviz loads safetensors only and never "
                         f"unpickles. Convert them once with: specviz convert {path}")
    return ckpt


def detect(ckpt: Checkpoint) -> str:
    """The layout of ``ckpt`` (one of :data:`LAYOUTS`). Raises ValueError naming what was found and
    the known layouts when nothing matches."""
    cfg, keys = ckpt.config, set(ckpt.shapes)
    fmt = cfg.get("format")
    if fmt in ("specviz-head-v1", "specviz-dflash-v1"):
        return fmt
    if "speculators_model_type" in cfg:
        if cfg["speculators_model_type"] == "eagle3":
            return "eagle3-speculators"
        raise ValueError(f"{ckpt.directory}: a speculators checkpoint of type {cfg['speculators_model_type']!r}; "
                         "specviz loads the speculators layout for eagle3 only. " + _known())
    if any(k.startswith("midlayer.") for k in keys):
        specforge = ("eagle_config" in cfg or "fc_norm" in cfg or "norm_output" in cfg
                     or any(k.startswith("fc_norm.") for k in keys))
        return "eagle3-specforge" if specforge else "eagle3-safeailab"
    if "pre_projection.weight" in keys or cfg.get("model_type") == "gemma4_assistant":
        raise ValueError(f"{ckpt.directory}: Gemma 4's MTP assistant (gemma4_assistant) is recognised but not "
                         "loadable yet. " + _known())
    if "fc.weight" in keys and "hidden_norm.weight" in keys and any(".self_attn.k_norm." in k for k in keys):
        return "dflash-zlab"
    if "fc.weight" in keys and any(k.startswith("layers.0.") for k in keys) and not any(
            "hidden_norm" in k for k in keys):
        return "eagle-safeailab"
    if any(VLLM_MEDUSA.match(k) for k in keys):
        return "medusa-vllm"
    if any(MEDUSA1_BLOCK.match(k) for k in keys):
        heads_own = any(MEDUSA1_HEAD.match(k) for k in keys)
        return "medusa1-fasterdecoding" if heads_own else "medusa2-fasterdecoding"
    found = f"tensors {_some(ckpt.shapes)}" if keys else "no safetensors weights"
    fields = sorted(cfg)[:12]
    raise ValueError(f"{ckpt.directory}: unknown head layout ({found}; config.json fields {fields}). " + _known())


def _known() -> str:
    return "Known layouts: " + ", ".join(LAYOUTS) + "."


def _some(shapes: dict, n: int = 8) -> str:
    names = sorted(shapes)
    return ", ".join(names[:n]) + (f", ... ({len(names)} in all)" if len(names) > n else "")
