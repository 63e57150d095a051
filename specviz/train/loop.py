"""The training loop: target and draft trained side by side on the same batches.

One step: fetch the batch (window indices from :class:`~specviz.train.data.BatchOrder`), then for
each model a forward under bf16 autocast (CUDA only; fp32 on CPU), next-token cross-entropy in
fp32, backward, grad-norm clip, AdamW step, LR schedule step. Each model has its own optimizer and
schedule (linear warmup, cosine decay to ``min_lr_ratio``). Held-out loss is evaluated every
``eval_every`` steps and at the end. The run is defined by its step count; ``time_budget_s`` only
stops a run that would overrun (the log then says ``stopped_early``).
"""

from __future__ import annotations

import math
import time
from contextlib import nullcontext
from typing import Callable

import torch
import torch.nn.functional as F

from specviz.train.configs import TrainConfig
from specviz.train.data import BatchOrder


def lr_scale(cfg, step: int, elapsed_s: float = 0.0, budget_s: float | None = None) -> float:
    """Multiplier of the peak LR at step ``step`` (0-based) of a config with warmup_steps, steps and min_lr_ratio:
    (step+1)/warmup during warmup, then cosine to min_lr_ratio over progress max(step / steps, elapsed_s / budget_s)
    (the time term only with a budget, so a run ended by its time budget still anneals to the floor)."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    t = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    if budget_s:
        t = max(t, elapsed_s / budget_s)
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(t, 1.0)))


def lr_lambda(cfg: TrainConfig) -> Callable[[int], float]:
    """:func:`lr_scale` by step alone, for ``torch.optim.lr_scheduler.LambdaLR``."""
    return lambda step: lr_scale(cfg, step)


def make_optimizer(model: torch.nn.Module, lr: float, cfg: TrainConfig, device: torch.device):
    """AdamW with weight decay on matrices only (not on norms); fused on CUDA. Returns (opt, sched)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=lr, betas=cfg.betas, fused=device.type == "cuda")
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(cfg))


def autocast(device: torch.device):
    """bf16 autocast on CUDA; nothing on CPU (the smoke run trains in fp32)."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()


def lm_loss(model, batch: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Mean next-token cross-entropy (nats/token). batch: int64 [B, T+1] -> fp32 scalar."""
    inputs, labels = batch[:, :-1], batch[:, 1:]  # [B, T] each
    with autocast(device):
        logits = model(input_ids=inputs, use_cache=False).logits  # [B, T, V]
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())


@torch.no_grad()
def heldout_loss(model, heldout: torch.Tensor, batch_size: int, device: torch.device) -> float:
    """Token-weighted mean loss over held-out windows. heldout: int64 [W, T+1] on device."""
    model.eval()
    total = torch.zeros((), device=device, dtype=torch.float64)
    for i in range(0, heldout.shape[0], batch_size):
        chunk = heldout[i : i + batch_size]
        total += lm_loss(model, chunk, device).double() * chunk.shape[0]
    model.train()
    return float(total / heldout.shape[0])


