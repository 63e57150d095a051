"""Model shapes and training hyper-parameters of the recipe presets.

``demo`` is the bundled family v2 (trained on one H200): a deep-thin target (20 layers at width 256, GQA 4/2;
depth over width, as MobileLLM, Liu et al. 2024, found for sub-billion models) and a 1-layer draft, so that on
a GPU one draft forward costs a small fraction of a target forward. ``v1`` is the first family (8 x 384 target,
4 x 256 draft, transformers corpus), kept to reproduce the old numbers. ``smoke`` is a seconds-long CPU run
for CI. The target and draft share the tokenizer (same vocab, bos/eos/pad ids) and are plain
``LlamaForCausalLM`` models built from a ``LlamaConfig`` (no custom code), with tied input/output
embeddings. The draft must have at most a quarter of the target's non-embedding parameters
(:func:`check_family` enforces it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from transformers import GenerationConfig, LlamaConfig

from specviz.train.tokenizer import EOS_ID, PAD_ID


@dataclass(frozen=True)
class ModelSpec:
    """Shape of one Llama model. d_model = hidden size; d_ff = SwiGLU intermediate size; n_kv_heads: key/value
    heads (GQA; None = n_heads, i.e. MHA)."""

    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int
    n_kv_heads: int | None = None


@dataclass(frozen=True)
class OptimizerConfig:
    """The optimizer of a head's training run: AdamW (``betas``, ``weight_decay``) at peak ``lr`` after
    ``warmup_steps`` of linear warm-up, cosine to ``min_lr_ratio * lr`` at ``steps``; gradients clipped to
    ``grad_clip``; ``batch_size`` windows per step. The head trainers extend it."""

    batch_size: int = 32
    steps: int = 6000
    lr: float = 1e-3
    warmup_steps: int = 150
    min_lr_ratio: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.0
    grad_clip: float = 1.0


@dataclass(frozen=True)
class TrainConfig:
    """Everything a recipe run depends on besides the seed and the device.

    vocab_size:      BPE vocabulary incl. 256 bytes and 2 special tokens.
    seq_len:         training window length in tokens (also the models' max_position_embeddings).
    batch_size:      windows per step (both models see the same batch).
    steps:           optimizer steps (fixed: the run is defined by its step count, not by time).
    lr / draft_lr:   peak AdamW learning rates; linear warmup over warmup_steps, then cosine to
                     min_lr_ratio * peak at the last step.
    eval_every:      steps between held-out evaluations (also evaluated at the last step).
    eval_windows:    at most this many held-out windows per evaluation (fixed: the first ones).
    max_*_files:     corpus truncation (None = whole corpus); smoke uses a handful.
    manifest:        the corpus manifest (specviz/train/manifests/<name>.json).
    tokenizer_sample_bytes: train the BPE on the first files (sha256(relpath) order) up to this many bytes
                     (None = every training file).
    target_time_budget_s / draft_time_budget_s: the planned wall time of each model's training; after
                     ``plan_after`` steps the step count is fixed to min(steps, what fits the budget) and the
                     LR schedule follows it (the log records the plan; pass ``steps`` to reproduce it).
    draft_steps:     optimizer steps of the draft's distillation (after the target is trained).
    distill_weight:  draft loss = w * soft cross-entropy against the trained target's distribution (T = 1;
                     DistillSpec, Zhou et al. 2024) + (1 - w) * cross-entropy on the corpus tokens.
    """

    vocab_size: int
    seq_len: int
    target: ModelSpec
    draft: ModelSpec
    batch_size: int
    steps: int
    lr: float
    draft_lr: float
    warmup_steps: int
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    eval_every: int = 100
    eval_windows: int = 256
    max_train_files: int | None = None
    max_heldout_files: int | None = None
    log_every: int = 10
    manifest: str = "transformers-5.17"
    tokenizer_sample_bytes: int | None = None
    target_time_budget_s: float | None = None
    draft_time_budget_s: float | None = None
    plan_after: int = 30
    draft_steps: int = 0
    distill_weight: float = 1.0
    max_epochs: float | None = None  # sequential presets: at most this many passes over the training windows
    sequential: bool = False  # v2: target first, then the draft distilled from it; v1: side by side
    extra: dict = field(default_factory=dict)


PRESETS: dict[str, TrainConfig] = {
    "demo": TrainConfig(
        vocab_size=8192,
        seq_len=1024,
        target=ModelSpec(d_model=256, n_layers=20, n_heads=4, d_ff=704, n_kv_heads=2),
        draft=ModelSpec(d_model=256, n_layers=1, n_heads=4, d_ff=704, n_kv_heads=2),
        batch_size=64,
        steps=4000,
        lr=1.5e-3,
        draft_lr=2e-3,
        warmup_steps=200,
        eval_every=250,
        eval_windows=512,
        manifest="code-v2.lock",
        tokenizer_sample_bytes=80_000_000,
        target_time_budget_s=285.0,
        draft_time_budget_s=95.0,
        draft_steps=3000,
        distill_weight=1.0,
        max_epochs=2.5,
        sequential=True,
    ),
    "v1": TrainConfig(
        vocab_size=8192,
        seq_len=1024,
        target=ModelSpec(d_model=384, n_layers=8, n_heads=6, d_ff=1024),
        draft=ModelSpec(d_model=256, n_layers=4, n_heads=4, d_ff=768),
        batch_size=64,
        steps=2400,
        lr=2e-3,
        draft_lr=2e-3,
        warmup_steps=200,
        eval_every=200,
        eval_windows=1024,
    ),
    "smoke": TrainConfig(
        vocab_size=512,
        seq_len=64,
        target=ModelSpec(d_model=64, n_layers=2, n_heads=2, d_ff=128),
        draft=ModelSpec(d_model=32, n_layers=1, n_heads=1, d_ff=64),
        batch_size=8,
        steps=12,
        lr=3e-3,
        draft_lr=3e-3,
        warmup_steps=2,
        eval_every=6,
        eval_windows=8,
        max_train_files=6,
        max_heldout_files=8,
        log_every=2,
        manifest="smoke",
        draft_steps=8,
        sequential=True,
    ),
}


def llama_config(spec: ModelSpec, vocab_size: int, seq_len: int) -> LlamaConfig:
    """The LlamaConfig for one model: MHA or GQA, SwiGLU, RMSNorm, RoPE theta 1e4, tied embeddings,
    bos = eos = <|endoftext|> (id 0), pad = <|pad|> (id 1)."""
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=spec.d_model,
        intermediate_size=spec.d_ff,
        num_hidden_layers=spec.n_layers,
        num_attention_heads=spec.n_heads,
        num_key_value_heads=spec.n_kv_heads or spec.n_heads,
        max_position_embeddings=seq_len,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True,
        bos_token_id=EOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        initializer_range=0.02,
    )


def generation_config() -> GenerationConfig:
    """Greedy by default; the same ids as the model configs."""
    return GenerationConfig(bos_token_id=EOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID, do_sample=False)


def param_counts(model) -> dict[str, int]:
    """{"total": unique parameters (tied weights once), "embedding": input embedding (and an untied
    lm_head), "non_embedding": total - embedding}."""
    seen, total, emb = set(), 0, 0
    emb_ids = {id(model.get_input_embeddings().weight), id(model.get_output_embeddings().weight)}
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel()
        emb += p.numel() if id(p) in emb_ids else 0
    return {"total": total, "embedding": emb, "non_embedding": total - emb}


def check_family(target_counts: dict[str, int], draft_counts: dict[str, int]) -> None:
    """Raise ValueError unless draft non-embedding params <= target non-embedding params / 4."""
    if 4 * draft_counts["non_embedding"] > target_counts["non_embedding"]:
        raise ValueError(f"draft too large: {draft_counts} vs target {target_counts}")
