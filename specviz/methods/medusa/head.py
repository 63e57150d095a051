"""Medusa heads (Cai et al. 2024, arXiv 2401.10774; FasterDecoding/Medusa ``medusa_model.py``;
vLLM ``model_executor/models/medusa.py`` with ``original_lm_head: true``).

K heads read the same feature f_t, the target's final hidden state **after** the final RMSNorm at
the last committed position t (what the LM head multiplies; HF ``last_hidden_state``, the runner
tap ``final_norm``; docs/design/methods.md 0 and 1.1). Head i (0-based) predicts x_{t+2+i}::

    h_i      = f_t + SiLU(W_i f_t + b_i)        ResBlock, W_i zero-initialised (the block starts as the identity)
    logits_i = W_lm h_i                          the target's frozen LM head, shared by every head (vLLM
                                                 ``original_lm_head``): only the K ResBlocks are trained and saved

The LM head itself gives x_{t+1} (the root). Training (docs/design/methods.md 12, decision Q4): soft labels, the
target's own distribution softmax(z_{t+1+i}) at the future position, loss sum_i 0.8^i CE_i
(:func:`medusa_loss`). Parameters for d = 256, K = 4: 4 x (256^2 + 256) = 263 k (0.5 MB in bf16).
No gradio / plotly here.
"""

from __future__ import annotations

from typing import ClassVar
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from specviz.heads.common import FinalFeatureConfig, JsonConfig, SharedTargetMixin, soft_cross_entropy

DEFAULT_NUM_HEADS = 4
LM_HEADS = ("target", "per_head", "shared")


@dataclass(frozen=True)
class MedusaConfig(FinalFeatureConfig, JsonConfig):
    """Shape of a Medusa head set.

    kind: "medusa". hidden_size: d (the target's). vocab_size: V (the target's).
    num_heads: K, head i predicts x_{t+2+i}. num_layers: ResBlocks per head (Medusa's
    ``medusa_num_layers``, 1). target_num_hidden_layers: L of the target it was built for.

    Published layouts (:mod:`specviz.heads.formats`) also set:
    fc_bias:          the ResBlocks' linears have a bias (FasterDecoding: yes; vLLM: ``medusa_fc_bias``).
    lm_heads:         "target" (the target's LM head: specviz, Medusa-2), "per_head" (one own LM head per
                      head: Medusa-1, vLLM) or "shared" (one own LM head for all: vLLM ``original_lm_head``).
    head_vocab_size:  rows of the own LM heads (vLLM ``truncated_vocab_size``); None = V. Fewer than V
                      needs the buffer ``token_map`` (int64, row -> target id); logits elsewhere are -inf.
    """

    LABEL: ClassVar[str] = "medusa"

    kind: str
    hidden_size: int
    vocab_size: int
    target_num_hidden_layers: int
    num_heads: int = DEFAULT_NUM_HEADS
    num_layers: int = 1
    fc_bias: bool = True
    lm_heads: str = "target"
    head_vocab_size: int | None = None

    def __post_init__(self):
        if self.kind != "medusa":
            raise ValueError(f"a MedusaConfig has kind 'medusa', got {self.kind!r}")
        if self.lm_heads not in LM_HEADS:
            raise ValueError(f"lm_heads must be one of {LM_HEADS}, got {self.lm_heads!r}")
        if self.head_vocab_size is not None and (self.lm_heads == "target"
                                                 or not 1 <= self.head_vocab_size <= self.vocab_size):
            raise ValueError(f"head_vocab_size {self.head_vocab_size} needs own LM heads and must be in "
                             f"[1, {self.vocab_size}]")
        if self.num_heads < 1 or self.num_layers < 1:
            raise ValueError(f"Medusa needs num_heads >= 1 and num_layers >= 1, got {self.num_heads}, {self.num_layers}")


def medusa_config_from_target(target_config, num_heads: int = DEFAULT_NUM_HEADS, num_layers: int = 1) -> MedusaConfig:
    """The Medusa config for a transformers Llama-like target config (``num_layers``: ResBlocks per head,
    Medusa's ``medusa_num_layers``)."""
    c = target_config
    return MedusaConfig(kind="medusa", hidden_size=c.hidden_size, vocab_size=c.vocab_size,
                        target_num_hidden_layers=c.num_hidden_layers, num_heads=num_heads, num_layers=num_layers)