def train_models(
    models: dict[str, torch.nn.Module],
    lrs: dict[str, float],
    train_windows: torch.Tensor,
    heldout_windows: torch.Tensor,
    cfg: TrainConfig,
    seed: int,
    device: torch.device,
    time_budget_s: float | None,
    on_log: Callable[[dict], None],
    eval_models: dict[str, torch.nn.Module] | None = None,
) -> dict:
    """Train every model in ``models`` on the same batches.

    train_windows / heldout_windows: int64 [W, seq_len + 1], already on ``device``.
    lrs: peak LR per model name. on_log: called with the log dict after each held-out evaluation.
    eval_models: the modules to evaluate held-out loss with (default ``models``); the recipe passes
    the uncompiled models here when ``models`` are torch.compile wrappers of them.
    Returns the log: {"train": [{step, tokens, elapsed_s, lr_<name>, loss_<name>}],
    "heldout": [{step, tokens, elapsed_s, loss_<name>}], "steps", "tokens_seen", "epochs",
    "train_s", "stopped_early"}. Losses are nats/token.
    """
    order = BatchOrder(train_windows.shape[0], cfg.batch_size, seed)
    opts = {n: make_optimizer(m, lrs[n], cfg, device) for n, m in models.items()}
    acc = {n: torch.zeros((), device=device) for n in models}
    log = {"train": [], "heldout": [], "stopped_early": False}
    tokens_per_step = cfg.batch_size * cfg.seq_len
    for m in models.values():
        m.train()
    t0, step = time.time(), 0
    for step in range(1, cfg.steps + 1):
        batch = train_windows[order.indices(step - 1).to(device)]  # [B, T+1]
        for name, model in models.items():
            acc[name] += _train_step(model, *opts[name], batch, cfg, device)
        elapsed = time.time() - t0
        over = time_budget_s is not None and elapsed > time_budget_s
        if step % cfg.log_every == 0 or step == cfg.steps or over:
            n = cfg.log_every if step % cfg.log_every == 0 else step % cfg.log_every
            row = {"step": step, "tokens": step * tokens_per_step, "elapsed_s": round(elapsed, 2)}
            for name in models:
                row[f"loss_{name}"] = round(float(acc[name]) / n, 5)
                row[f"lr_{name}"] = opts[name][1].get_last_lr()[0]
                acc[name].zero_()
            log["train"].append(row)
        if step % cfg.eval_every == 0 or step == cfg.steps or over:
            _eval(eval_models or models, heldout_windows, cfg, device, step, tokens_per_step, t0, log)
            on_log(log)
        if over:
            log["stopped_early"] = True
            break
    log.update(steps=step, tokens_seen=step * tokens_per_step, epochs=order.epochs_seen(step))
    log["train_s"] = round(time.time() - t0, 2)
    return log


def _train_step(model, opt, sched, batch, cfg: TrainConfig, device) -> torch.Tensor:
    loss = lm_loss(model, batch, device)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def _eval(models, heldout, cfg, device, step, tokens_per_step, t0, log) -> None:
    row = {"step": step, "tokens": step * tokens_per_step}
    for name, model in models.items():
        row[f"loss_{name}"] = round(heldout_loss(model, heldout, cfg.batch_size, device), 5)
    row["elapsed_s"] = round(time.time() - t0, 2)
    log["heldout"].append(row)


# ---- v2: one model at a time (target, then the draft distilled from it) ----------------------------------
def distill_loss(student, teacher, batch: torch.Tensor, device: torch.device, weight: float) -> torch.Tensor:
    """Draft loss (DistillSpec, Zhou et al. 2024, arXiv 2310.08461: train the draft on the target's
    distribution, which is what acceptance measures). batch: int64 [B, T+1] -> fp32 scalar
    ``weight * soft_CE(softmax(teacher), student) + (1 - weight) * CE(student, corpus tokens)``; the teacher
    (the trained target, frozen) runs under no_grad. Soft CE = KL(p_target || q_draft) + the target's entropy."""
    inputs, labels = batch[:, :-1], batch[:, 1:]  # [B, T] each
    with torch.no_grad(), autocast(device):
        p = torch.softmax(teacher(input_ids=inputs, use_cache=False).logits.float(), dim=-1)  # [B, T, V]
    with autocast(device):
        logits = student(input_ids=inputs, use_cache=False).logits  # [B, T, V]
    logq = torch.log_softmax(logits.float(), dim=-1)
    loss = -(p * logq).sum(dim=-1).mean()
    if weight < 1.0:
        loss = weight * loss + (1 - weight) * F.nll_loss(logq.flatten(0, 1), labels.flatten())
    return loss


