"""Training losses of the heads, with the (feature, token, position, label) alignment in one place.

A batch is a token window ``ids`` int64 [B, T+1] = x_0..x_T; the frozen target runs on x_0..x_{T-1}
and gives f_t / the EAGLE-3 taps g_t and its logits z_t (predicting x_{t+1}), t < T.

EAGLE-1 (docs/design/methods.md 2.3; EAGLE ``eagle/train/main.py``): row t = 0..T-2 reads (f_t + noise, x_{t+1})
at position t; its labels sit at position t+1: the regression target f_{t+1} (SmoothL1, mean over d)
and the soft label softmax(z_{t+1}) (soft cross-entropy, weight 0.1). Noise: uniform
U(-a, a) with a = noise * rms(f) of the batch (the paper's U(-0.1, 0.1) is for features of RMS ~1;
docs/design/methods.md 12 scales it to our feature RMS).

EAGLE-3 (docs/design/methods.md 4.3; EAGLE ``traineagle3/cnets.py``): S unrolled steps
(:mod:`specviz.methods.eagle.ttt`); row t of step s reads x_{t+1+s} at position t+s and is supervised by softmax(z_{t+1+s}) (the LABEL
position t+1+s; rows whose label position is >= T are dropped, SpecForge#885's rule "mask by the
label position"). Loss = sum_s decay^s * mean soft-CE_s, decay 0.8, no feature regression.

Agreement (logged): top1[s] = fraction of rows whose step-s argmax equals the target's argmax at
the label position; chain[s] = fraction of rows where steps 0..s all agree (a teacher-forced proxy
for the per-position acceptance of a greedy chain; the engine's acceptance metrics are in
``specviz/trace/metrics.py``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specviz.heads.common import soft_cross_entropy  # noqa: F401 (re-exported)
from specviz.methods.eagle.features import TargetFeatures
from specviz.methods.eagle.ttt import iter_unroll


def uniform_noise(f: torch.Tensor, scale: float, generator: torch.Generator | None) -> torch.Tensor:
    """U(-a, a) noise shaped like f with a = scale * rms(f) (rms over the whole batch, detached)."""
    a = scale * f.detach().float().pow(2).mean().sqrt()
    u = torch.rand(f.shape, generator=generator, device=f.device, dtype=torch.float32)
    return ((u * 2 - 1) * a).to(f.dtype)


def eagle1_loss(head, tf: TargetFeatures, ids: torch.Tensor, reg_weight: float = 1.0, cls_weight: float = 0.1,
                noise: float = 0.0, generator: torch.Generator | None = None):
    """EAGLE-1 loss on one batch. ids int64 [B, T+1]; tf from the target on ids[:, :T] with logits.
    Returns (loss fp32 scalar, {"reg", "cls", "top1"} detached fp32 scalars)."""
    B, T = ids.shape[0], ids.shape[1] - 1
    f = tf.final  # [B, T, d]
    inp = f[:, :-1]  # f_t, rows t = 0..T-2
    if noise > 0:
        inp = inp + uniform_noise(inp, noise, generator)
    pos = torch.arange(T - 1, device=ids.device).expand(B, T - 1)
    hidden, logits = head(inp, ids[:, 1:T], pos, None, from_target=True)  # [B, T-1, d], [B, T-1, V]
    reg = F.smooth_l1_loss(hidden.float(), f[:, 1:].float())  # target f_{t+1}
    labels = tf.logits[:, 1:]  # z_{t+1}: the target's distribution of x_{t+2}
    cls = soft_cross_entropy(logits, labels).mean()
    loss = reg_weight * reg + cls_weight * cls
    top1 = (logits.argmax(-1) == labels.argmax(-1)).float().mean()
    return loss, {"reg": reg.detach(), "cls": cls.detach(), "top1": top1}


def ttt_input_ids(ids: torch.Tensor, steps: int) -> torch.Tensor:
    """Tokens the unrolled head reads: x_1..x_T then ``steps`` pad ids (rows reading them are dropped).
    ids int64 [B, T+1] -> int64 [B, T + steps]."""
    pad = ids.new_zeros(ids.shape[0], steps)
    return torch.cat([ids[:, 1:], pad], dim=1)


def unrolled_steps(head, tf: TargetFeatures, ids: torch.Tensor, steps: int):
    """Yield (s, logits of the valid rows [B, T-1-s, V], soft labels' logits [B, T-1-s, V]) for
    s = 0..steps-1: row t of step s against the target at the label position t+1+s."""
    B, T = ids.shape[0], ids.shape[1] - 1
    if steps > T - 1:
        raise ValueError(f"{steps} unrolled steps need windows longer than {steps + 1} tokens, got T={T}")
    pos = torch.arange(T, device=ids.device).expand(B, T)
    for s, (_, logits) in enumerate(iter_unroll(head, tf.features, ttt_input_ids(ids, steps), pos, steps)):
        yield s, logits[:, : T - 1 - s], tf.logits[:, 1 + s :]


def eagle3_loss(head, tf: TargetFeatures, ids: torch.Tensor, steps: int, decay: float = 0.8):
    """EAGLE-3 training-time-test loss. Returns (loss fp32 scalar, {"ce": [steps], "top1": [steps]}
    detached fp32 tensors)."""
    loss, ces, top1 = 0.0, [], []
    for s, logits, labels in unrolled_steps(head, tf, ids, steps):
        ce = soft_cross_entropy(logits, labels).mean()
        loss = loss + decay**s * ce
        ces.append(ce.detach())
        top1.append((logits.argmax(-1) == labels.argmax(-1)).float().mean())
    return loss, {"ce": torch.stack(ces), "top1": torch.stack(top1)}


@torch.no_grad()
def agreement(head, tf: TargetFeatures, ids: torch.Tensor, steps: int) -> dict[str, torch.Tensor]:
    """Held-out agreement with the target's argmax, unrolled ``steps`` steps (any head kind).
    Returns {"top1": [steps], "chain": [steps], "ce": [steps]} fp32 tensors (means over rows)."""
    T = ids.shape[1] - 1
    top1, chain, ces, agree_all = [], [], [], None
    for s, logits, labels in unrolled_steps(head, tf, ids, steps):
        agree = logits.argmax(-1) == labels.argmax(-1)  # [B, T-1-s]
        agree_all = agree if agree_all is None else agree_all[:, : T - 1 - s] & agree
        top1.append(agree.float().mean())
        chain.append(agree_all.float().mean())
        ces.append(soft_cross_entropy(logits, labels).mean())
    return {"top1": torch.stack(top1), "chain": torch.stack(chain), "ce": torch.stack(ces)}
