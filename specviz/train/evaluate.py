"""Held-out numbers for the model card: ``python -m specviz.train.evaluate --models assets/models
--out results/train/eval.json``.

Measured (CPU by default; the JSON records the machine):

* held-out loss (nats/token, fp32) of target and draft on the packed held-out stream cut into
  ``seq_len + 1`` windows as in training (all windows, or the first ``--heldout-windows``);
* for each of the fixed held-out prompts (:mod:`specviz.train.prompts`), greedy speculative
  decoding through :class:`specviz.SpecDecoder` with method ``draft_model`` (k = 4) and ``ngram``
  (engine defaults for the n-gram bounds): per prompt and pooled metrics; the pooled mean
  acceptance length is vLLM's ``1 + sum(accepted) / sum(drafting steps)`` over all prompts; the
  ``tokens_per_step`` figure counts every step, also those where the proposer drafted nothing;
* the fraction of the target's greedy continuations whose first complete statement parses
  (:mod:`specviz.train.statements`), next to the same check on the true source cut to the same
  number of tokens (a ceiling), and how many statements occur verbatim in the training corpus.

Greedy decoding is lossless, so both methods must return the target's greedy continuation: the
JSON counts the prompts where they differ (expected 0).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from typing import Callable

import torch
import torch.nn.functional as F

from specviz.train.corpus import build_corpus
from specviz.train.data import pack, windows
from specviz.train.prompts import DEFAULT_NUM_PROMPTS, Prompt, select_prompts
from specviz.train.statements import first_statement

METHODS = ("draft_model", "ngram")
COUNTERS = ("num_steps", "num_drafts", "num_draft_tokens", "num_accepted_tokens", "num_generated_tokens")


def model_heldout_loss(model_dir: str, heldout_texts: list[str], n_windows: int | None, seq_len: int,
                       device: str = "cpu") -> dict:
    """fp32 loss of one saved model on the first n_windows held-out windows (None = all), on ``device``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    dev = torch.device(device)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, use_safetensors=True).to(dev)
    docs = [tok(t, add_special_tokens=False, verbose=False)["input_ids"] for t in heldout_texts]
    w = windows(pack(docs, tok.eos_token_id), seq_len)[:n_windows].to(dev)  # [W, seq_len + 1]
    total = 0.0
    with torch.no_grad():  # fp32 on any device (no autocast): the card's numbers
        for chunk in w.split(4):
            logits = model(input_ids=chunk[:, :-1], use_cache=False).logits  # [b, T, V]
            total += float(F.cross_entropy(logits.float().flatten(0, 1), chunk[:, 1:].flatten())) * chunk.shape[0]
    loss = total / w.shape[0]
    return {"loss": loss, "windows": int(w.shape[0]), "seq_len": seq_len, "device": device}


def run_prompt(decoder, prompt: Prompt, max_new_tokens: int, k: int) -> dict:
    """Both methods on one prompt; the target's greedy continuation and its statement check."""
    row: dict = {"relpath": prompt.relpath, "def_line": prompt.def_line}
    outputs = {}
    for method in METHODS:
        t0 = time.time()
        tr = decoder.generate(prompt.text, method=method, num_speculative_tokens=k, temperature=0.0,
                              max_new_tokens=max_new_tokens, seed=0)
        row[method] = {c: tr.metrics[c] for c in COUNTERS}
        row[method]["mean_acceptance_length"] = tr.metrics["mean_acceptance_length"]
        row[method]["wall_s"] = round(time.time() - t0, 3)
        outputs[method] = (list(tr.output_token_ids), tr.stop_reason)
    ids, stop = outputs["draft_model"]
    row["outputs_identical"] = outputs["draft_model"][0] == outputs["ngram"][0]
    eos = set(decoder.eos_token_ids) if hasattr(decoder, "eos_token_ids") else {decoder.tokenizer.eos_token_id}
    while ids and ids[-1] in eos:
        ids = ids[:-1]
    row["continuation"] = decoder.tokenizer.decode(ids, skip_special_tokens=True)
    check = first_statement(prompt.header, row["continuation"], ended=stop == "eos")
    row["statement"], row["statement_text"], row["stop_reason"] = check.status, check.text, stop
    return row


