"""Training the DFlash block drafter (``dflash``) on a frozen target.

Recipe: the SpecForge port (``specforge/core/dflash.py::OnlineDFlashModel``; paper Eq. 4; docs/design/methods.md
6.2), since the official one is unreleased. Per token window x_0..x_T (the LM's own windows):

* the frozen target runs once on x_0..x_{T-1}: taps c_j (outputs of ``target_layer_ids``) and the
  final-norm state f_j of every position j (logits z_j = W_lm f_j predict x_{j+1});
* ``num_anchors`` distinct anchors a per window, uniform in [1, T - B + 1], sorted (SpecForge
  ``_sample_anchor_positions``); block b = [x_a, MASK x (B-1)] at positions a .. a+B-1;
* attention (one dense bool mask per window, [N B, T + N B]): block b sees context keys j < a
  (**strictly**: the target has not run x_a yet at inference) and every slot of its own block
  (bidirectional); blocks never see each other;
* slot k = 1..B-1 predicts x_{a+k}; loss = sum_k w_k CE_k / sum_k w_k with w_k = exp(-(k-1)/gamma).

Our choices (say so in the card): soft labels, the target's own distribution softmax(z_{a+k-1})
with MASK's (pad's) probability removed, instead of SpecForge's data tokens (docs/design/methods.md 13, Q4);
B = 8 and gamma = 4 (SpecForge's block-8 advice); L_d = 2 layers with z-lab's tap rule; lr 1.5e-3
(SpecForge's 6e-4 is for 8 B targets); 96 anchors per 1024-token window; the cosine schedule runs
over whichever ends first, ``steps`` or the time budget (so a budget-stopped run still anneals).

Held-out measurement: per-slot top-1 agreement with the target's argmax (teacher-forced: the target
conditions on the data prefix), and ``chain[k]`` = all of slots 1..k agree (a proxy for greedy
acceptance); the honest number is :func:`specviz.train.head_eval.heldout_acceptance` (real greedy
decoding, vLLM's mean acceptance length, next to draft_model's), which the trainer's CLI runs.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from specviz.methods.dflash.head import HEAD_DIR, DFlashConfig, DFlashHead, dflash_config_from_target, save_dflash
from specviz.heads.formats.export import save_published_beside
from specviz.heads.common import soft_cross_entropy
from specviz.train.data import epoch_permutation
from specviz.train.configs import OptimizerConfig
from specviz.train.loop import autocast, lr_scale


@dataclass(frozen=True)
class DFlashTrainConfig(OptimizerConfig):
    """Hyper-parameters (see the module docstring for which are ours). eval_* : held-out windows."""

    steps: int = 8000  # with a time budget set, the budget ends the run before these steps do
    lr: float = 1.5e-3
    block_size: int = 8
    num_anchors: int = 96  # x B = 768 block queries per 1024-token window (docs/design/methods.md 12: 48-96)
    gamma: float = 4.0
    num_layers: int = 2
    target_layer_ids: tuple[int, ...] | None = None
    init_from_target: str | None = None  # "last" / "first": copy that many target layers (see init_from_target)
    eval_every: int = 500
    eval_windows: int = 64
    eval_batch_size: int = 8
    log_every: int = 50
    seed: int = 0
    min_seconds_left: float = 10.0


DFLASH_DEFAULT = DEFAULT = DFlashTrainConfig()
DFLASH_SMOKE = dataclasses.replace(DFLASH_DEFAULT, batch_size=8, steps=40, warmup_steps=4, num_anchors=8,
                                   eval_every=20, eval_windows=8, log_every=10, lr=3e-3, min_seconds_left=0.0)


# ---- one batch --------------------------------------------------------------------------------
@torch.no_grad()
def target_taps(target, inputs: torch.Tensor, layer_ids) -> tuple[torch.Tensor, torch.Tensor]:
    """inputs int64 [W, T] -> (features [W, T, len(ids) d] = outputs of layers ``layer_ids``
    (HF hidden_states[id + 1]) concatenated, final-norm f [W, T, d]); target compute dtype."""
    out = target.model(input_ids=inputs, output_hidden_states=True, use_cache=False)
    feats = torch.cat([out.hidden_states[i + 1] for i in layer_ids], dim=-1)
    return feats, out.last_hidden_state


def sample_anchors(W: int, T: int, num: int, block: int, generator: torch.Generator, device) -> torch.Tensor:
    """num distinct anchors per window, uniform in [1, T - block + 1], sorted: int64 [W, num].
    Raises ValueError if the window has fewer candidate anchors than ``num``."""
    span = T - block + 1
    if span < num:
        raise ValueError(f"{num} anchors need windows of >= {num + block - 1} tokens, got T={T}")
    r = torch.rand(W, span, generator=generator, device=device)
    return r.argsort(dim=1)[:, :num].sort(dim=1).values + 1


def block_inputs(ids: torch.Tensor, anchors: torch.Tensor, block: int, mask_id: int):
    """ids int64 [W, T+1], anchors [W, N] -> (block ids [W, N*B] = [x_a, MASK x (B-1)] per anchor,
    block positions [W, N*B] = a .. a+B-1)."""
    W, N = anchors.shape
    pos = anchors[:, :, None] + torch.arange(block, device=ids.device)  # [W, N, B]
    blk = torch.full_like(pos, mask_id)
    blk[:, :, 0] = ids.gather(1, anchors)  # the anchor token x_a
    return blk.view(W, N * block), pos.view(W, N * block)


def block_mask(anchors: torch.Tensor, T: int, block: int) -> torch.Tensor:
    """Training attention mask, bool [W, 1, N*B, T + N*B] (True = attend): the queries of block b see
    context keys j < anchor_b (strict) and the B keys of their own block."""
    W, N = anchors.shape
    q_block = torch.arange(N * block, device=anchors.device) // block  # [NB]: block of each query
    ctx = torch.arange(T, device=anchors.device)[None, None, :] < anchors.repeat_interleave(block, 1)[:, :, None]
    own = (q_block[:, None] == q_block[None, :]).expand(W, -1, -1)  # [W, NB, NB]
    return torch.cat([ctx, own], dim=2)[:, None]


def label_logits(target, final: torch.Tensor, anchors: torch.Tensor, block: int, mask_id: int) -> torch.Tensor:
    """The soft labels' logits of slots 1..B-1: z_{a+k-1} (the target's distribution of x_{a+k}), MASK
    removed (-inf). final [W, T, d], anchors [W, N] -> float32 [W, N, B-1, V]."""
    W, N = anchors.shape
    pos = anchors[:, :, None] + torch.arange(block - 1, device=anchors.device)  # [W, N, B-1]: a+k-1
    f = final.gather(1, pos.view(W, -1, 1).expand(-1, -1, final.shape[-1]))  # [W, N(B-1), d]
    with torch.no_grad():
        z = target.lm_head(f).float().view(W, N, block - 1, -1)
    z[..., mask_id] = float("-inf")
    return z


def dflash_loss(head: DFlashHead, target, ids: torch.Tensor, cfg: DFlashTrainConfig, generator, taps=None):
    """The position-weighted soft CE of one batch. ids int64 [W, T+1]. Returns (loss fp32 scalar,
    {"ce", "top1", "chain"}: fp32 [B-1] per slot, detached)."""
    hc, B = head.config, cfg.block_size
    W, T = ids.shape[0], ids.shape[1] - 1
    feats, final = taps if taps is not None else target_taps(target, ids[:, :T], hc.target_layer_ids)
    anchors = sample_anchors(W, T, cfg.num_anchors, B, generator, ids.device)  # [W, N]
    blk, pos = block_inputs(ids, anchors, B, hc.mask_token_id)
    mask = block_mask(anchors, T, B)
    ctx_pos = torch.arange(T, device=ids.device).expand(W, T)
    logits = head(feats, ctx_pos, blk, pos, None, attention_mask=mask)  # [W, N*B, V]
    logits = logits.view(W, cfg.num_anchors, B, -1)[:, :, 1:]  # [W, N, B-1, V]: slot 0 excluded
    labels = label_logits(target, final, anchors, B, hc.mask_token_id)  # [W, N, B-1, V]
    ce = soft_cross_entropy(logits, labels).flatten(0, 1).mean(0)  # [B-1]
    w = torch.exp(-torch.arange(B - 1, device=ids.device, dtype=torch.float32) / cfg.gamma)  # w_k, k = 1..B-1
    loss = (w * ce).sum() / w.sum()
    agree = (logits.argmax(-1) == labels.argmax(-1)).flatten(0, 1).float()  # [W N, B-1]
    return loss, {"ce": ce.detach(), "top1": agree.mean(0), "chain": agree.cumprod(dim=1).mean(0)}


# ---- the loop -----------------------------------------------------------------------------------
@torch.no_grad()
def evaluate_dflash(head, target, heldout: torch.Tensor, cfg: DFlashTrainConfig, device) -> dict:
    """Held-out loss and per-slot agreement on the first ``eval_windows`` windows, with fixed
    (seeded) anchors. Returns plain floats / lists."""
    head.eval()
    windows = heldout[: cfg.eval_windows]
    gen = torch.Generator(device=device).manual_seed(1234)
    sums: dict[str, torch.Tensor] = {}
    for i in range(0, windows.shape[0], cfg.eval_batch_size):
        batch = windows[i : i + cfg.eval_batch_size]
        with autocast(device):
            loss, stats = dflash_loss(head, target, batch, cfg, gen)
        for k, v in {"loss": loss.float(), **stats}.items():
            sums[k] = sums.get(k, 0) + v.float() * batch.shape[0]
    head.train()
    out = {k: (v / windows.shape[0]).tolist() for k, v in sums.items()}
    return {"loss": round(out["loss"], 5), **{k: [round(x, 4) for x in out[k]] for k in ("top1", "chain", "ce")}}


def new_head(target, cfg: DFlashTrainConfig = DFLASH_DEFAULT) -> tuple[DFlashConfig, DFlashHead]:
    """(config, a freshly initialised drafter, not attached) for ``target`` with ``cfg``'s shape. Raises ValueError as
    :func:`~specviz.methods.dflash.head.dflash_config_from_target` (e.g. a target without a pad token for MASK)."""
    hc = dflash_config_from_target(target.config, cfg.num_layers, cfg.block_size, cfg.target_layer_ids)
    return hc, DFlashHead(hc)


def fit_dflash(target, train_windows, heldout_windows, device, cfg: DFlashTrainConfig = DFLASH_DEFAULT,
               time_budget_s: float | None = None):
    """Train a DFlash head from scratch on the frozen ``target``. windows int64 [W, T+1] on device.
    Returns (head fp32, log dict)."""
    device = torch.device(device)
    torch.manual_seed(cfg.seed)
    hc, head = new_head(target, cfg)
    if cfg.init_from_target:
        init_from_target(head, target, cfg.init_from_target)
    head = head.to(device).attach(target).train()
    opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay,
                            fused=device.type == "cuda")
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    n_win, seq_len = train_windows.shape[0], train_windows.shape[1] - 1
    order = torch.cat([epoch_permutation(n_win, cfg.seed, e) for e in range(-(-cfg.steps * cfg.batch_size // n_win))])
    order = order[: cfg.steps * cfg.batch_size].view(cfg.steps, cfg.batch_size).to(device)  # moved once
    budget = None if time_budget_s is None else max(1.0, time_budget_s - cfg.min_seconds_left)
    log = {"head": "dflash", "config": dataclasses.asdict(cfg), "head_config": dataclasses.asdict(hc),
           "params": sum(p.numel() for p in head.parameters()), "seq_len": seq_len, "train": [], "heldout": [],
           "stopped_early": False}
    acc: dict[str, torch.Tensor] = {}
    t0, n_acc, step = time.time(), 0, 0
    for step in range(1, cfg.steps + 1):
        elapsed = time.time() - t0
        for g in opt.param_groups:
            g["lr"] = cfg.lr * lr_scale(cfg, step - 1, elapsed, budget)
        batch = train_windows[order[step - 1]]  # [W, T+1]
        with autocast(device):
            loss, stats = dflash_loss(head, target, batch, cfg, gen)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        for k, v in {"loss": loss.detach(), **stats}.items():
            acc[k] = acc.get(k, 0) + v.float()
        n_acc += 1
        over = budget is not None and time.time() - t0 > budget
        last = step == cfg.steps or over
        if step % cfg.log_every == 0 or last:
            row = {k: (v / n_acc).tolist() for k, v in acc.items()}  # one host sync per log row
            row = {k: round(v, 5) if isinstance(v, float) else [round(x, 4) for x in v] for k, v in row.items()}
            row.update(step=step, lr=opt.param_groups[0]["lr"], elapsed_s=round(time.time() - t0, 2))
            log["train"].append(row)
            acc, n_acc = {}, 0
        if step % cfg.eval_every == 0 or last:
            row = evaluate_dflash(head, target, heldout_windows, cfg, device)
            row.update(step=step, elapsed_s=round(time.time() - t0, 2))
            log["heldout"].append(row)
        if over:
            log["stopped_early"] = True
            break
    log.update(steps=step, tokens_seen=step * cfg.batch_size * seq_len, train_s=round(time.time() - t0, 2))
    return head, log


def init_from_target(head: DFlashHead, target, which: str = "last") -> list[int]:
    """Initialise the drafter's L_d layers from L_d of the target's decoder layers (q/k/v/o projections, SwiGLU,
    both RMSNorms; q_norm / k_norm stay at 1) and its final norm from the target's: ``which`` = "last" (the
    target's last L_d layers, whose outputs feed the shared LM head) or "first" (its first L_d, whose inputs are
    embeddings, as the block's are). A specviz choice (the DFlash paper trains from scratch), as the draft model's
    embedding is initialised from the target's. Returns the target layer indices copied.
    Raises ValueError for an unknown ``which`` or a target whose layer shapes differ."""
    layers = target.model.layers
    L, n = len(layers), len(head.layers)
    if which not in ("last", "first"):
        raise ValueError(f"init_from_target must be 'last' or 'first', got {which!r}")
    ids = list(range(L - n, L)) if which == "last" else list(range(n))
    with torch.no_grad():
        for mine, i in zip(head.layers, ids):
            src = layers[i]
            pairs = [(mine.q_proj, src.self_attn.q_proj), (mine.k_proj, src.self_attn.k_proj),
                     (mine.v_proj, src.self_attn.v_proj), (mine.o_proj, src.self_attn.o_proj),
                     (mine.input_layernorm, src.input_layernorm),
                     (mine.post_attention_layernorm, src.post_attention_layernorm),
                     (mine.mlp.gate_proj, src.mlp.gate_proj), (mine.mlp.up_proj, src.mlp.up_proj),
                     (mine.mlp.down_proj, src.mlp.down_proj)]
            for a, b in pairs:
                if a.weight.shape != b.weight.shape:
                    raise ValueError(f"target layer {i}: {tuple(b.weight.shape)} vs the drafter's {tuple(a.weight.shape)}")
                a.weight.copy_(b.weight)
        head.norm.weight.copy_(target.model.norm.weight)
    return ids


def train_dflash(target, train_windows, heldout_windows, device, out_dir, time_budget_s=None, config=None) -> dict:
    """DFlash block drafter (Chen et al. 2026, arXiv 2602.06036; SpecForge recipe, our choices in the
    module docstring). Saves out_dir/specviz-dflash/ (config.json, model.safetensors bf16, train_log.json) and
    z-lab's layout at out_dir/published/specviz-dflash/."""
    cfg = config or DFLASH_DEFAULT
    head, log = fit_dflash(target, train_windows, heldout_windows, device, cfg, time_budget_s)
    path = Path(out_dir) / HEAD_DIR
    log["saved"] = {"dir": str(path), "files": save_dflash(head, path)}
    log["saved"]["bytes"] = (path / "model.safetensors").stat().st_size
    log["saved"]["published"] = save_published_beside(head, out_dir, HEAD_DIR)  # z-lab's layout too
    (path / "train_log.json").write_text(json.dumps(log, indent=1))
    log["saved"]["files"].append("train_log.json")
    return log


def smoke_config(cfg: DFlashTrainConfig) -> DFlashTrainConfig:
    """The ``--smoke`` run (:data:`DFLASH_SMOKE`'s sizes)."""
    return DFLASH_SMOKE
