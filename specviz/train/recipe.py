"""The whole recipe: corpus -> tokenizer -> token windows -> target + draft -> saved HF model dirs.

Output layout of ``run(out_dir, ...)``::

    out_dir/specviz-target/   config.json, generation_config.json, model*.safetensors (bf16,
                              shards <= 14 MB), tokenizer.json, tokenizer_config.json
    out_dir/specviz-draft/    the same files for the draft (identical tokenizer files)
    out_dir/train_log.json    metadata, phase timings, train and held-out losses
    out_dir/loss_curve.png    if matplotlib is installed

Determinism: the corpus, the tokenizer (BPE training is deterministic; the log records the sha256
of tokenizer.json), the weight init (``torch.manual_seed(seed)`` before the target,
``seed + 1`` before the draft, built on CPU) and the batch order are the same on every machine.
GPU kernels (bf16 autocast, SDPA backward) are not bitwise deterministic, so losses of two runs
agree closely, not exactly.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import sys
import time
import warnings

import torch
import transformers
from transformers import LlamaForCausalLM

from specviz.train.configs import PRESETS, TrainConfig, check_family, generation_config, llama_config, param_counts
from specviz.train.corpus import build_corpus
from specviz.train.data import pack, windows
from specviz.train.heads import train_heads
from specviz.train.loop import distill_loss, heldout_loss, lm_loss, train_models, train_single
from specviz.train.plot import plot_losses
from specviz.train.tokenizer import EOS_ID, encode_documents, train_bpe, wrap_hf

TARGET_DIR, DRAFT_DIR = "specviz-target", "specviz-draft"
SHARD_SIZE = "14MB"


def build_models(cfg: TrainConfig, seed: int) -> dict[str, LlamaForCausalLM]:
    """Freshly initialised fp32 target and draft on CPU (seeded: seed for the target, seed + 1 for
    the draft). Raises ValueError if the draft breaks the 1/4 non-embedding-parameter rule."""
    torch.manual_seed(seed)
    target = LlamaForCausalLM(llama_config(cfg.target, cfg.vocab_size, cfg.seq_len))
    torch.manual_seed(seed + 1)
    draft = LlamaForCausalLM(llama_config(cfg.draft, cfg.vocab_size, cfg.seq_len))
    check_family(param_counts(target), param_counts(draft))
    return {"target": target, "draft": draft}


def save_model(model: LlamaForCausalLM, hf_tokenizer, path: str, keep: bool = False) -> list[str]:
    """Save as a bf16 safetensors HF model dir with tokenizer and generation config.
    keep: save a bf16 CPU copy and leave ``model`` as it is (training goes on). Returns the saved file names."""
    if keep:
        import copy

        model = copy.deepcopy(model)
    model = model.to(device="cpu", dtype=torch.bfloat16)
    model.generation_config = generation_config()
    model.save_pretrained(path, max_shard_size=SHARD_SIZE)
    hf_tokenizer.save_pretrained(path)
    return sorted(os.listdir(path))


def environment(device: torch.device) -> dict:
    """Versions and device name for the log."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": name,
        "cpu_count": os.cpu_count(),
    }


