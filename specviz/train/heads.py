"""Training the EAGLE-1 (``eagle``) and EAGLE-3 (``eagle3``) heads on a frozen target.

Registry: ``HEAD_TRAINERS[name](target, train_windows, heldout_windows, device, out_dir,
time_budget_s) -> log dict``; windows are int64 [W, T+1] token windows on ``device`` (the LM's own
training windows). Each trainer freezes nothing itself (:func:`train_heads` freezes the target),
computes the target's features online per batch under ``no_grad`` (bf16 autocast on CUDA, fp32 on
CPU), trains the head (AdamW (0.9, 0.95), wd 0, linear warmup + cosine to 10%, grad clip, bf16
autocast on CUDA), evaluates held-out agreement with the target's argmax per unrolled step, and
saves ``out_dir/specviz-eagle/`` or ``out_dir/specviz-eagle3/`` (config.json + model.safetensors in
bf16 + train_log.json), and the same head in the layout the field loads at ``out_dir/published/<that name>/``
(:mod:`specviz.heads.formats.export`: SafeAILab EAGLE-1, speculators EAGLE-3, FasterDecoding Medusa). Losses and the label alignment: :mod:`specviz.heads.losses`.

Default sizes (how they were chosen; :func:`estimate_flops_per_token` recomputes them for any
target): the v2 target (d=256, 20 layers, GQA 4/2, SwiGLU 704, V=8192, T=1024) costs ~44 MFLOP per
token forward (weights incl. the LM head, causal attention). EAGLE-1's fwd+bwd (fc, one layer, the
8192-way LM head; x3, the frozen LM head's weight gradient skipped) adds ~15 MFLOP -> ~59 MFLOP per
token, 1.9 TFLOP per 32 x 1024-token step. EAGLE-3 with S=5 steps adds 5 x (layer with 2d-wide
q/k/v + LM head) fwd+bwd plus dense masked attention over (s+1)T keys at step s -> ~160 MFLOP per
token, 5.3 TFLOP per step. The project measured ~145 TFLOP/s effective for small-model training on
the H200 (results/train/probe_compile.json, compiled); assuming ~100 TFLOP/s here (eager), a step
takes ~19 ms (EAGLE-1) / ~53 ms (EAGLE-3), so 6000 / 2400 steps take ~117 / ~126 s plus evaluation
(~196 M / ~79 M tokens). ``time_budget_s`` stops a run that would overrun (the log then says
``stopped_early``). These are estimates: not yet measured on the H200.

CLI: ``python -m specviz.train.heads --target DIR --out DIR [--heads eagle,eagle3]
[--time-budget-s S] [--smoke] [--device cuda|cpu] [--preset NAME]``. Windows come from
:func:`head_windows`, i.e. ``specviz.train.recipe.head_windows(tokenizer, preset)``.

Also here (used by tests/test_train.py): :func:`target_hidden_states`, :func:`eagle_batch`,
:func:`medusa_labels` (Medusa, Cai et al. 2024: head i (0-based) predicts x_{t+2+i}).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from specviz.heads import HEAD_DIRS, build_head, head_config_from_target, save_head, target_features
from specviz.heads.formats.export import save_published_beside
from specviz.heads.losses import agreement, eagle1_loss, eagle3_loss
from specviz.train import head_kinds
from specviz.train.data import BatchOrder, epoch_permutation
from specviz.train.loop import autocast, lr_lambda

IGNORE_INDEX = -100


# ---- configuration ----------------------------------------------------------------------------
@dataclass(frozen=True)
class HeadTrainConfig:
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
    """

    batch_size: int = 32
    steps: int = 6000
    lr: float = 1e-3
    warmup_steps: int = 150
    min_lr_ratio: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.0
    grad_clip: float = 1.0
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
    fit_to_budget: bool = False  # shorten the run (and its cosine) to what time_budget_s allows, timed at step 20


DEFAULTS = {"eagle": HeadTrainConfig(), "eagle3": HeadTrainConfig(steps=2400, warmup_steps=100, eval_every=600),
            # medusa: K = 4 heads (ttt_steps unused); mtp: S = 4 unrolled steps (methods.md 7.4). Not yet timed on the H200.
            "medusa": HeadTrainConfig(steps=6000, warmup_steps=100, eval_every=750, fit_to_budget=True),
            "mtp": HeadTrainConfig(steps=4000, warmup_steps=100, eval_every=500, ttt_steps=4, fit_to_budget=True)}
