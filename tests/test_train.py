"""The training recipe: corpus, tokenizer, data order, smoke run end to end, the head hooks, the evaluation helpers,
and the bundled demo models when they are present."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import specviz.methods.eagle.train as eagle_train  # noqa: E402
import specviz.methods.medusa.train as medusa_train  # noqa: E402
from specviz.train import configs, corpus, data, heads, loop, prompts, statements  # noqa: E402
from specviz.train.tokenizer import EOS_ID, PAD_ID, encode_documents, train_bpe, wrap_hf  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BUNDLED = ROOT / "assets" / "models"
# The v1 family's corpus (transformers 5.17.0, every .py file): the same 2,531 / 150 files and bytes on this
# machine, CI and the H200 (assets/models/README.md, "v1"); relpaths carry the "transformers/" prefix since v2.
V1_TRAIN_BYTES, V1_HELDOUT_BYTES = 46_223_778, 2_818_154
TOKENIZER_SHA256 = "b0f55781771dfe8a4f26299b882bc0de340b0404ac931e4c3b26d074bae66963"  # family v2 (model card)


@pytest.fixture(scope="module")
def full_corpus():
    return corpus.build_corpus("transformers-5.17")


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    from specviz.train.recipe import run

    out = tmp_path_factory.mktemp("smoke")
    t0 = time.time()
    log = run(str(out), preset="smoke", seed=0, device="cpu")
    print(f"smoke recipe: {time.time() - t0:.1f} s")
    return out, log


# ---- corpus -------------------------------------------------------------------------------
def test_v1_corpus_manifest_reproduces_the_v1_split(full_corpus):
    s = full_corpus.summary()
    assert (s["train_files"], s["heldout_files"]) == (2531, 150)
    assert (s["train_bytes"], s["heldout_bytes"]) == (V1_TRAIN_BYTES, V1_HELDOUT_BYTES)
    assert s["sources"]["resolved"] == {"transformers": "5.17.0"}
    m = full_corpus.manifest
    assert all(corpus.split_of(f.relpath, f.package, m) == "heldout" for f in full_corpus.heldout)
    assert not any(corpus.split_of(f.relpath, f.package, m) != "train" for f in full_corpus.train)
    rels = [f.relpath for f in full_corpus.train]
    assert rels == sorted(rels) and all(r.startswith("transformers/") for r in rels)


def test_strict_manifest_refuses_another_version_and_missing_packages(monkeypatch):
    real = corpus.importlib.metadata.distribution

    class Other:
        def __init__(self, d):
            self.d, self.version = d, "5.24.0"

        def __getattr__(self, name):
            return getattr(self.d, name)

    monkeypatch.setattr(corpus.importlib.metadata, "distribution", lambda name: Other(real(name)))
    with pytest.raises(corpus.CorpusError, match="5.17.0"):
        corpus.build_corpus("transformers-5.17", 1, 1)
    monkeypatch.undo()
    with pytest.raises(corpus.CorpusError, match="not installed"):
        corpus.build_corpus(corpus.Manifest(name="x", packages=("no-such-package-xyz",)))
    lax = corpus.build_corpus(corpus.Manifest(name="x", packages=("no-such-package-xyz", "transformers==1.0"),
                                              strict=False))
    assert lax.sources["skipped"] == {"no-such-package-xyz": "not installed",
                                      "transformers": "pinned 1.0, found 5.17.0"}
    assert not lax.train


def test_manifest_filter_dedup_package_holdout_and_cap(tmp_path, monkeypatch):
    files = {"pkga/a.py": "x = 1\n" * 6, "pkga/dup.py": "x = 1\n" * 6, "pkga/long.py": "y = '" + "z" * 600 + "'\n" * 6,
             "pkga/tests/t.py": "assert 1\n" * 6, "pkga/short.py": "x = 2\n", "pkgb/b.py": "b = 3\n" * 6,
             "pkga/big.py": "w = 4\n" * 50}
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)

    def fake(name):
        rels = sorted(r for r in files if r.startswith(name + "/"))
        return "1.0", [(r, tmp_path / r) for r in rels]

    monkeypatch.setattr(corpus, "_distribution_files", fake)
    m = corpus.Manifest(name="t", packages=("pkga==1.0", "pkgb"), heldout_packages=("pkgb",), heldout_modulus=1000,
                        max_package_bytes=50)
    c = corpus.build_corpus(m)
    assert [f.relpath for f in c.train] == ["pkga/a.py"]  # big.py over the cap; dup/long/tests/short filtered
    assert [f.relpath for f in c.heldout_packages] == ["pkgb/b.py"]
    assert c.sources["counts"] == {"listed": 7, "filtered_out": 3, "duplicates": 1, "over_package_cap": 1}
    assert c.sources["resolved"] == {"pkga": "1.0", "pkgb": "1.0"}


# ---- tokenizer ----------------------------------------------------------------------------
def test_tokenizer_round_trips_source_and_special_strings(full_corpus):
    tok = train_bpe([f.text for f in full_corpus.train[:6]], vocab_size=600)
    assert tok.get_vocab_size() == 600
    assert (tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|pad|>")) == (EOS_ID, PAD_ID)
    texts = [f.text for f in full_corpus.heldout[:10]] + ['s = "<|endoftext|>\\t<|pad|>"\n\tx = "é😀"\r\n']
    for text, ids in zip(texts, encode_documents(tok, texts)):
        assert EOS_ID not in ids and PAD_ID not in ids
        assert tok.decode(ids) == text
    hf = wrap_hf(tok, model_max_length=64)
    ids = hf("def f():")["input_ids"]
    assert ids[0] == EOS_ID and hf.decode(ids, skip_special_tokens=True) == "def f():"
    assert (hf.bos_token_id, hf.eos_token_id, hf.pad_token_id) == (EOS_ID, EOS_ID, PAD_ID)


# ---- data order and schedule -----------------------------------------------------------------
def test_pack_windows_and_batch_order():
    stream = data.pack([[5, 6, 7], [8, 9]], eos_id=0)
    assert stream.tolist() == [0, 5, 6, 7, 0, 8, 9]
    w = data.windows(stream, seq_len=3)  # [2, 4], windows share one token
    assert w.tolist() == [[0, 5, 6, 7], [7, 0, 8, 9]]
    with pytest.raises(ValueError):
        data.windows(stream, seq_len=7)
    order = data.BatchOrder(n_windows=10, batch_size=4, seed=3)
    first_epoch = torch.cat([order.indices(s) for s in range(2)]).tolist() + order.indices(2).tolist()[:2]
    assert sorted(first_epoch) == list(range(10))  # every window once per epoch
    again = data.BatchOrder(10, 4, seed=3)
    assert [again.indices(s).tolist() for s in range(5)] == [order.indices(s).tolist() for s in range(5)]
    assert data.BatchOrder(10, 4, seed=4).indices(0).tolist() != order.indices(0).tolist()


def test_lr_schedule_warmup_then_cosine_to_floor():
    cfg = configs.PRESETS["demo"]
    f = loop.lr_lambda(cfg)
    assert f(0) == pytest.approx(1 / cfg.warmup_steps)
    assert f(cfg.warmup_steps - 1) == pytest.approx(1.0)
    assert f(cfg.warmup_steps) == pytest.approx(1.0)
    assert f(cfg.steps) == pytest.approx(cfg.min_lr_ratio)
    mid = cfg.warmup_steps + (cfg.steps - cfg.warmup_steps) // 2
    assert f(mid) == pytest.approx(cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) / 2, abs=1e-3)


def test_demo_family_sizes():
    cfg = configs.PRESETS["demo"]
    from transformers import LlamaForCausalLM

    t = configs.param_counts(LlamaForCausalLM(configs.llama_config(cfg.target, cfg.vocab_size, cfg.seq_len)))
    d = configs.param_counts(LlamaForCausalLM(configs.llama_config(cfg.draft, cfg.vocab_size, cfg.seq_len)))
    assert t["total"] >= 10_000_000
    assert 4 * d["non_embedding"] <= t["non_embedding"]
    assert 2 * (t["total"] + d["total"]) <= 48_000_000  # bf16 bytes
    with pytest.raises(ValueError):
        configs.check_family(d, t)


# ---- the smoke recipe end to end ---------------------------------------------------------
def test_smoke_recipe_runs_and_saves_loadable_models(smoke_run):
    out, log = smoke_run
    cfg = configs.PRESETS["smoke"]
    assert log["steps"] == cfg.steps and not log["stopped_early"]
    assert log["target"]["train"][-1]["loss_target"] < log["target"]["train"][0]["loss_target"]
    assert log["draft"]["steps"] == cfg.draft_steps
    assert log["draft"]["train"][-1]["loss_draft"] < log["draft"]["train"][0]["loss_draft"]  # distillation loss
    for name in ("target", "draft"):  # the saved weights are the best evaluated ones
        best = min(r[f"loss_{name}"] for r in log[name]["heldout"])
        assert log[name]["best_heldout_loss"] == best
        assert log["final_heldout"][f"heldout_{name}"]["nats_per_token"] == pytest.approx(best, abs=0.05)
    saved = json.loads((out / "train_log.json").read_text())
    assert saved["target"]["heldout"][-1]["step"] == cfg.steps
    prompts = json.loads((out / "heldout_prompts.json").read_text())["prompts"]
    assert prompts and all(p["text"].endswith(":") for p in prompts)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    for name in ("specviz-target", "specviz-draft"):
        path = out / name
        assert (path / "generation_config.json").exists() and list(path.glob("*.safetensors"))
        model = AutoModelForCausalLM.from_pretrained(path, use_safetensors=True)
        tok = AutoTokenizer.from_pretrained(path)
        assert model.dtype == torch.bfloat16
        c = model.config
        assert (c.bos_token_id, c.eos_token_id, c.pad_token_id) == (EOS_ID, EOS_ID, PAD_ID)
        ids = tok("def f(x):", return_tensors="pt").input_ids
        gen = model.generate(ids, max_new_tokens=5, do_sample=False)
        assert gen.shape[1] > ids.shape[1]
    a, b = (out / "specviz-target" / "tokenizer.json"), (out / "specviz-draft" / "tokenizer.json")
    assert a.read_bytes() == b.read_bytes()


def test_smoke_recipe_is_deterministic_on_cpu(smoke_run, tmp_path):
    from specviz.train.recipe import run

    _, log = smoke_run
    again = run(str(tmp_path), preset="smoke", seed=0, device="cpu")
    for name in ("target", "draft"):
        key = f"loss_{name}"
        assert [r[key] for r in again[name]["train"]] == [r[key] for r in log[name]["train"]]
    assert again["tokenizer"]["sha256"] == log["tokenizer"]["sha256"]


def _spec_decoder():
    from specviz import SpecDecoder  # the engine is part of the package: an import failure is a failure here

    return SpecDecoder


def test_smoke_output_loads_through_specdecoder(smoke_run):
    out, _ = smoke_run
    dec = _spec_decoder().from_pretrained(str(out / "specviz-target"), str(out / "specviz-draft"), device="cpu")
    plain = dec.generate("def f(x):", method="none", max_new_tokens=8)
    spec = dec.generate("def f(x):", method="draft_model", num_speculative_tokens=4, max_new_tokens=8)
    assert len(plain.output_token_ids) > 0
    assert spec.output_token_ids == plain.output_token_ids  # greedy speculative decoding is lossless


# ---- head hooks ---------------------------------------------------------------------------
def test_target_hidden_states_are_what_the_lm_head_sees():
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    cfg = configs.PRESETS["smoke"]
    model = LlamaForCausalLM(configs.llama_config(cfg.target, cfg.vocab_size, cfg.seq_len)).eval()
    ids = torch.randint(2, cfg.vocab_size, (2, 9))
    hs = heads.target_hidden_states(model, ids, layers=(0, 1, 2))
    assert hs.final.shape == (2, 9, cfg.target.d_model) and set(hs.layers) == {0, 1, 2}
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    torch.testing.assert_close(hs.final @ model.lm_head.weight.T, logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(hs.layers[0], model.model.embed_tokens(ids))


def test_eagle_and_medusa_pairing():
    ids = torch.arange(10).view(1, 10)
    feats = torch.arange(10, dtype=torch.float32).view(1, 10, 1) * 100  # f_t = 100 t
    b = eagle_train.eagle_batch(feats, ids)
    t = torch.arange(8)
    assert b["features"][0, :, 0].tolist() == (100 * t).tolist()
    assert b["next_ids"][0].tolist() == (t + 1).tolist()  # f_t pairs with x_{t+1}
    assert b["target_features"][0, :, 0].tolist() == (100 * (t + 1)).tolist()
    assert b["target_ids"][0].tolist() == (t + 2).tolist()
    m = medusa_train.medusa_labels(ids, num_heads=3)
    assert m.shape == (3, 1, 10)
    assert m[0, 0].tolist() == [2, 3, 4, 5, 6, 7, 8, 9, -100, -100]
    assert m[2, 0].tolist() == [4, 5, 6, 7, 8, 9, -100, -100, -100, -100]
    assert set(heads.trainers()) == {"eagle", "eagle3", "medusa", "mtp", "dflash"}  # trainers: tests/test_heads_train.py


# ---- evaluation helpers -----------------------------------------------------------------------
H = "    def f(self, x):"
STATEMENT_CASES = [
    ("\n        return x + 1\n", False, "parsed"),
    ("\n        return x + 1", False, "incomplete"),
    ("\n        return x + 1", True, "parsed"),
    ("\n        return x +\n", False, "syntax_error"),
    ("\n        y = foo(\n            a,\n        )\n        z", False, "parsed"),
    ("\n        y = foo(\n            a,", False, "incomplete"),
    ('\n        """Doc.\n\n    Args:\n        x\n        """\n        return 1', False, "parsed"),
    ('\n        """Doc.\n\n    Args:', False, "incomplete"),
    ("\n        if x:\n            return 1\n        return 2\n", False, "parsed"),
    ("\n        if x:\n            return 1\n", False, "incomplete"),
    ("\n        if x:\n            return 1\n        else:\n            return 2\n        y = 3", False, "parsed"),
    ("\n        try:\n            return 1\n        except E:\n            pass\n    def g(self):", False, "parsed"),
    ("\n        try:\n            return 1\n    def g(self):", False, "syntax_error"),
    ("\n        @dec\n        def g():\n            pass\n        return g", False, "parsed"),
    ("\n    return x\n", False, "no_body"),
    ("\n        # comment\n\n        x = 1\n", False, "parsed"),
    ("\n        x = = 1\n", False, "syntax_error"),
    ("\n        if x:\n            return 1\n      y = 2\n", False, "syntax_error"),
    ("\n", False, "incomplete"),
    ("\n        for a in b:\n            if a:\n                c()\n    def g(self):\n", False, "parsed"),
]


