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
from specviz.train.loop import train_models
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


def save_model(model: LlamaForCausalLM, hf_tokenizer, path: str) -> list[str]:
    """Save as a bf16 safetensors HF model dir with tokenizer and generation config.
    Returns the saved file names."""
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
) -> dict:
    """Run the recipe; returns the log dict also written to ``out_dir/train_log.json``.

    preset: a key of PRESETS. device: "cuda" / "cpu" / None (cuda if available).
    time_budget_s: stop training (not tokenisation or saving) after this many seconds.
    compile: wrap both models in torch.compile for training.
    Raises RuntimeError if transformers is not 5.17.0 or the tokenizer fails to round-trip.
    """
    t_start, cfg = time.time(), PRESETS[preset]
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    os.makedirs(out_dir, exist_ok=True)
    log_path = os.path.join(out_dir, "train_log.json")
    meta = {"preset": preset, "seed": seed, "compile": compile, "time_budget_s": time_budget_s}
    meta.update(environment(dev), config=dataclasses.asdict(cfg), phases_s={})
    phase = _phase_timer(meta["phases_s"])

    corpus = build_corpus(cfg.max_train_files, cfg.max_heldout_files)
    meta["corpus"] = corpus.summary()
    phase("corpus")
    tok = train_bpe([f.text for f in corpus.train], cfg.vocab_size)
    hf_tok = wrap_hf(tok, cfg.seq_len)
    meta["tokenizer"] = {"vocab_size": tok.get_vocab_size(), "sha256": hashlib.sha256(tok.to_str().encode()).hexdigest()}
    phase("tokenizer")
    train_w, held_w = _encode(tok, corpus, cfg, meta)
    phase("encode")

    models = build_models(cfg, seed)
    meta["params"] = {n: param_counts(m) for n, m in models.items()}
    for m in models.values():
        m.to(dev)
    train_w, held_w = train_w.to(dev), held_w.to(dev)
    runners = {n: torch.compile(m) for n, m in models.items()} if compile else models
    lrs = {"target": cfg.lr, "draft": cfg.draft_lr}

    def write(log: dict) -> None:
        with open(log_path, "w") as fh:
            json.dump({**meta, **log}, fh, indent=1)

    log = train_models(runners, lrs, train_w, held_w, cfg, seed, dev, time_budget_s, write, models)
    phase("train")
    log["heads"] = train_heads(models["target"], train_w, held_w, dev, out_dir, heads=() if preset == "smoke" else None)
    meta["saved"] = {n: save_model(m, hf_tok, os.path.join(out_dir, d)) for n, m, d in
                     (("target", models["target"], TARGET_DIR), ("draft", models["draft"], DRAFT_DIR))}
    phase("save")
    try:  # a figure must never cost a finished training run
        meta["loss_curve"] = plot_losses(log, os.path.join(out_dir, "loss_curve.png")) is not None
    except Exception as exc:  # noqa: BLE001
        warnings.warn(f"loss curve not written: {exc!r}")
        meta["loss_curve"] = False
    meta["phases_s"]["total"] = round(time.time() - t_start, 2)
    write(log)
    return {**meta, **log}


def _encode(tok, corpus, cfg: TrainConfig, meta: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Token windows of both splits (CPU int64 [W, seq_len + 1]); checks the held-out round trip."""
    train_docs = encode_documents(tok, [f.text for f in corpus.train])
    held_docs = encode_documents(tok, [f.text for f in corpus.heldout])
    for f, ids in zip(corpus.heldout, held_docs):
        if tok.decode(ids, skip_special_tokens=False) != f.text:
            raise RuntimeError(f"tokenizer does not round-trip {f.relpath}")
    train_w = windows(pack(train_docs, EOS_ID), cfg.seq_len)
    held_w = windows(pack(held_docs, EOS_ID), cfg.seq_len)[: cfg.eval_windows]
    meta["tokens"] = {
        "train": sum(len(d) + 1 for d in train_docs),
        "heldout": sum(len(d) + 1 for d in held_docs),
        "train_windows": train_w.shape[0],
        "heldout_windows_evaluated": held_w.shape[0],
    }
    return train_w, held_w


def _phase_timer(store: dict):
    last = [time.time()]

    def mark(name: str) -> None:
        now = time.time()
        store[name] = round(now - last[0], 2)
        last[0] = now

    return mark