SMOKE = {
    name: dataclasses.replace(cfg, batch_size=8, steps=40, warmup_steps=4, ttt_steps=3, eval_every=20,
                              eval_windows=8, eval_batch_size=8, log_every=10, lr=3e-3, min_seconds_left=0.0)
    for name, cfg in DEFAULTS.items()
}


def estimate_flops_per_token(kind: str, target_config, cfg: HeadTrainConfig, seq_len: int) -> dict[str, float]:
    """Rough training FLOPs per token (see the module docstring): the target forward and the head's
    forward + backward (x3; the frozen LM head's weight gradient is skipped, counted x2)."""
    c = target_config
    d, V, L, ff = c.hidden_size, c.vocab_size, c.num_hidden_layers, c.intermediate_size
    hd = getattr(c, "head_dim", None) or d // c.num_attention_heads
    kv = c.num_key_value_heads * hd
    layer = 2 * (2 * d * d + 2 * d * kv + 3 * d * ff)  # q, o, k, v, SwiGLU
    target = L * (layer + 2 * seq_len * d) + 2 * d * V  # causal attention ~ T/2 keys, 4 flops each
    lm = 2 * d * V
    if kind in head_kinds.KINDS:
        head = head_kinds.flops_per_token(kind, target_config, cfg)
    elif kind == "eagle":
        head = 3 * (2 * 2 * d * d + layer + 2 * seq_len * d) + 2 * lm
    else:
        S = cfg.ttt_steps
        layer3 = layer + 2 * (d * d + 2 * d * kv)  # q/k/v read 2d
        head = 3 * 2 * 3 * d * d + S * (3 * layer3 + 2 * lm) + sum(3 * 4 * (s + 1) * seq_len * d for s in range(S))
    return {"target_fwd": float(target), "head_fwd_bwd": float(head), "total": float(target + head)}


# ---- the loop -----------------------------------------------------------------------------------
def _loss(kind: str, head, tf, batch, cfg: HeadTrainConfig, gen, train: bool):
    if kind in head_kinds.KINDS:
        return head_kinds.loss(kind, head, tf, batch, cfg)
    if kind == "eagle":
        return eagle1_loss(head, tf, batch, cfg.reg_weight, cfg.cls_weight, cfg.noise if train else 0.0, gen)
    return eagle3_loss(head, tf, batch, cfg.ttt_steps, cfg.decay)


def _features(target, batch: torch.Tensor, head_cfg, device):
    with torch.no_grad(), autocast(device):
        if head_cfg.kind in head_kinds.KINDS:
            return head_kinds.features(target, batch[:, :-1], head_cfg)
        return target_features(target, batch[:, :-1], head_cfg, with_logits=True)


@torch.no_grad()
def evaluate_head(kind: str, head, target, heldout: torch.Tensor, cfg: HeadTrainConfig, device) -> dict:
    """Held-out loss (the training objective without noise) and per-step agreement with the
    target's argmax over the first ``cfg.eval_windows`` windows. Returns plain floats / lists."""
    head.eval()
    windows = heldout[: cfg.eval_windows]
    sums: dict[str, torch.Tensor] = {}
    for i in range(0, windows.shape[0], cfg.eval_batch_size):
        batch = windows[i : i + cfg.eval_batch_size]
        tf = _features(target, batch, head.config, device)
        with autocast(device):
            own = kind in head_kinds.KINDS  # medusa / mtp
            agr = head_kinds.agreement(kind, head, tf, batch, cfg) if own else agreement(head, tf, batch, cfg.ttt_steps)
            if kind == "eagle":
                loss, _ = _loss(kind, head, tf, batch, cfg, None, train=False)
            else:  # the weighted objective from the same pass (TTT steps, Medusa heads, MTP steps)
                n = head_kinds.decay_steps(kind, head, cfg) if own else cfg.ttt_steps
                loss = sum(cfg.decay**s * agr["ce"][s] for s in range(n))
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