def check_medusa_matches(cfg: MedusaConfig, target_config) -> None:
    """Raise ValueError (saying what differs) unless the heads fit this target."""
    c = target_config
    problems = [f"{name} {mine} != target's {theirs}" for name, mine, theirs in (
        ("hidden size", cfg.hidden_size, c.hidden_size), ("vocab size", cfg.vocab_size, c.vocab_size),
        ("layer count", cfg.target_num_hidden_layers, c.num_hidden_layers)) if mine != theirs]
    if problems:
        raise ValueError("medusa head does not match the target: " + "; ".join(problems)
                         + ". Use a head trained for this target (specviz train heads --target DIR).")


class ResBlock(nn.Module):
    """Medusa's ``ResBlock``: x + SiLU(Linear(d, d)(x)), the linear zero-initialised (identity at start)."""

    def __init__(self, d: int, bias: bool = True):
        super().__init__()
        self.linear = nn.Linear(d, d, bias=bias)
        nn.init.zeros_(self.linear.weight)
        if bias:
            nn.init.zeros_(self.linear.bias)

    def forward(self, x):
        return x + F.silu(self.linear(x))


class MedusaHead(SharedTargetMixin, nn.Module):
    """K Medusa heads over the target's frozen LM head (not a submodule: never trained or saved).

    ``head(features)``: features float [..., d] = f_t (final-norm) -> logits float32 [K, ..., V];
    ``logits[i]`` predicts x_{t+2+i}. Features are cast to the head's dtype. With own LM heads
    (``config.lm_heads``) over a truncated vocabulary, logits outside ``token_map`` are -inf.
    """

    check_target = staticmethod(check_medusa_matches)

    def __init__(self, config: MedusaConfig, target=None):
        super().__init__()
        self.config = config
        d = config.hidden_size
        self.blocks = nn.ModuleList(nn.Sequential(*[ResBlock(d, config.fc_bias) for _ in range(config.num_layers)])
                                    for _ in range(config.num_heads))
        rows = config.head_vocab_size or config.vocab_size
        own = {"target": 0, "per_head": config.num_heads, "shared": 1}[config.lm_heads]
        self.own_lm_heads = nn.ModuleList(nn.Linear(d, rows, bias=False) for _ in range(own)) if own else None
        if rows < config.vocab_size:  # row -> target id; arange until a loader fills it (specviz.heads.formats)
            self.register_buffer("token_map", torch.arange(rows))
        else:
            self.token_map = None
        self._shared = None  # (embedding, LM head) of the target: SharedTargetMixin.attach
        self._stack_cache: dict[int, tuple] = {}  # ResBlock layer -> (weights' key, stacked W, stacked b)
        if target is not None:
            self.attach(target)

    def train(self, mode: bool = True) -> "MedusaHead":
        """Drop the stacked weights too: an in-place update may leave the weights' version key unchanged (a trainer on
        CUDA logged its first held-out evaluation's numbers at every later one; its fused AdamW is the suspect)."""
        self._stack_cache.clear()
        return super().train(mode)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """All K heads at once (the drafting path): each ResBlock layer of the K heads is one batched matmul and the
        target's LM head one GEMM over the K states, so a step issues a handful of kernels instead of about seven
        per head. Same math as :meth:`head_logits` (a batched matmul may round differently in 16-bit)."""
        self._check_features(features)
        K, d = self.config.num_heads, self.config.hidden_size
        x = features.to(self.dtype)
        h = x.reshape(1, -1, d).expand(K, -1, -1)  # [K, N, d]: every head reads the same f_t
        for j in range(self.config.num_layers):
            w, b = self._stacked_layer(j)
            y = torch.bmm(h, w.transpose(1, 2)) if b is None else torch.baddbmm(b, h, w.transpose(1, 2))
            h = h + F.silu(y)
        h = h.reshape(K, *x.shape[:-1], d)
        if self.own_lm_heads is None:
            z = self.lm_head(h.to(self.lm_head.weight.dtype))  # [K, ..., V]
        else:
            z = torch.stack([self._own_lm(i)(h[i].to(self._own_lm(i).weight.dtype)) for i in range(K)])
        return self._on_target_vocab(z).float()

    def _stacked_layer(self, j: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """ResBlock layer j's weights of the K heads stacked: W [K, d, d], b [K, 1, d] or None; kept in eval mode until
        a weight changes (a load, a move) or :meth:`train` is called, never kept in training mode."""
        linears = [blocks[j].linear for blocks in self.blocks]

        def stacked() -> tuple[torch.Tensor, torch.Tensor | None]:
            bias = None if linears[0].bias is None else torch.stack([lin.bias.detach() for lin in linears])[:, None]
            return torch.stack([lin.weight.detach() for lin in linears]), bias

        if self.training:  # weights move every step: stack afresh, keep nothing
            return stacked()
        key = tuple((lin.weight.data_ptr(), lin.weight._version) for lin in linears)
        if self._stack_cache.get(j, (None,))[0] != key:
            self._stack_cache[j] = (key, *stacked())
        return self._stack_cache[j][1], self._stack_cache[j][2]

    def _own_lm(self, i: int) -> nn.Module:
        return self.own_lm_heads[i if self.config.lm_heads == "per_head" else 0]

    def _on_target_vocab(self, z: torch.Tensor) -> torch.Tensor:
        """Logits over a truncated head vocabulary spread onto the target's (vLLM: -inf off ``token_map``)."""
        if self.token_map is None:
            return z
        full = z.new_full((*z.shape[:-1], self.config.vocab_size), float("-inf"))
        return full.index_copy(z.dim() - 1, self.token_map, z)

    def _check_features(self, features: torch.Tensor) -> None:
        if features.shape[-1] != self.config.hidden_size:
            raise ValueError(f"medusa head: features must be [..., {self.config.hidden_size}] (the final-norm f_t), "
                             f"got {tuple(features.shape)}")

    def head_logits(self, features: torch.Tensor, i: int) -> torch.Tensor:
        """Head i alone: features [..., d] -> logits [..., V] in the LM head's compute dtype (training
        scores one head at a time, so the K heads' logits never coexist in float32)."""
        self._check_features(features)
        lm = self.lm_head if self.own_lm_heads is None else self._own_lm(i)
        z = lm(self.blocks[i](features.to(self.dtype)).to(lm.weight.dtype))  # [..., V or V_trunc]
        return self._on_target_vocab(z)


def medusa_loss(head: MedusaHead, final: torch.Tensor, target_logits: torch.Tensor, decay: float = 0.8):
    """Soft-label Medusa loss on one batch (docs/design/methods.md 5.4 / 12; soft labels: decision Q4).

    final: [B, T, d] f_t of a window; target_logits: float [B, T, V] z_t (predicting x_{t+1}).
    Head i at row t is scored against softmax(z_{t+1+i}) (the target's distribution of x_{t+2+i});
    rows t >= T-1-i have no label and are dropped. Loss = sum_i decay^i * mean CE_i.
    Returns (loss fp32 scalar, {"ce": [K], "top1": [K]} detached: top1[i] = agreement of head i's
    argmax with the target's argmax at the label position)."""
    T = final.shape[1]
    K = head.config.num_heads
    if T < K + 2:
        raise ValueError(f"{K} Medusa heads need windows of at least {K + 2} positions, got T={T}")
    loss, ces, top1 = 0.0, [], []
    for i in range(K):  # head i, rows t = 0..T-2-i (predicting x_{t+2+i}), labels z_{t+1+i}
        lg, lab = head.head_logits(final[:, : T - 1 - i], i), target_logits[:, 1 + i :]
        ce = soft_cross_entropy(lg, lab).mean()
        loss = loss + decay**i * ce
        ces.append(ce.detach())
        top1.append((lg.argmax(-1) == lab.argmax(-1)).float().mean())
    return loss, {"ce": torch.stack(ces), "top1": torch.stack(top1)}


@torch.no_grad()
def medusa_agreement(head: MedusaHead, final: torch.Tensor, target_logits: torch.Tensor) -> dict[str, torch.Tensor]:
    """Held-out agreement per head: top1[i] (head i's argmax == the target's at the label position) and
    chain[i] (heads 0..i all agree: a teacher-free proxy of a greedy chain's per-position acceptance)."""
    T, K = final.shape[1], head.config.num_heads
    logits = head(final[:, : T - 1])  # [K, B, T-1, V]
    top1, chain, ces, agree_all = [], [], [], None
    for i in range(K):
        lg, lab = logits[i, :, : T - 1 - i], target_logits[:, 1 + i :]
        agree = lg.argmax(-1) == lab.argmax(-1)  # [B, T-1-i]
        agree_all = agree if agree_all is None else agree_all[:, : T - 1 - i] & agree
        top1.append(agree.float().mean())
        chain.append(agree_all.float().mean())
        ces.append(soft_cross_entropy(lg, lab).mean())
    return {"top1": torch.stack(top1), "chain": torch.stack(chain), "ce": torch.stack(ces)}


SPECVIZ_FORMAT = (MedusaConfig, MedusaHead, check_medusa_matches)  # specviz-head-v1 (specviz.heads.io)