def run(
    out_dir: str,
    preset: str = "demo",
    seed: int = 0,
    device: str | None = None,
    time_budget_s: float | None = None,
    compile: bool = False,
    steps: int | None = None,
    draft_steps: int | None = None,
    heads: bool = True,
) -> dict:
    """Run the recipe; returns the log dict also written to ``out_dir/train_log.json``.

    preset: a key of PRESETS. device: "cuda" / "cpu" / None (cuda if available).
    time_budget_s: v1 (side-by-side) presets: stop training after this many seconds; sequential presets use
    the preset's per-model budgets (a value here replaces the target's). steps / draft_steps: fix the step
    counts (reproduce a logged plan). compile: torch.compile the trained models. heads: then train every head
    registered in :mod:`specviz.train.heads` on the trained target.
    The target is saved as soon as it is trained, so a failure later loses nothing before it.
    Raises RuntimeError if the tokenizer fails to round-trip; CorpusError if the manifest cannot be honoured.
    """
    t_start, cfg = time.time(), PRESETS[preset]
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    os.makedirs(out_dir, exist_ok=True)
    log_path = os.path.join(out_dir, "train_log.json")
    meta = {"preset": preset, "seed": seed, "compile": compile, "time_budget_s": time_budget_s}
    meta.update(environment(dev), config=dataclasses.asdict(cfg), phases_s={})
    phase = _phase_timer(meta["phases_s"])

    corpus = build_corpus(cfg.manifest, cfg.max_train_files, cfg.max_heldout_files)
    meta["corpus"] = corpus.summary()
    phase("corpus")
    tok = train_bpe(tokenizer_sample(corpus, cfg.tokenizer_sample_bytes), cfg.vocab_size)
    hf_tok = wrap_hf(tok, cfg.seq_len)
    meta["tokenizer"] = {"vocab_size": tok.get_vocab_size(), "sha256": hashlib.sha256(tok.to_str().encode()).hexdigest(),
                         "sample_bytes": cfg.tokenizer_sample_bytes}
    phase("tokenizer")
    train_w, held_w, held_pkg_w = _encode(tok, corpus, cfg, meta)
    _write_prompts(corpus, os.path.join(out_dir, "heldout_prompts.json"))
    phase("encode")

    models = build_models(cfg, seed)
    meta["params"] = {n: param_counts(m) for n, m in models.items()}
    for m in models.values():
        m.to(dev)
    train_w, held_w = train_w.to(dev), held_w.to(dev)

    def write(log: dict) -> None:
        with open(log_path, "w") as fh:
            json.dump({**meta, **log}, fh, indent=1)

    meta["saved"] = {}
    if cfg.sequential:
        log = _train_sequential(models, hf_tok, cfg, seed, dev, train_w, held_w, compile, steps, draft_steps,
                                time_budget_s, out_dir, meta, write, phase)
    else:
        runners = {n: torch.compile(m) for n, m in models.items()} if compile else models
        lrs = {"target": cfg.lr, "draft": cfg.draft_lr}
        log = train_models(runners, lrs, train_w, held_w, cfg, seed, dev, time_budget_s, write, models)
        phase("train")
        for n, d in (("target", TARGET_DIR), ("draft", DRAFT_DIR)):
            meta["saved"][n] = save_model(models[n], hf_tok, os.path.join(out_dir, d))
    log["final_heldout"] = _final_losses(models, held_w, held_pkg_w, cfg, dev, meta)
    phase("final_eval")
    write(log)
    if heads and preset != "smoke":  # the smoke run stays seconds long; heads have their own --smoke test
        try:  # a head must never cost a finished LM
            log["heads"] = train_heads_on(models["target"], train_w, held_w, dev, out_dir)
        except Exception as exc:  # noqa: BLE001
            log["heads"] = {"error": repr(exc)}
            warnings.warn(f"head training failed: {exc!r}")
        phase("heads")
    try:  # a figure must never cost a finished training run
        meta["loss_curve"] = plot_losses(log, os.path.join(out_dir, "loss_curve.png")) is not None
    except Exception as exc:  # noqa: BLE001
        warnings.warn(f"loss curve not written: {exc!r}")
        meta["loss_curve"] = False
    meta["phases_s"]["total"] = round(time.time() - t_start, 2)
    write(log)
    return {**meta, **log}


def _train_sequential(models, hf_tok, cfg: TrainConfig, seed: int, dev, train_w, held_w, compile: bool,
                      steps, draft_steps, time_budget_s, out_dir: str, meta: dict, write, phase) -> dict:
    """v2: the target alone (corpus cross-entropy), saved; then the draft distilled from the trained target
    (its embedding initialised from the target's), saved. Each keeps its best held-out checkpoint."""
    target, draft = models["target"], models["draft"]
    log: dict = {}
    t_run = torch.compile(target) if compile else target
    budget = time_budget_s if time_budget_s is not None else cfg.target_time_budget_s
    log["target"] = train_single("target", t_run, lambda m, b: lm_loss(m, b, dev), cfg.lr, train_w, held_w, cfg,
                                 seed, dev, steps or cfg.steps, None if steps else budget,
                                 lambda lg: write({**log, "target": lg}), eval_model=target)
    phase("train_target")
    meta["saved"]["target"] = save_model(target, hf_tok, os.path.join(out_dir, TARGET_DIR), keep=True)
    write(log)
    target.eval()
    for p in target.parameters():
        p.requires_grad_(False)
    t_emb, d_emb = target.get_input_embeddings().weight, draft.get_input_embeddings().weight
    log["draft_embedding_init"] = "target" if t_emb.shape == d_emb.shape else "random (widths differ)"
    if t_emb.shape == d_emb.shape:
        with torch.no_grad():
            d_emb.copy_(t_emb)  # tied embeddings: the draft's LM head starts as the target's too
    d_run = torch.compile(draft) if compile else draft
    loss = lambda m, b: distill_loss(m, target, b, dev, cfg.distill_weight)  # noqa: E731
    n = draft_steps or cfg.draft_steps
    log["draft"] = train_single("draft", d_run, loss, cfg.draft_lr, train_w, held_w, cfg, seed + 1, dev, n,
                                None if draft_steps else cfg.draft_time_budget_s,
                                lambda lg: write({**log, "draft": lg}), eval_model=draft)
    for p in target.parameters():
        p.requires_grad_(True)
    phase("train_draft")
    meta["saved"]["draft"] = save_model(draft, hf_tok, os.path.join(out_dir, DRAFT_DIR), keep=True)
    # the shape train_models returns, for the plot and the card: both models' rows side by side
    log["heldout"] = log["target"]["heldout"] + log["draft"]["heldout"]
    log["train"] = log["target"]["train"] + log["draft"]["train"]
    log["steps"], log["tokens_seen"] = log["target"]["steps"], log["target"]["tokens_seen"]
    log["stopped_early"] = log["target"]["stopped_early"] or log["draft"]["stopped_early"]
    return log