def reference_statement(prompt: Prompt, source: str, tokenizer, max_new_tokens: int) -> str:
    """Statement status of the true continuation, cut to max_new_tokens tokens."""
    start = source.index(prompt.text) + len(prompt.text)
    ids = tokenizer(source[start:], add_special_tokens=False, verbose=False)["input_ids"][:max_new_tokens]
    return first_statement(prompt.header, tokenizer.decode(ids)).status


def pooled(rows: list[dict], method: str) -> dict:
    """Summed counters over prompts -> vLLM-style pooled metrics, plus the per-prompt mean."""
    tot = {c: sum(r[method][c] for r in rows) for c in COUNTERS}
    tot["mean_acceptance_length"] = 1 + tot["num_accepted_tokens"] / tot["num_drafts"] if tot["num_drafts"] else 1.0
    tot["draft_acceptance_rate"] = tot["num_accepted_tokens"] / tot["num_draft_tokens"] if tot["num_draft_tokens"] else 0.0
    tot["tokens_per_step"] = tot["num_generated_tokens"] / tot["num_steps"]
    tot["mean_of_prompt_mean_acceptance_length"] = sum(r[method]["mean_acceptance_length"] for r in rows) / len(rows)
    tot["wall_s"] = round(sum(r[method]["wall_s"] for r in rows), 2)
    return tot


def evaluate(models_dir: str, num_prompts: int = DEFAULT_NUM_PROMPTS, max_new_tokens: int = 256, k: int = 4,
             heldout_windows: int | None = None, device: str = "cpu", dtype: str = "float32",
             decoder_factory: Callable | None = None, corpus_limits: tuple = (None, None)) -> dict:
    """All numbers as one JSON-able dict (see module docstring). decoder_factory(target_dir,
    draft_dir, device, dtype) defaults to ``specviz.SpecDecoder.from_pretrained``. corpus_limits:
    (max train files, max held-out files), for tests. Raises ValueError if no prompt can be cut."""
    target_dir, draft_dir = os.path.join(models_dir, "specviz-target"), os.path.join(models_dir, "specviz-draft")
    corpus = build_corpus("transformers-5.17", *corpus_limits)
    seq_len = json.load(open(os.path.join(target_dir, "config.json")))["max_position_embeddings"]
    out: dict = {"machine": _machine(), "corpus": corpus.summary(),
                 "settings": {"num_prompts": num_prompts, "max_new_tokens": max_new_tokens,
                              "num_speculative_tokens": k, "temperature": 0.0, "device": device, "dtype": dtype,
                              "ngram_bounds": "engine defaults (prompt_lookup_min = max = 5, as vLLM)"}}
    texts = [f.text for f in corpus.heldout]
    out["heldout_loss"] = {n: model_heldout_loss(d, texts, heldout_windows, seq_len)
                           for n, d in (("target", target_dir), ("draft", draft_dir))}
    if decoder_factory is None:
        from specviz import SpecDecoder

        decoder_factory = SpecDecoder.from_pretrained
    t0 = time.time()
    decoder = decoder_factory(target_dir, draft_dir, device, dtype)
    out["decoder_load_s"] = round(time.time() - t0, 3)
    prompts = select_prompts(corpus.heldout, num_prompts)
    if not prompts:
        raise ValueError("the held-out files hold no function header to prompt with")
    sources = {f.relpath: f.text for f in corpus.heldout}
    rows = []
    for i, p in enumerate(prompts):
        rows.append(run_prompt(decoder, p, max_new_tokens, k))
        r = rows[-1]
        print(f"[{i + 1}/{len(prompts)}] {p.relpath}:{p.def_line} tau(draft_model)="
              f"{r['draft_model']['mean_acceptance_length']:.2f} statement={r['statement']}", file=sys.stderr)
    for p, r in zip(prompts, rows):
        r["reference_statement"] = reference_statement(p, sources[p.relpath], decoder.tokenizer, max_new_tokens)
    out["summary"] = _summary(rows, corpus)
    out["prompts"] = rows
    return out


