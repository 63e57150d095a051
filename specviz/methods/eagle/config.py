"""The frozen config of an EAGLE / EAGLE-3 head, saved as ``config.json`` beside its safetensors.

A head's shape is derived from its target (:func:`head_config_from_target`): the head works in
the target's hidden size d (it reads the target's embedding and feeds the target's LM head),
uses the target's attention shape (heads, KV heads, head_dim), SwiGLU width, RMSNorm eps and RoPE.
The config also records which target features the head consumes:

* ``eagle``  (EAGLE-1, Li et al. 2024, arXiv 2401.15077): ``aux_layer_ids = ()``; the feature is
  f_t, the target's final hidden state **after** the final RMSNorm (HF
  ``model.model(...).last_hidden_state``). Feature width F = d.
* ``eagle3`` (EAGLE-3, Li et al. 2025, arXiv 2503.01840): ``aux_layer_ids = (2, L//2, L-3)`` by
  default (vLLM's default, EAGLE ``modeling_llama_kv.py``); tap l is HF ``hidden_states[l]`` = the
  **input** of decoder layer l (residual stream, un-normed; 0 = embedding output). Feature width
  F = 3d, the taps concatenated in the order of ``aux_layer_ids``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from transformers import LlamaConfig

from specviz.heads.common import JsonConfig

EAGLE1, EAGLE3 = "eagle", "eagle3"  # the two methods' names, the kinds of their heads (the only place named)
KINDS = (EAGLE1, EAGLE3)


@dataclass(frozen=True)
class HeadConfig(JsonConfig):
    """Shape of one head. All sizes are the target's unless stated.

    kind:                     "eagle" (EAGLE-1) or "eagle3" (EAGLE-3).
    hidden_size:              d (must equal the target's hidden size).
    vocab_size:               V (must equal the target's; the full vocab, no EAGLE-3 d2t map).
    num_attention_heads, num_key_value_heads, head_dim: the head's one attention layer.
    intermediate_size:        SwiGLU width of the head's MLP.
    rms_norm_eps, rope_parameters, max_position_embeddings: as the target's LlamaConfig.
    target_num_hidden_layers: L of the target the head was built for.
    aux_layer_ids:            EAGLE-3 taps (HF ``hidden_states`` indices, each in [0, L)); () for EAGLE-1.
    fc_bias:                  bias of the fusion fc (EAGLE-1 reference: True; EAGLE-3: False).

    Published layouts (:mod:`specviz.heads.formats`) also set:

    draft_vocab_size:         rows V_d of the head's OWN LM head (EAGLE-3 as published); None: the
                              target's LM head (specviz's trained heads). V_d < V needs ``draft_to_target``
                              (absolute target ids, a buffer of the head): logits outside it are -inf.
    own_embedding:            the head keeps its own input embedding [V, d] (a published head whose copy
                              differs from the target's); False: the target's, shared.
    qkv_bias, o_bias:         biases of the attention projections (SafeAILab ``qkv_bias``).
    norm_before_residual:     EAGLE-3: the residual is hidden_norm(h), not h (speculators / vLLM flag).
    fc_norm:                  EAGLE-3: one RMSNorm per tap before fc (SpecForge / speculators ``fc_norm``).
    norm_before_fc:           EAGLE-3: one RMSNorm over the concatenated taps before fc (speculators).
    norm_logits:              EAGLE-3: ``norm`` before the LM head (SafeAILab always; SpecForge ``norm_output``).
    feed_normed:              EAGLE-3: the fed-back hidden is norm(h), and the logits read it (speculators /
                              vLLM ``norm_output``, "EAGLE 3.1"); False: the pre-norm h.
    """

    LABEL: ClassVar[str] = "head"

    kind: str
    hidden_size: int
    vocab_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    max_position_embeddings: int
    target_num_hidden_layers: int
    aux_layer_ids: tuple[int, ...] = ()
    fc_bias: bool = True
    rope_parameters: dict = field(default_factory=lambda: {"rope_type": "default", "rope_theta": 10000.0})
    draft_vocab_size: int | None = None
    own_embedding: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    norm_before_residual: bool = False
    fc_norm: bool = False
    norm_before_fc: bool = False
    norm_logits: bool = True
    feed_normed: bool = False

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"head kind {self.kind!r} is not one of {KINDS}")
        if self.kind == EAGLE1:
            eagle3_only = [name for name in ("draft_vocab_size", "norm_before_residual", "fc_norm", "norm_before_fc",
                                             "feed_normed") if getattr(self, name)]
            if eagle3_only or not self.norm_logits:
                raise ValueError(f"an eagle (EAGLE-1) head has no own LM head or EAGLE-3 norms; got "
                                 f"{eagle3_only or ['norm_logits=False']}")
        if self.fc_norm and self.norm_before_fc:
            raise ValueError("fc_norm (a norm per tap) and norm_before_fc (one norm over all taps) exclude each other")
        if self.draft_vocab_size is not None and not 1 <= self.draft_vocab_size <= self.vocab_size:
            raise ValueError(f"draft_vocab_size {self.draft_vocab_size} must be in [1, vocab_size={self.vocab_size}]")
        object.__setattr__(self, "aux_layer_ids", tuple(int(i) for i in self.aux_layer_ids))
        if self.kind == EAGLE3 and len(self.aux_layer_ids) < 1:
            raise ValueError("an eagle3 head needs aux_layer_ids (e.g. (2, L//2, L-3))")
        if self.kind == EAGLE1 and self.aux_layer_ids:
            raise ValueError("an eagle (EAGLE-1) head reads the final-norm feature; give aux_layer_ids=()")

    @property
    def feature_size(self) -> int:
        """F: width of the target features of a first pass (d for eagle, len(aux)*d for eagle3)."""
        return self.hidden_size * max(1, len(self.aux_layer_ids))

    @property
    def taps(self) -> tuple:
        """The target features a runner must return for this head, named as in
        :mod:`specviz.methods.eagle.extract`: ("final",) for eagle (the final-norm output f_t), the aux layer
        ids for eagle3 (HF ``hidden_states[l]`` = the input of decoder layer l), concatenated in order."""
        return ("final",) if self.kind == EAGLE1 else self.aux_layer_ids

    def layer_config(self) -> LlamaConfig:
        """The one-layer LlamaConfig the head's transformers modules are built from (SDPA attention)."""
        cfg = LlamaConfig(
            vocab_size=self.vocab_size, hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
            num_hidden_layers=1, num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads, head_dim=self.head_dim, rms_norm_eps=self.rms_norm_eps,
            max_position_embeddings=self.max_position_embeddings, rope_parameters=dict(self.rope_parameters),
            attention_bias=False, mlp_bias=False, attention_dropout=0.0,
        )
        cfg._attn_implementation = "sdpa"
        return cfg

def default_aux_layer_ids(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3 / vLLM default taps (2, L//2, L-3) for a target of L decoder layers, kept as is
    (repeats included) for L >= 4. For L < 4 (tiny test targets only) each id is clamped into
    [0, L): a specviz choice, vLLM has no rule there. Raises ValueError for L < 1."""
    if num_layers < 1:
        raise ValueError(f"a target needs >= 1 decoder layer for EAGLE-3 taps, got L={num_layers}")
    return tuple(min(max(i, 0), num_layers - 1) for i in (2, num_layers // 2, num_layers - 3))


def head_config_from_target(target_config, kind: str, aux_layer_ids: tuple[int, ...] | None = None,
                            intermediate_size: int | None = None) -> HeadConfig:
    """The head config for a transformers Llama-like target config (``target.config``).

    kind: "eagle" or "eagle3". aux_layer_ids: EAGLE-3 taps (default (2, L//2, L-3)).
    intermediate_size: the head's SwiGLU width (default the target's).
    Raises ValueError for an unknown kind or taps out of range."""
    c = target_config
    L = c.num_hidden_layers
    if kind == EAGLE3:
        aux = tuple(aux_layer_ids) if aux_layer_ids is not None else default_aux_layer_ids(L)
    else:
        aux = ()
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    rope = dict(getattr(c, "rope_parameters", None) or {"rope_type": "default", "rope_theta": 10000.0})
    cfg = HeadConfig(
        kind=kind, hidden_size=c.hidden_size, vocab_size=c.vocab_size,
        num_attention_heads=c.num_attention_heads,
        num_key_value_heads=getattr(c, "num_key_value_heads", None) or c.num_attention_heads,
        head_dim=head_dim, intermediate_size=intermediate_size or c.intermediate_size,
        rms_norm_eps=c.rms_norm_eps, max_position_embeddings=c.max_position_embeddings,
        target_num_hidden_layers=L, aux_layer_ids=aux, fc_bias=(kind == EAGLE1), rope_parameters=rope,
    )
    check_matches_target(cfg, target_config)
    return cfg


def check_matches_target(cfg: HeadConfig, target_config) -> None:
    """Raise ValueError (saying what differs) unless the head can run on this target: same hidden
    size, vocab and number of layers, and every aux layer id in [0, L)."""
    c = target_config
    problems = []
    if cfg.hidden_size != c.hidden_size:
        problems.append(f"hidden size {cfg.hidden_size} != target's {c.hidden_size}")
    if cfg.vocab_size != c.vocab_size:
        problems.append(f"vocab size {cfg.vocab_size} != target's {c.vocab_size}")
    if cfg.target_num_hidden_layers != c.num_hidden_layers:
        problems.append(f"built for a target of {cfg.target_num_hidden_layers} layers, this one has "
                        f"{c.num_hidden_layers}")
    bad = [i for i in cfg.aux_layer_ids if not 0 <= i < c.num_hidden_layers]
    if bad:
        problems.append(f"aux layer ids {bad} out of range [0, {c.num_hidden_layers})")
    if problems:
        raise ValueError(f"{cfg.kind} head does not match the target: " + "; ".join(problems)
                         + ". Use a head trained for this target (specviz train heads --target DIR).")