def _final_losses(models, held_w, held_pkg_w, cfg: TrainConfig, dev, meta: dict) -> dict:
    """Held-out cross-entropy of the saved weights (nats/token and nats/byte) on both held-out splits."""
    out = {}
    for split, w in (("heldout", held_w), ("heldout_packages", held_pkg_w)):
        if w is None or w.shape[0] == 0:
            continue
        w = w.to(dev)
        bpt = meta["tokens"].get(f"{split}_bytes_per_token")
        for n, m in models.items():
            loss = heldout_loss(m, w, cfg.batch_size, dev)
            out[f"{split}_{n}"] = {"nats_per_token": round(loss, 5),
                                   "nats_per_byte": round(loss / bpt, 5) if bpt else None, "windows": int(w.shape[0])}
    return out


def train_heads_on(target, train_w, held_w, dev, out_dir: str) -> dict:
    """Every head registered in :mod:`specviz.train.heads`, trained on the frozen target and saved under
    ``out_dir``; returns {head name: log}."""
    return train_heads(target, train_w, held_w, dev, out_dir)


def tokenizer_sample(corpus, max_bytes: int | None) -> list[str]:
    """Texts the BPE is trained on: training files in sha256(relpath) order up to ``max_bytes`` (None = all)."""
    files = list(corpus.train)
    if max_bytes is None:
        return [f.text for f in files]
    files.sort(key=lambda f: hashlib.sha256(f.relpath.encode()).hexdigest())
    out, total = [], 0
    for f in files:
        size = len(f.text.encode())
        if total + size > max_bytes:
            continue
        out.append(f.text)
        total += size
    return out


def head_windows(tokenizer, preset: str = "demo") -> tuple[torch.Tensor, torch.Tensor]:
    """The recipe's token windows (CPU int64 [W, seq_len + 1]: train, in-corpus held-out) rebuilt for a
    trained family: the preset's corpus encoded with ``tokenizer`` (an HF tokenizer or a
    ``tokenizers.Tokenizer``), for training heads on a saved target without retraining it."""
    cfg = PRESETS[preset]
    tok = getattr(tokenizer, "backend_tokenizer", tokenizer)
    corpus = build_corpus(cfg.manifest, cfg.max_train_files, cfg.max_heldout_files)
    train_docs = encode_documents(tok, [f.text for f in corpus.train])
    held_docs = encode_documents(tok, [f.text for f in corpus.heldout])
    return windows(pack(train_docs, EOS_ID), cfg.seq_len), windows(pack(held_docs, EOS_ID), cfg.seq_len)[: cfg.eval_windows]


def _write_prompts(corpus, path: str, n: int = 40) -> None:
    """The fixed evaluation prompts of both held-out splits, as JSON (they come from packages that another
    machine may not have installed, so the evaluation can run elsewhere)."""
    from specviz.train.prompts import select_prompts

    rows = []
    for split in ("heldout", "heldout_packages"):
        for p in select_prompts(getattr(corpus, split), n):
            rows.append({"split": split, **dataclasses.asdict(p)})
    with open(path, "w") as fh:
        json.dump({"manifest": corpus.manifest.name if corpus.manifest else None, "prompts": rows}, fh, indent=1)


def _encode(tok, corpus, cfg: TrainConfig, meta: dict):
    """Token windows (CPU int64 [W, seq_len + 1]) of the train, held-out and held-out-package splits (the last
    None when empty); checks the held-out round trip; records token counts and bytes per token."""
    train_docs = encode_documents(tok, [f.text for f in corpus.train])
    held_docs = encode_documents(tok, [f.text for f in corpus.heldout])
    for f, ids in zip(corpus.heldout, held_docs):
        if tok.decode(ids, skip_special_tokens=False) != f.text:
            raise RuntimeError(f"tokenizer does not round-trip {f.relpath}")
    train_w = windows(pack(train_docs, EOS_ID), cfg.seq_len)
    held_w = windows(pack(held_docs, EOS_ID), cfg.seq_len)[: cfg.eval_windows]
    pkg_docs = encode_documents(tok, [f.text for f in corpus.heldout_packages])
    pkg_tokens = sum(len(d) + 1 for d in pkg_docs)
    held_pkg_w = windows(pack(pkg_docs, EOS_ID), cfg.seq_len)[: cfg.eval_windows] if pkg_tokens > cfg.seq_len else None
    meta["tokens"] = {
        "train": sum(len(d) + 1 for d in train_docs),
        "heldout": sum(len(d) + 1 for d in held_docs),
        "heldout_packages": pkg_tokens,
        "train_windows": train_w.shape[0],
        "heldout_windows_evaluated": held_w.shape[0],
        "heldout_bytes_per_token": _bytes_per_token(corpus.heldout, held_docs),
        "heldout_packages_bytes_per_token": _bytes_per_token(corpus.heldout_packages, pkg_docs),
    }
    return train_w, held_w, held_pkg_w


def _bytes_per_token(files, docs) -> float | None:
    tokens = sum(len(d) + 1 for d in docs)
    return round(sum(len(f.text.encode()) for f in files) / tokens, 5) if tokens else None


def _phase_timer(store: dict):
    last = [time.time()]

    def mark(name: str) -> None:
        now = time.time()
        store[name] = round(now - last[0], 2)
        last[0] = now

    return mark