def _summary(rows: list[dict], corpus) -> dict:
    train_text = "\n".join(f.text for f in corpus.train)
    n = len(rows)
    statuses = {s: sum(r["statement"] == s for r in rows) for s in ("parsed", "syntax_error", "incomplete", "no_body")}
    ref = {s: sum(r["reference_statement"] == s for r in rows) for s in ("parsed", "syntax_error", "incomplete", "no_body")}
    parsed = [r for r in rows if r["statement"] == "parsed"]
    return {
        "num_prompts": n,
        "draft_model": pooled(rows, "draft_model"),
        "ngram": pooled(rows, "ngram"),
        "outputs_differ": sum(not r["outputs_identical"] for r in rows),
        "statement_parse_fraction": statuses["parsed"] / n,
        "statement_status_counts": statuses,
        "reference_parse_fraction": ref["parsed"] / n,
        "reference_status_counts": ref,
        "parsed_statements_verbatim_in_train": sum(r["statement_text"] in train_text for r in parsed),
    }


def repeated_ngram_share(ids: list[int], n: int = 4) -> float | None:
    """Share of the n-grams of ``ids`` that repeat an earlier n-gram of the same sequence:
    1 - #distinct / #total (0 = no repetition; a loop of period p < len gives close to 1). None if len < n."""
    grams = [tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)]
    return 1 - len(set(grams)) / len(grams) if grams else None


def load_prompts(path: str) -> list[tuple[str, Prompt]]:
    """[(split, Prompt)] from a recipe's heldout_prompts.json (see :func:`specviz.train.recipe._write_prompts`)."""
    data = json.load(open(path))
    return [(r["split"], Prompt(r["relpath"], r["def_line"], r["text"], r["header"])) for r in data["prompts"]]


def bytes_normalised_loss(model_dir: str, manifest: str, n_windows: int | None, seq_len: int,
                          device: str = "cpu") -> dict:
    """fp32 CPU held-out loss of a saved model on a manifest's held-out split, per token and per byte (per byte
    is comparable across tokenizers: two families with different BPEs are compared on the same files)."""
    from transformers import AutoTokenizer

    corpus = build_corpus(manifest)
    texts = [f.text for f in corpus.heldout]
    res = model_heldout_loss(model_dir, texts, n_windows, seq_len, device)
    tok = AutoTokenizer.from_pretrained(model_dir)
    n_tokens = sum(len(tok(t, add_special_tokens=False, verbose=False)["input_ids"]) + 1 for t in texts)
    res["bytes_per_token"] = sum(len(t.encode()) for t in texts) / n_tokens
    res["nats_per_byte"] = res["loss"] / res["bytes_per_token"]
    res["manifest"], res["files"] = manifest, len(texts)
    return res


