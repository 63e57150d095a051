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


def lr_lambda(cfg: TrainConfig) -> Callable[[int], float]:
    """Multiplier of the peak LR at step s: (s+1)/warmup during warmup, then cosine to min_lr_ratio."""

    def f(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        t = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(t, 1.0)))

    return f


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