def fit_head(kind: str, target, train_windows, heldout_windows, device, cfg: HeadTrainConfig,
             time_budget_s: float | None = None):
    """Train one head from scratch. Returns (head fp32 on device, log dict)."""
    device = torch.device(device)
    torch.manual_seed(cfg.seed)
    if kind in head_kinds.KINDS:
        head_cfg, head = head_kinds.new_head(kind, target, cfg)
    else:
        head_cfg = head_config_from_target(target.config, kind, cfg.aux_layer_ids)
        head = build_head(head_cfg)
    head = head.to(device).attach(target).train()
    runner = torch.compile(head) if (cfg.compile and kind == "eagle") else head
    opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay,
                            fused=device.type == "cuda")
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(cfg))
    order = BatchOrder(train_windows.shape[0], cfg.batch_size, cfg.seed)
    batch_idx = _batch_indices(train_windows.shape[0], cfg).to(device)  # [steps, B], moved once
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    seq_len = train_windows.shape[1] - 1
    log = {"head": kind, "config": dataclasses.asdict(cfg), "head_config": dataclasses.asdict(head_cfg),
           "params": sum(p.numel() for p in head.parameters()), "seq_len": seq_len,
           "flops_per_token": estimate_flops_per_token(kind, target.config, cfg, seq_len),
           "train": [], "heldout": [], "stopped_early": False}
    acc: dict[str, torch.Tensor] = {}
    t0, n_acc, step, total = time.time(), 0, 0, cfg.steps
    for step in range(1, cfg.steps + 1):
        batch = train_windows[batch_idx[step - 1]]  # [B, T+1]
        tf = _features(target, batch, head_cfg, device)
        with autocast(device):
            loss, stats = _loss(kind, runner, tf, batch, cfg, gen, train=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), cfg.grad_clip)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        for k, v in {"loss": loss.detach(), **stats}.items():
            acc[k] = acc.get(k, 0) + v.float()
        n_acc += 1
        if cfg.fit_to_budget and time_budget_s is not None and step == FIT_AT_STEP:
            total = _fit_steps(cfg, step, time.time() - t0, time_budget_s)
            sched.lr_lambdas = [lr_lambda(dataclasses.replace(cfg, steps=total))]  # the cosine ends at `total`
            log["fitted_steps"] = total
        over = time_budget_s is not None and time.time() - t0 > time_budget_s - cfg.min_seconds_left
        last = step == total or over
        if step % cfg.log_every == 0 or last:
            row = {k: (v / n_acc).tolist() for k, v in acc.items()}  # one host sync per log row
            row = {k: round(v, 5) if isinstance(v, float) else _r(v) for k, v in row.items()}
            row.update(step=step, tokens=step * cfg.batch_size * seq_len, lr=sched.get_last_lr()[0],
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


FIT_AT_STEP = 20


def _fit_steps(cfg: HeadTrainConfig, step: int, elapsed: float, budget: float) -> int:
    """Steps that fit the budget at the pace of the first ``step`` steps (which include warm-up costs,
    so the estimate is low rather than high), leaving ``min_seconds_left`` and ~3 % for the evaluations;
    at most cfg.steps, at least step + 1."""
    per_step = elapsed / step
    usable = (budget - cfg.min_seconds_left) * 0.97 - elapsed
    return int(min(cfg.steps, max(step + 1, step + usable // per_step)))


def _train(kind: str, target, train_windows, heldout_windows, device, out_dir, time_budget_s,
           config: HeadTrainConfig | None = None) -> dict:
    cfg = config or DEFAULTS[kind]
    head, log = fit_head(kind, target, train_windows, heldout_windows, device, cfg, time_budget_s)
    path = Path(out_dir) / HEAD_DIRS[kind]
    log["saved"] = {"dir": str(path), "files": save_head(head, path)}
    log["saved"]["bytes"] = (path / "model.safetensors").stat().st_size
    log["saved"]["published"] = save_published_beside(head, out_dir, HEAD_DIRS[kind])  # the field's layout too
    (path / "train_log.json").write_text(json.dumps(log, indent=1))
    log["saved"]["files"].append("train_log.json")
    return log


def train_eagle(target, train_windows, heldout_windows, device, out_dir, time_budget_s=None, config=None) -> dict:
    """EAGLE-1 head (Li et al. 2024, arXiv 2401.15077): SmoothL1(f_hat_{t+1}, f_{t+1}) + 0.1 soft CE
    against softmax(W_lm f_{t+1}), uniform feature noise. Saves out_dir/specviz-eagle/."""
    return _train("eagle", target, train_windows, heldout_windows, device, out_dir, time_budget_s, config)


def train_eagle3(target, train_windows, heldout_windows, device, out_dir, time_budget_s=None, config=None) -> dict:
    """EAGLE-3 head (Li et al. 2025, arXiv 2503.01840): training-time test over ``ttt_steps`` unrolled
    steps, soft labels from the target, weights 0.8^s. Saves out_dir/specviz-eagle3/."""
    return _train("eagle3", target, train_windows, heldout_windows, device, out_dir, time_budget_s, config)


def train_medusa(target, train_windows, heldout_windows, device, out_dir, time_budget_s=None, config=None) -> dict:
    """Medusa heads (Cai et al. 2024, arXiv 2401.10774): K = 4 ResBlocks on f_t over the target's frozen LM
    head, soft labels from the target, weights 0.8^i (:mod:`specviz.train.head_kinds`). Saves out_dir/specviz-medusa/."""
    return _train("medusa", target, train_windows, heldout_windows, device, out_dir, time_budget_s, config)


def train_mtp(target, train_windows, heldout_windows, device, out_dir, time_budget_s=None, config=None) -> dict:
    """Gemma-4-style MTP head, trained by specviz (no public recipe; methods.md 7.4): S = 4 steps at the
    constant position over the target's last-layer K/V, soft labels, weights 0.8^s. Saves out_dir/specviz-mtp/."""
    return _train("mtp", target, train_windows, heldout_windows, device, out_dir, time_budget_s, config)


HEAD_TRAINERS: dict[str, Callable[..., dict]] = {"eagle": train_eagle, "eagle3": train_eagle3, "medusa": train_medusa,
                                                 "mtp": train_mtp}


def _register_dflash() -> None:
    """DFlash (specviz/train/dflash.py): its own config type, trainer and held-out acceptance run."""
    from specviz.train.dflash import DFLASH_DEFAULT, DFLASH_SMOKE, train_dflash

    HEAD_TRAINERS["dflash"], DEFAULTS["dflash"], SMOKE["dflash"] = train_dflash, DFLASH_DEFAULT, DFLASH_SMOKE


_register_dflash()
HEAD_KS = {"dflash": 7}  # greedy k of the held-out acceptance run (DFlash: B - 1 = 7, issue 16)


def train_heads(target, train_windows: torch.Tensor, heldout_windows: torch.Tensor, device, out_dir,
                time_budget_s: float | None = None, heads: Sequence[str] | None = None,
                smoke: bool = False, overrides: dict[str, dict[str, Any]] | None = None) -> dict[str, dict]:
    """Train the registered heads (``heads``: names, default all) on the frozen target, one after
    the other, each with ``time_budget_s``. windows: int64 [W, T+1] on device. smoke: the tiny
    CPU configs (:data:`SMOKE`). overrides: {name: {config field: value}} replacing fields of that head's
    config (the CLI's ``--set``). Returns {name: log}. Raises ValueError for an unknown name or field."""
    names = list(HEAD_TRAINERS) if heads is None else list(heads)
    unknown = [n for n in names if n not in HEAD_TRAINERS]
    if unknown:
        raise ValueError(f"unknown heads {unknown}; registered: {sorted(HEAD_TRAINERS)}")
    stray = sorted(set(overrides or {}) - set(names))
    if stray:
        raise ValueError(f"--set names heads {stray} that are not being trained ({names})")
    was_training = target.training
    target.eval()
    flags = [p.requires_grad for p in target.parameters()]
    for p in target.parameters():
        p.requires_grad_(False)
    try:
        configs = {n: _with_overrides(SMOKE[n] if smoke else DEFAULTS[n], (overrides or {}).get(n, {}))
                   for n in names}
        return {n: HEAD_TRAINERS[n](target, train_windows, heldout_windows, device, out_dir, time_budget_s,
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
    """``["dflash.num_layers=3", "medusa.head_layers=2"]`` -> {"dflash": {"num_layers": 3}, ...}. Values are
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


# ---- data for the CLI ---------------------------------------------------------------------------
def head_windows(tokenizer, preset: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(train_windows, heldout_windows) int64 [W, T+1] (CPU) for head training: the same windows the LM
    trained on (:func:`specviz.train.recipe.head_windows`: the preset's corpus encoded with ``tokenizer``)."""
    from specviz.train import recipe

    return recipe.head_windows(tokenizer, preset)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m specviz.train.heads", description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True, help="target model directory (safetensors)")
    ap.add_argument("--out", required=True, help="output directory; heads go to OUT/specviz-eagle*/")
    ap.add_argument("--heads", "--kinds", dest="heads", default="eagle,eagle3",
                    help="comma-separated: " + ", ".join(HEAD_TRAINERS))
    ap.add_argument("--time-budget-s", type=float, default=None, help="per-head training time limit")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny run (smoke preset windows, SMOKE configs, one CPU thread); < 60 s on a tiny target")
    ap.add_argument("--preset", default=None, help="window preset (default: demo, or smoke with --smoke)")
    ap.add_argument("--device", default=None, choices=["cuda", "cpu"])
    ap.add_argument("--mal-prompts", type=int, default=20,
                    help="held-out prompts for the greedy mean acceptance length of dflash vs draft_model (0 = skip)")
    ap.add_argument("--mal-prompts-file", default="results/train/v2/heldout_prompts.json")
    ap.add_argument("--mal-new-tokens", type=int, default=64)
    ap.add_argument("--no-eval", action="store_true", help="skip the held-out acceptance run through the engine")
    ap.add_argument("--eval-prompts", default=None, help="heldout_prompts.json (default results/train/v2/...)")
    ap.add_argument("--eval-limit", type=int, default=None, help="held-out prompts (default 40; --smoke: 2)")
    ap.add_argument("--eval-k", type=int, default=4, help="num_speculative_tokens of the acceptance run")
    ap.add_argument("--eval-tokens", type=int, default=None, help="new tokens per prompt (default 64; --smoke: 8)")
    ap.add_argument("--eval-dtype", default="float32", help="dtype of the acceptance run (float32: greedy is then "
                    "exactly plain greedy; bf16 may flip near-ties)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KIND.FIELD=VALUE",
                    help="replace a field of one head's training config, e.g. dflash.init_from_target=last, "
                         "medusa.head_layers=2 (repeatable)")
    ap.add_argument("--draft", default=None, help="draft model beside the heads (default: the bundled draft, when "
                    "the target is the bundled one)")
    args = ap.parse_args(argv)
    overrides = parse_overrides(args.overrides)
    from specviz.models import load_model, load_tokenizer, resolve_device

    device = resolve_device(args.device)
    if args.smoke and device.type == "cpu":
        torch.set_num_threads(1)  # tiny ops: intra-op threads only contend on a shared CPU
    target = load_model(args.target, device, torch.float32)  # fp32 master copy; bf16 autocast on CUDA
    tok = load_tokenizer(args.target)
    train_w, held_w = head_windows(tok, args.preset or ("smoke" if args.smoke else "demo"))
    names = [n.strip() for n in args.heads.split(",") if n.strip()]
    logs = train_heads(target, train_w.to(device), held_w.to(device), device, args.out, args.time_budget_s,
                       names, smoke=args.smoke, overrides=overrides)
    summary = {n: {"steps": g["steps"], "train_s": g["train_s"], "stopped_early": g["stopped_early"],
                   "heldout": g["heldout"][-1], "bytes": g["saved"]["bytes"]} for n, g in logs.items()}
    print(json.dumps(summary))
    for name in (n for n in names if n in HEAD_KS and args.mal_prompts > 0):
        logs[name]["heldout_acceptance"] = _heldout_acceptance(args, name, logs[name], device)
    if not args.no_eval:
        logs["acceptance"] = _acceptance(args, logs, device)
    return logs


def _heldout_acceptance(args, name: str, log: dict, device) -> dict:
    """Greedy held-out mean acceptance length of a head whose natural k is not the CLI's (``HEAD_KS``:
    DFlash, B - 1 = 7) next to draft_model's at the same k (:mod:`specviz.train.head_eval`, fp32),
    printed and added to the head's train_log.json."""
    from specviz.train import head_eval

    res = head_eval.heldout_acceptance(args.target, {name: log["saved"]["dir"]}, _draft_for(args),
                                       args.mal_prompts_file, k=HEAD_KS[name], max_new_tokens=args.mal_new_tokens,
                                       limit=args.mal_prompts, device=device.type, dtype=args.eval_dtype)
    print(head_eval.summary_line(res))
    path = Path(log["saved"]["dir"]) / "train_log.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "heldout_acceptance": res}, indent=1))
    return res


def _draft_for(args) -> str | None:
    """--draft, or the bundled draft when the target is the bundled one (None: no draft_model row)."""
    from specviz.models import DEFAULT_TARGET
    from specviz.train import head_eval

    if args.draft is None and Path(args.target).resolve() == Path(DEFAULT_TARGET).resolve() \
            and head_eval.DEFAULT_DRAFT.exists():
        return str(head_eval.DEFAULT_DRAFT)
    return args.draft


def _acceptance(args, logs: dict, device) -> dict:
    """Held-out greedy mean acceptance length of the heads just trained, next to draft_model's
    (:mod:`specviz.train.head_eval`); printed as one line and saved to OUT/heads_acceptance.json."""
    from specviz.models import DEFAULT_TARGET
    from specviz.train import head_eval

    draft = _draft_for(args)
    bundled = Path(args.target).resolve() == Path(DEFAULT_TARGET).resolve()
    heads = {n: g["saved"]["dir"] for n, g in logs.items()}
    if bundled:  # the bundled EAGLE-3 head too, on the same prompts (the card's comparison column)
        from specviz.heads import default_head_dir

        if "eagle3" not in heads and default_head_dir("eagle3").exists():
            heads["eagle3"] = str(default_head_dir("eagle3"))
    res = head_eval.heldout_acceptance(args.target, heads, draft, args.eval_prompts, k=args.eval_k,
                                       max_new_tokens=args.eval_tokens or (8 if args.smoke else 64),
                                       limit=args.eval_limit or (2 if args.smoke else 40), device=device.type,
                                       dtype=args.eval_dtype)
    print(head_eval.summary_line(res))
    (Path(args.out) / "heads_acceptance.json").write_text(json.dumps(res, indent=1))
    return res


# ---- pairing helpers (kept for tests/test_train.py and the Medusa issue) --------------------------
@dataclass
class HiddenStates:
    """Target features for head training.

    final:  [B, T, D] hidden state after the final norm (logits = final @ lm_head.weight.T).
    layers: {layer index: [B, T, D]} HF ``hidden_states`` entries (0 = the embeddings, l < L = the
            input of decoder layer l, L = the final-norm output again; see specviz.heads.features).
    """

    final: torch.Tensor
    layers: dict[int, torch.Tensor]


@torch.no_grad()
def target_hidden_states(target, input_ids: torch.Tensor, layers: Sequence[int] = ()) -> HiddenStates:
    """Run the target once. input_ids: int64 [B, T]. layers: indices into HF hidden_states.
    Returns float tensors in the model's compute dtype. Raises IndexError for a bad layer index."""
    out = target.model(input_ids=input_ids, output_hidden_states=True, use_cache=False)
    return HiddenStates(final=out.last_hidden_state, layers={i: out.hidden_states[i] for i in layers})


def eagle_batch(final: torch.Tensor, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """EAGLE training pairs. final: [B, T, D]; input_ids: int64 [B, T]. Returns (all length T-2):
    features [B, T-2, D] = f_t; next_ids [B, T-2] = x_{t+1} (the token paired with f_t);
    target_features [B, T-2, D] = f_{t+1}; target_ids [B, T-2] = x_{t+2}."""
    return {
        "features": final[:, :-2],
        "next_ids": input_ids[:, 1:-1],
        "target_features": final[:, 1:-1],
        "target_ids": input_ids[:, 2:],
    }


def medusa_labels(input_ids: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Labels of Medusa heads. input_ids: int64 [B, T]. Returns int64 [num_heads, B, T] where
    [i, b, t] = input_ids[b, t + 2 + i], or IGNORE_INDEX past the end."""
    B, T = input_ids.shape
    out = torch.full((num_heads, B, T), IGNORE_INDEX, dtype=input_ids.dtype, device=input_ids.device)
    for i in range(num_heads):
        shift = i + 2
        if shift < T:
            out[i, :, : T - shift] = input_ids[:, shift:]
    return out


if __name__ == "__main__":
    main()