def evaluate_family(models_dir: str, prompts_file: str, k: int = 4, spec_tokens: int = 64, repetition_tokens: int = 256,
                    loss_manifest: str | None = "transformers-5.17", loss_windows: int | None = None,
                    device: str = "cpu", dtype: str = "float32", splits: tuple[str, ...] = ("heldout", "heldout_packages"),
                    limit: int | None = None) -> dict:
    """The model family's goal numbers (issue: model family v2), one JSON-able dict.

    Per split of ``prompts_file``: draft_model and ngram, greedy, k, ``spec_tokens`` new tokens (pooled vLLM
    metrics, tokens per step, outputs identical); the target's 256-token greedy continuation (method none) and
    its repeated-4-gram share (mean over prompts); plus the held-out loss on ``loss_manifest``'s held-out files
    in nats/token and nats/byte (the same files for every family)."""
    from specviz import SpecDecoder

    target_dir, draft_dir = os.path.join(models_dir, "specviz-target"), os.path.join(models_dir, "specviz-draft")
    seq_len = json.load(open(os.path.join(target_dir, "config.json")))["max_position_embeddings"]
    decoder = SpecDecoder.from_pretrained(target_dir, draft_dir, device=device, dtype=dtype)
    prompts = load_prompts(prompts_file)
    out: dict = {"machine": _machine(), "models": models_dir, "prompts_file": prompts_file,
                 "settings": {"num_speculative_tokens": k, "spec_new_tokens": spec_tokens,
                              "repetition_new_tokens": repetition_tokens, "temperature": 0.0, "device": device,
                              "dtype": dtype}, "splits": {}}
    for split in splits:
        chosen = [p for s, p in prompts if s == split][:limit]
        rows = []
        for i, p in enumerate(chosen):
            row = run_prompt(decoder, p, spec_tokens, k)
            tr = decoder.generate(p.text, method="none", temperature=0.0, max_new_tokens=repetition_tokens)
            row["repeated_4gram_share"] = repeated_ngram_share(list(tr.output_token_ids))
            row["repetition_continuation"] = tr.text
            rows.append(row)
            print(f"[{split} {i + 1}/{len(chosen)}] {p.relpath}:{p.def_line} "
                  f"tau={row['draft_model']['mean_acceptance_length']:.2f} rep4={row['repeated_4gram_share']}",
                  file=sys.stderr)
        shares = [r["repeated_4gram_share"] for r in rows if r["repeated_4gram_share"] is not None]
        out["splits"][split] = {
            "num_prompts": len(rows),
            "draft_model": pooled(rows, "draft_model") if rows else None,
            "ngram": pooled(rows, "ngram") if rows else None,
            "outputs_differ": sum(not r["outputs_identical"] for r in rows),
            "mean_repeated_4gram_share": sum(shares) / len(shares) if shares else None,
            "prompts": rows,
        }
    if loss_manifest:
        out["heldout_loss"] = {n: bytes_normalised_loss(d, loss_manifest, loss_windows, seq_len, device)
                               for n, d in (("target", target_dir), ("draft", draft_dir))}
    return out


def _machine() -> dict:
    return {"python": sys.version.split()[0], "torch": torch.__version__, "platform": platform.platform(),
            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads()}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m specviz.train.evaluate", description=__doc__.split("\n")[0])
    ap.add_argument("--models", required=True, help="directory holding specviz-target/ and specviz-draft/")
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--num-prompts", type=int, default=DEFAULT_NUM_PROMPTS)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    ap.add_argument("--heldout-windows", type=int, default=None, help="default: all")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--prompts", default=None, help="a recipe's heldout_prompts.json: evaluate the family's goals "
                    "(draft_model/ngram at --k over --spec-tokens, repetition over 256 tokens, per-byte loss)")
    ap.add_argument("--spec-tokens", type=int, default=64)
    ap.add_argument("--limit", type=int, default=None, help="at most this many prompts per split")
    a = ap.parse_args(argv)
    if a.prompts:
        res = evaluate_family(a.models, a.prompts, a.k, a.spec_tokens, a.max_new_tokens, device=a.device,
                              dtype=a.dtype, limit=a.limit)
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with open(a.out, "w") as fh:
            json.dump(res, fh, indent=1)
        print(json.dumps({sp: {k: v for k, v in r.items() if k != "prompts"} for sp, r in res["splits"].items()}, indent=1))
        print(json.dumps(res.get("heldout_loss")))
        return res
    res = evaluate(a.models, a.num_prompts, a.max_new_tokens, a.k, a.heldout_windows, a.device, a.dtype)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as fh:
        json.dump(res, fh, indent=1)
    print(json.dumps({k: v for k, v in res["summary"].items()}, indent=1))
    print(json.dumps(res["heldout_loss"]))
    return res


if __name__ == "__main__":
    main()