@pytest.mark.parametrize("continuation,ended,status", STATEMENT_CASES)
def test_first_statement(continuation, ended, status):
    assert statements.first_statement(H, continuation, ended).status == status


def test_first_statement_text_and_outer_dedent():
    r = statements.first_statement("            def f(x):", "\n                with a:\n                    return 1\n        else:\n")
    assert r.status == "parsed" and r.text == "    with a:\n        return 1\n"


def test_heldout_prompts_are_fixed_and_true_source_parses(full_corpus):
    sel = prompts.select_prompts(full_corpus.heldout, 40)
    assert len(sel) == 40 and len({(p.relpath, p.def_line) for p in sel}) == 40
    assert all(p.text.endswith(":") and p.text.endswith(p.header) for p in sel)
    assert sel[0].relpath == "transformers/models/ibert/quant_modules.py" and sel[0].def_line == 696
    sources = {f.relpath: f.text for f in full_corpus.heldout}
    for p in sel:  # the real continuation of every prompt satisfies the statement check
        src = sources[p.relpath]
        rest = src[src.index(p.text) + len(p.text):]
        assert statements.first_statement(p.header, rest, ended=True).status == "parsed", p


class _StandInTrace:
    def __init__(self, ids, accepted, drafts):
        self.output_token_ids, self.stop_reason = ids, "max_new_tokens"
        self.metrics = {"num_steps": drafts + 1, "num_drafts": drafts, "num_draft_tokens": 4 * drafts,
                        "num_accepted_tokens": accepted, "num_generated_tokens": len(ids),
                        "mean_acceptance_length": 1 + accepted / drafts}