class _Plan:
    """The step count a run commits to. With a time budget, after ``plan_after`` steps the count becomes
    min(steps, what the measured step time allows in the remaining budget), and the LR schedule follows it."""

    def __init__(self, cfg: TrainConfig, steps: int, budget_s: float | None):
        self.cfg, self.steps, self.budget_s, self.planned_at = cfg, steps, budget_s, None
        self._t10: float | None = None

    def lr(self, step: int) -> float:
        cfg = self.cfg
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        t = (step - cfg.warmup_steps) / max(1, self.steps - cfg.warmup_steps)
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(t, 1.0)))

    def observe(self, step: int, elapsed: float) -> None:
        if self.budget_s is None or self.planned_at is not None:
            return
        if step == 10:  # steps 1..10 include compilation and warm-up
            self._t10 = elapsed
        if step == max(self.cfg.plan_after, 20) and self._t10 is not None:
            per_step = (elapsed - self._t10) / (step - 10)
            fit = step + int(0.97 * (self.budget_s - elapsed) / max(per_step, 1e-9))
            self.steps, self.planned_at = max(step + 1, min(self.steps, fit)), step


def train_single(name: str, model, loss_fn: Callable, lr: float, train_windows: torch.Tensor,
                 heldout_windows: torch.Tensor, cfg: TrainConfig, seed: int, device: torch.device, steps: int,
                 time_budget_s: float | None, on_log: Callable[[dict], None], eval_model=None) -> dict:
    """Train one model; keep the weights of its best held-out evaluation.

    loss_fn(model, batch [B, T+1]) -> fp32 scalar; held-out loss is always the corpus cross-entropy
    (:func:`heldout_loss` on ``eval_model``, default ``model``). The step count is ``steps``, or the plan's
    (see :class:`_Plan`) when ``time_budget_s`` is set, and never more than ``cfg.max_epochs`` passes. At the end the best evaluated weights are loaded into
    ``eval_model``. Returns {"train": [...], "heldout": [...], "steps", "planned_steps", "planned_at",
    "tokens_seen", "epochs", "train_s", "best_step", "best_heldout_loss", "stopped_early"}; losses in nats/token.
    """
    eval_model = eval_model if eval_model is not None else model
    order = BatchOrder(train_windows.shape[0], cfg.batch_size, seed)
    if cfg.max_epochs is not None:
        steps = min(steps, max(1, int(cfg.max_epochs * train_windows.shape[0] / cfg.batch_size)))
    plan = _Plan(cfg, steps, time_budget_s)
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=cfg.betas,
                            fused=device.type == "cuda")
    sched = torch.optim.lr_scheduler.LambdaLR(opt, plan.lr)
    log = {"train": [], "heldout": [], "stopped_early": False}
    acc, best, best_state = torch.zeros((), device=device), (float("inf"), 0), None
    tokens_per_step = cfg.batch_size * cfg.seq_len
    model.train()
    t0, step = time.time(), 0
    while step < plan.steps:
        step += 1
        batch = train_windows[order.indices(step - 1).to(device)]  # [B, T+1]
        loss = loss_fn(model, batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        acc += loss.detach()
        elapsed = time.time() - t0
        plan.observe(step, elapsed)
        over = time_budget_s is not None and elapsed > time_budget_s * 1.05
        last = step >= plan.steps or over
        if step % cfg.log_every == 0 or last:
            n = cfg.log_every if step % cfg.log_every == 0 else step % cfg.log_every
            log["train"].append({"step": step, "tokens": step * tokens_per_step, "elapsed_s": round(elapsed, 2),
                                 f"loss_{name}": round(float(acc) / n, 5), f"lr_{name}": sched.get_last_lr()[0]})
            acc.zero_()
        if step % cfg.eval_every == 0 or last:
            held = heldout_loss(eval_model, heldout_windows, cfg.batch_size, device)
            log["heldout"].append({"step": step, "tokens": step * tokens_per_step,
                                   "elapsed_s": round(time.time() - t0, 2), f"loss_{name}": round(held, 5)})
            if held < best[0]:
                best = (held, step)
                best_state = {k: v.detach().clone() for k, v in eval_model.state_dict().items()}
            on_log(log)
        if over:
            log["stopped_early"] = True
            break
    if best_state is not None:
        eval_model.load_state_dict(best_state)
    log.update(steps=step, planned_steps=plan.steps, planned_at=plan.planned_at, tokens_seen=step * tokens_per_step,
               epochs=order.epochs_seen(step), train_s=round(time.time() - t0, 2), best_step=best[1],
               best_heldout_loss=round(best[0], 5))
    return log
