"""Training a method's head on a frozen target: the loop every head shares, and ``specviz train heads``.

Each method with a trainer (``HeadSpec.trainer``: EAGLE-1/3, Medusa and MTP here through :func:`train_kind` with their
:class:`HeadKind`, DFlash with a loop of its own) trains from the LM's own token windows, int64 [W, T+1] on the
device. :func:`train_kind` freezes nothing itself (:func:`train_heads` freezes the target), computes the target's
features online per batch under ``no_grad`` (bf16 autocast on CUDA, fp32 on CPU), trains the head (AdamW (0.9, 0.95),
wd 0, linear warmup + cosine to 10%, grad clip, bf16 autocast on CUDA), evaluates held-out agreement with the target's
argmax per unrolled step, and saves ``out_dir/<the method's bundled directory>/`` (config.json + model.safetensors in
bf16 + train_log.json) and the head in its field's layout (``out_dir/published/``). ``time_budget_s`` stops a run that
would overrun (the log then says ``stopped_early``).

CLI: ``specviz train heads`` (:mod:`specviz.train.heads_cli`).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from specviz import methods
from specviz.heads import save_head
from specviz.heads.formats.export import save_published_beside
from specviz.train.data import BatchOrder, epoch_permutation
from specviz.train.configs import OptimizerConfig
from specviz.train.loop import autocast, lr_scale

IGNORE_INDEX = -100


# ---- configuration ----------------------------------------------------------------------------
@dataclass(frozen=True)
class HeadTrainConfig(OptimizerConfig):
    """Hyper-parameters of one head's training run.

    batch_size: windows per step; steps: optimizer steps (the run is defined by its step count;
    time_budget_s only stops an overrun). lr: peak AdamW LR (warmup_steps linear warmup, then cosine
    to min_lr_ratio * lr). ttt_steps: EAGLE-3 unrolled steps in training, and the number of steps
    evaluated for both heads. decay: EAGLE-3 step weight decay^s. reg_weight / cls_weight / noise:
    EAGLE-1 SmoothL1 and soft-CE weights, uniform feature noise (fraction of the feature RMS).
    eval_every / eval_windows / eval_batch_size: held-out evaluation. aux_layer_ids: EAGLE-3 taps
    (None = (2, L//2, L-3)). compile: torch.compile the EAGLE-1 head (EAGLE-3 runs eagerly: its
    DynamicCache is Python state). min_seconds_left: stop when fewer seconds of the budget remain
    (reserved for the final evaluation and saving). head_layers: Medusa's ResBlocks per head (None = 1).
    init_from: a head directory in specviz's format (``specviz.heads.io``) of this method and shape to continue
    from (a warm start: its weights, a fresh optimizer and schedule) instead of a random initialisation.
    """

    ttt_steps: int = 5
    decay: float = 0.8
    reg_weight: float = 1.0
    cls_weight: float = 0.1
    noise: float = 0.1
    eval_every: int = 1000
    eval_windows: int = 64
    eval_batch_size: int = 8
    log_every: int = 50
    aux_layer_ids: tuple[int, ...] | None = None
    compile: bool = False
    seed: int = 0
    min_seconds_left: float = 10.0
    head_layers: int | None = None
    fit_to_budget: bool = False  # cosine over max(step / steps, elapsed / budget): the budget ends it at its floor
    init_from: str | None = None


@dataclass
class TargetOutputs:
    """One frozen-target forward over a window: final [B, T, d] f_t, logits float32 [B, T, V] z_t (predicting
    x_{t+1}), and, for a head that reads the target's cache, one layer's keys / values [B, kv, T, hd]."""

    final: torch.Tensor
    logits: torch.Tensor
    keys: torch.Tensor | None = None
    values: torch.Tensor | None = None


def smoke_config(cfg):
    """A tiny CPU run of ``cfg`` (the ``--smoke`` preset: a few steps, small batches, < 60 s on a tiny target)."""
    return dataclasses.replace(cfg, batch_size=8, steps=40, warmup_steps=4, ttt_steps=3, eval_every=20, eval_windows=8,
                               eval_batch_size=8, log_every=10, lr=3e-3, min_seconds_left=0.0)


@dataclass(frozen=True)
class HeadKind:
    """How :func:`fit_head` trains one method's head.

    name:      the method. default: its :class:`HeadTrainConfig`. compile: torch.compile the head (a head whose
               forward holds no Python state).
    new_head:  (target, cfg) -> (its config, a freshly initialised head, not yet on the device).
    features:  (target, inputs int64 [B, T], head config) -> the frozen target's features (called under no_grad).
    loss:      (head, features, batch int64 [B, T+1], cfg, generator, train) -> (loss, {stat: tensor}).
    agreement: (head, features, batch, cfg) -> {"top1", "chain", "ce"} per head / unrolled step (held out).
    steps:     (head, cfg) -> the weighted CE terms of the held-out objective (decay^s * ce[s]), or None: the held-out
               loss is ``loss(train=False)``.
    flops:     (target config, cfg, seq_len) -> the head's forward + backward FLOPs per token (rough).
    """

    name: str
    default: HeadTrainConfig
    new_head: Callable[[Any, HeadTrainConfig], tuple[Any, Any]]
    features: Callable[[Any, torch.Tensor, Any], Any]
    loss: Callable[..., tuple[torch.Tensor, dict]]
    agreement: Callable[..., dict[str, torch.Tensor]]
    flops: Callable[[Any, HeadTrainConfig, int], float]
    steps: Callable[[Any, HeadTrainConfig], int] | None = None
    compile: bool = False


def target_flops_per_token(target_config, seq_len: int) -> float:
    """The frozen target's forward FLOPs per token (weights incl. the LM head, causal attention over ~T/2 keys)."""
    c = target_config
    d, V, L = c.hidden_size, c.vocab_size, c.num_hidden_layers
    return float(L * (layer_flops(c) + 2 * seq_len * d) + 2 * d * V)


def layer_flops(c) -> float:
    """One Llama-style decoder layer's forward FLOPs per token: q, o, k, v, SwiGLU."""
    d, ff = c.hidden_size, c.intermediate_size
    kv = c.num_key_value_heads * (getattr(c, "head_dim", None) or d // c.num_attention_heads)
    return float(2 * (2 * d * d + 2 * d * kv + 3 * d * ff))


# ---- the loop -----------------------------------------------------------------------------------
def _features(kind: HeadKind, target, batch: torch.Tensor, head_cfg, device):
    with torch.no_grad(), autocast(device):
        return kind.features(target, batch[:, :-1], head_cfg)


@torch.no_grad()
def evaluate_head(kind: HeadKind, head, target, heldout: torch.Tensor, cfg: HeadTrainConfig, device) -> dict:
    """Held-out loss (the training objective without noise) and per-step agreement with the
    target's argmax over the first ``cfg.eval_windows`` windows. Returns plain floats / lists."""
    head.eval()
    windows = heldout[: cfg.eval_windows]
    sums: dict[str, torch.Tensor] = {}
    for i in range(0, windows.shape[0], cfg.eval_batch_size):
        batch = windows[i : i + cfg.eval_batch_size]
        tf = _features(kind, target, batch, head.config, device)
        with autocast(device):
            agr = kind.agreement(head, tf, batch, cfg)
            if kind.steps is None:
                loss, _ = kind.loss(head, tf, batch, cfg, None, False)
            else:  # the weighted objective from the same pass (TTT steps, Medusa heads, MTP steps)
                loss = sum(cfg.decay**s * agr["ce"][s] for s in range(kind.steps(head, cfg)))
        w = batch.shape[0]
        for k, v in {"loss": loss.detach().float(), **agr}.items():
            sums[k] = sums.get(k, 0) + v.float() * w
    head.train()
    n = windows.shape[0]
    out = {k: (v / n).tolist() for k, v in sums.items()}
    return {"loss": round(out["loss"], 5), "top1": _r(out["top1"]), "chain": _r(out["chain"]), "ce": _r(out["ce"])}


def _r(xs):
    return [round(x, 4) for x in xs]


def _batch_indices(n_windows: int, cfg: HeadTrainConfig) -> torch.Tensor:
    """All steps' window indices at once, int64 [steps, batch_size]: the same order as
    :class:`~specviz.train.data.BatchOrder` (concatenated seeded epoch permutations). Moving them to
    the device once avoids a host-to-device copy (a sync) per step."""
    total = cfg.steps * cfg.batch_size
    perms = [epoch_permutation(n_windows, cfg.seed, e) for e in range(-(-total // n_windows))]
    return torch.cat(perms)[:total].view(cfg.steps, cfg.batch_size)


def head_kind(name: str) -> HeadKind:
    """The :class:`HeadKind` of method ``name`` (its trainer module's ``KIND``, or ``KINDS[name]``). Raises ValueError
    for a method whose head is not trained by :func:`train_kind`."""
    spec = methods.get(name).head if name in methods.names() else None
    module = importlib.import_module(spec.trainer.partition(":")[0]) if spec is not None and spec.trainer else None
    kind = (getattr(module, "KINDS", {}).get(name) or getattr(module, "KIND", None)) if module is not None else None
    if not isinstance(kind, HeadKind):
        raise ValueError(f"method {name!r} has no head trained by the shared loop")
    return kind


def new_head(name: str, target) -> Any:
    """A freshly initialised head of method ``name`` for ``target`` (its trainer's default shape), not yet attached:
    its :class:`HeadKind`'s, or the trainer module's own ``new_head(target, DEFAULT)`` (DFlash)."""
    try:
        kind = head_kind(name)
    except ValueError:
        module = importlib.import_module(methods.get(name).head.trainer.partition(":")[0])
        return module.new_head(target, module.DEFAULT)[1]
    return kind.new_head(target, kind.default)[1]


def warm_start(head, head_cfg, directory: str, target):
    """``head`` (fresh, of config ``head_cfg``) with the weights of the head saved in ``directory`` (specviz's format),
    in the fresh head's dtype, attached to ``target``. Raises ValueError when that head is of another method or shape
    than ``head_cfg`` (every config field is compared), or its tensors do not match
    (:func:`specviz.heads.common.load_weights`)."""
    from specviz.heads.common import load_weights
    from specviz.heads.io import WEIGHTS_NAME, load_config

    saved = load_config(directory)
    if saved != head_cfg:
        ours, theirs = dataclasses.asdict(head_cfg), dataclasses.asdict(saved)
        diff = {k: (theirs.get(k), v) for k, v in ours.items() if theirs.get(k) != v}
        raise ValueError(f"init_from={directory}: its head config differs from the one being trained "
                         f"(field: (saved, training)): {diff}")
    return load_weights(head, Path(directory) / WEIGHTS_NAME, target, next(head.parameters()).dtype)


def fit_head(kind: HeadKind | str, target, train_windows, heldout_windows, device, cfg: HeadTrainConfig,
             time_budget_s: float | None = None):
    """Train one head of ``kind`` (a :class:`HeadKind` or a method's name) from scratch, or from ``cfg.init_from``'s
    weights (:func:`warm_start`). Returns (head fp32 on device, log dict)."""
    kind = head_kind(kind) if isinstance(kind, str) else kind
    device = torch.device(device)
    torch.manual_seed(cfg.seed)
    head_cfg, head = kind.new_head(target, cfg)
    if cfg.init_from:
        head = warm_start(head, head_cfg, cfg.init_from, target)
    head = head.to(device).attach(target).train()
    runner = torch.compile(head) if (cfg.compile and kind.compile) else head
    opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay,
                            fused=device.type == "cuda")
    budget = max(1.0, time_budget_s - cfg.min_seconds_left) if cfg.fit_to_budget and time_budget_s else None
    order = BatchOrder(train_windows.shape[0], cfg.batch_size, cfg.seed)
    batch_idx = _batch_indices(train_windows.shape[0], cfg).to(device)  # [steps, B], moved once
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    seq_len = train_windows.shape[1] - 1
    target_flops, head_flops = target_flops_per_token(target.config, seq_len), kind.flops(target.config, cfg, seq_len)
    log = {"head": kind.name, "config": dataclasses.asdict(cfg), "head_config": dataclasses.asdict(head_cfg),
           "params": sum(p.numel() for p in head.parameters()), "seq_len": seq_len,
           "flops_per_token": {"target_fwd": target_flops, "head_fwd_bwd": head_flops,
                               "total": target_flops + head_flops},
           "train": [], "heldout": [], "stopped_early": False}
    acc: dict[str, torch.Tensor] = {}
    t0, n_acc, step = time.time(), 0, 0
    for step in range(1, cfg.steps + 1):
        for g in opt.param_groups:
            g["lr"] = cfg.lr * lr_scale(cfg, step - 1, time.time() - t0, budget)
        batch = train_windows[batch_idx[step - 1]]  # [B, T+1]
        tf = _features(kind, target, batch, head_cfg, device)
        with autocast(device):
            loss, stats = kind.loss(runner, tf, batch, cfg, gen, True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        for k, v in {"loss": loss.detach(), **stats}.items():
            acc[k] = acc.get(k, 0) + v.float()
        n_acc += 1
        over = time_budget_s is not None and time.time() - t0 > time_budget_s - cfg.min_seconds_left
        last = step == cfg.steps or over
        if step % cfg.log_every == 0 or last:
            row = {k: (v / n_acc).tolist() for k, v in acc.items()}  # one host sync per log row
            row = {k: round(v, 5) if isinstance(v, float) else _r(v) for k, v in row.items()}
            row.update(step=step, tokens=step * cfg.batch_size * seq_len, lr=opt.param_groups[0]["lr"],
                       elapsed_s=round(time.time() - t0, 2))
            log["train"].append(row)
            acc, n_acc = {}, 0
        if step % cfg.eval_every == 0 or last:
            row = evaluate_head(kind, head, target, heldout_windows, cfg, device)
            row.update(step=step, tokens=step * cfg.batch_size * seq_len, elapsed_s=round(time.time() - t0, 2))
            log["heldout"].append(row)
        if over:
            log["stopped_early"] = True
            break
        if last:
            break
    log.update(steps=step, tokens_seen=step * cfg.batch_size * seq_len, train_s=round(time.time() - t0, 2),
               epochs=order.epochs_seen(step))
    return head, log


def train_kind(kind: HeadKind, target, train_windows, heldout_windows, device, out_dir, time_budget_s=None,
               config: HeadTrainConfig | None = None) -> dict:
    """Train a head of ``kind`` (:func:`fit_head`) and save it to ``out_dir/<its method's bundled directory>/`` with its
    train_log.json, and in its field's layout beside (``out_dir/published/``). Returns the log."""
    head, log = fit_head(kind, target, train_windows, heldout_windows, device, config or kind.default, time_budget_s)
    name = methods.get(kind.name).head.bundled
    path = Path(out_dir) / name
    log["saved"] = {"dir": str(path), "files": save_head(head, path)}
    log["saved"]["bytes"] = (path / "model.safetensors").stat().st_size
    log["saved"]["published"] = save_published_beside(head, out_dir, name)  # the field's layout too
    (path / "train_log.json").write_text(json.dumps(log, indent=1))
    log["saved"]["files"].append("train_log.json")
    return log


def trainers() -> dict[str, Any]:
    """{method: its trainer module's function} for every registered method whose head has a trainer."""
    out = {}
    for m in methods.all_methods():
        if m.head is not None and m.head.trainer:
            module, _, fn = m.head.trainer.partition(":")
            out[m.name] = getattr(importlib.import_module(module), fn)
    return out


def default_config(name: str, smoke: bool = False):
    """The training config of method ``name``'s head: its trainer's ``DEFAULT`` (the trainer module's
    ``CONFIGS[name]`` where one module trains several methods), or its smoke version."""
    module = importlib.import_module(methods.get(name).head.trainer.partition(":")[0])
    cfg = getattr(module, "CONFIGS", {}).get(name) or module.DEFAULT
    return (getattr(module, "smoke_config", None) or smoke_config)(cfg) if smoke else cfg


def train_heads(target, train_windows: torch.Tensor, heldout_windows: torch.Tensor, device, out_dir,
                time_budget_s: float | None = None, heads: Sequence[str] | None = None,
                smoke: bool = False, overrides: dict[str, dict[str, Any]] | None = None) -> dict[str, dict]:
    """Train the registered heads (``heads``: names, default all) on the frozen target, one after
    the other, each with ``time_budget_s``. windows: int64 [W, T+1] on device. smoke: the tiny
    CPU configs (:data:`SMOKE`). overrides: {name: {config field: value}} replacing fields of that head's
    config (the CLI's ``--set``). Returns {name: log}. Raises ValueError for an unknown name or field."""
    registered = trainers()
    names = list(registered) if heads is None else list(heads)
    unknown = [n for n in names if n not in registered]
    if unknown:
        raise ValueError(f"unknown heads {unknown}; registered: {sorted(registered)}")
    stray = sorted(set(overrides or {}) - set(names))
    if stray:
        raise ValueError(f"--set names heads {stray} that are not being trained ({names})")
    was_training = target.training
    target.eval()
    flags = [p.requires_grad for p in target.parameters()]
    for p in target.parameters():
        p.requires_grad_(False)
    try:
        configs = {n: _with_overrides(default_config(n, smoke), (overrides or {}).get(n, {})) for n in names}
        return {n: registered[n](target, train_windows, heldout_windows, device, out_dir, time_budget_s,
                                 config=configs[n]) for n in names}
    finally:
        for p, f in zip(target.parameters(), flags):
            p.requires_grad_(f)
        target.train(was_training)


def _with_overrides(cfg, fields: dict[str, Any]):
    """``cfg`` (a frozen dataclass) with ``fields`` replaced. Raises ValueError naming an unknown field."""
    known = {f.name for f in dataclasses.fields(cfg)}
    bad = sorted(set(fields) - known)
    if bad:
        raise ValueError(f"unknown config fields {bad} for {type(cfg).__name__}; known: {sorted(known)}")
    return dataclasses.replace(cfg, **fields) if fields else cfg


def parse_overrides(items: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``["METHOD.FIELD=VALUE", ...]`` (e.g. ``dflash.num_layers=3``) -> {method: {field: value}}. Values are
    JSON (numbers, true / false, null, lists -> tuples) or else plain strings. Raises ValueError for a
    malformed item."""
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        kind, dot, field_name = key.partition(".")
        if not (sep and dot and kind and field_name):
            raise ValueError(f"--set wants KIND.FIELD=VALUE (e.g. dflash.num_layers=3), got {item!r}")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        out.setdefault(kind, {})[field_name] = tuple(value) if isinstance(value, list) else value
    return out


# ---- pairing helpers (kept for tests/test_train.py and the Medusa issue) --------------------------
@dataclass
class HiddenStates:
    """Target features for head training.

    final:  [B, T, D] hidden state after the final norm (logits = final @ lm_head.weight.T).
    layers: {layer index: [B, T, D]} HF ``hidden_states`` entries (0 = the embeddings, l < L = the
            input of decoder layer l, L = the final-norm output again; see specviz.methods.eagle.features).
    """

    final: torch.Tensor
    layers: dict[int, torch.Tensor]


@torch.no_grad()
def target_hidden_states(target, input_ids: torch.Tensor, layers: Sequence[int] = ()) -> HiddenStates:
    """Run the target once. input_ids: int64 [B, T]. layers: indices into HF hidden_states.
    Returns float tensors in the model's compute dtype. Raises IndexError for a bad layer index."""
    out = target.model(input_ids=input_ids, output_hidden_states=True, use_cache=False)
    return HiddenStates(final=out.last_hidden_state, layers={i: out.hidden_states[i] for i in layers})