class _StandInDecoder:
    """Returns fixed traces: draft_model accepts 6 of 2 drafts' 8 tokens, ngram 1 of 1 draft."""

    def __init__(self, tokenizer):
        self.tokenizer, self.eos_token_ids = tokenizer, [EOS_ID]

    def generate(self, prompt, method, **kw):
        ids = self.tokenizer("\n        return x\n", add_special_tokens=False)["input_ids"] + [EOS_ID]
        return _StandInTrace(ids, 6, 2) if method == "draft_model" else _StandInTrace(ids, 1, 1)


def test_evaluate_pools_counters_over_prompts(smoke_run):
    from transformers import AutoTokenizer

    from specviz.train import evaluate

    out, _ = smoke_run
    tok = AutoTokenizer.from_pretrained(out / "specviz-target")
    res = evaluate.evaluate(str(out), num_prompts=3, max_new_tokens=16, heldout_windows=1,
                            decoder_factory=lambda *a: _StandInDecoder(tok), corpus_limits=(6, 8))
    s = res["summary"]
    assert s["num_prompts"] == 3
    assert s["draft_model"]["mean_acceptance_length"] == pytest.approx(1 + 18 / 6)
    assert s["ngram"]["mean_acceptance_length"] == pytest.approx(2.0)
    assert s["draft_model"]["tokens_per_step"] == pytest.approx(s["draft_model"]["num_generated_tokens"] / 9)
    assert s["statement_parse_fraction"] == 1.0 and s["outputs_differ"] == 0
    assert res["heldout_loss"]["target"]["windows"] == 1 and res["heldout_loss"]["target"]["loss"] > 0


# ---- the bundled demo models ----------------------------------------------------------------
bundled = pytest.mark.skipif(not (BUNDLED / "specviz-target").exists(), reason="no bundled models")


@bundled
def test_bundled_models_load_offline_share_tokenizer_and_fit_budget():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.time()
    target = AutoModelForCausalLM.from_pretrained(BUNDLED / "specviz-target", use_safetensors=True)
    draft = AutoModelForCausalLM.from_pretrained(BUNDLED / "specviz-draft", use_safetensors=True)
    tok = AutoTokenizer.from_pretrained(BUNDLED / "specviz-target")
    print(f"bundled target + draft + tokenizer load on CPU: {time.time() - t0:.2f} s")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (BUNDLED / "specviz-target" / name).read_bytes() == (BUNDLED / "specviz-draft" / name).read_bytes()
    import hashlib

    assert hashlib.sha256(tok.backend_tokenizer.to_str().encode()).hexdigest() == TOKENIZER_SHA256
    t, d = configs.param_counts(target), configs.param_counts(draft)
    assert t["total"] >= 10_000_000 and 4 * d["non_embedding"] <= t["non_embedding"]
    weights = list(BUNDLED.glob("*/*.safetensors"))  # target, draft and every head
    assert sum(w.stat().st_size for w in weights) <= 50_000_000
    assert all(f.stat().st_size <= 15 * 2**20 for f in BUNDLED.rglob("*") if f.is_file())
    ids = tok("import torch\n\n\ndef forward(self, x):", return_tensors="pt").input_ids
    for m in (target, draft):
        c = m.config
        assert (c.bos_token_id, c.eos_token_id, c.pad_token_id, c.vocab_size) == (EOS_ID, EOS_ID, PAD_ID, 8192)
        out = m.generate(ids, max_new_tokens=16, do_sample=False)
        assert tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip()


@bundled
def test_bundled_target_continues_a_function_with_valid_python():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = AutoModelForCausalLM.from_pretrained(BUNDLED / "specviz-target", use_safetensors=True, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(BUNDLED / "specviz-target")
    header = "def __init__(self, config):"  # v2 greedy continuations often loop inside docstrings (model card)
    ids = tok(header, return_tensors="pt").input_ids
    out = target.generate(ids, max_new_tokens=48, do_sample=False)
    text = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    print(repr(text))
    assert text.strip()
    assert statements.first_statement(header, text).status == "parsed"


@bundled
def test_bundled_models_through_specdecoder():
    dec = _spec_decoder().from_pretrained(str(BUNDLED / "specviz-target"), str(BUNDLED / "specviz-draft"), device="cpu")
    tr = dec.generate("def rotate_half(x):", method="draft_model", num_speculative_tokens=4, max_new_tokens=32)
    assert tr.text.strip() and len(tr.output_token_ids) == 32
