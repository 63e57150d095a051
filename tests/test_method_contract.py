"""The contract every registered method honours, checked the same way for each (parametrized over specviz.methods):

- greedy speculative decoding gives plain greedy's tokens exactly (fp32), in the eager and the static runner, as a
  chain and as every tree form the method drafts;
- at T > 0 the emitted tokens follow the target's own distribution (chi-square per output position against the
  exactly enumerated marginals, Bonferroni over the family), with a negative control: the same test catches a planted
  sampler bug at the same sample size;
- on CUDA (static runner, CUDA graphs) a chain step waits for the host at most once (tests/test_gpu_syncs.py's
  count: no sync beyond the verifier's one wait);
- its view and its lesson render every step; its options parse from the CLI; a missing head or draft model is
  refused with a message that says what to pass.

Small random models over V = 16 tokens (the target with 4 layers, a perturbed copy as the draft, a random head of
every head method from its trainer's ``new_head``); random heads draft badly, which is what a lossless verifier must
survive. Method-specific behaviour stays in each method's own test file.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch

import small_vocab
from specviz import SpecDecoder, methods
from specviz.heads.io import save_any
from specviz.sampling import logits_to_probs
from specviz.train.heads import new_head
from stats_helpers import chi_square, threshold

torch.set_num_threads(1)  # tiny models: threads only contend on a shared CPU

V = 16
PROMPT = [3, 7, 1, 5, 3, 7, 1, 5, 3, 7]  # repeats itself: prompt lookup and suffix decoding find matches
SEEDS = 150
POSITIONS = 3
K = 2
TREE_SPECS = {"static": "[(0,), (1,), (0, 0)]", "dynamic": "2, 1, 5", "branches": "2"}
SPECULATIVE = [m for m in methods.names() if m != "none"]
CASES = [(m, form) for m in SPECULATIVE for form in ("chain", *methods.get(m).tree_forms)]


def _save_target(path, seed: int, noise: float = 0.0):
    """A 4-layer random Llama over V tokens whose pad token (DFlash's MASK) is the last id; saved with its tokenizer."""
    model = small_vocab.build_model(V, seed, layers=4)
    if noise:
        small_vocab.perturb(model, noise, 1)
    model.config.pad_token_id = V - 1
    model.generation_config.eos_token_id = None
    model.save_pretrained(path, safe_serialization=True)
    small_vocab.build_tokenizer(V).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(target dir, draft dir, {method: head dir}) for every method of the registry that needs them."""
    root = tmp_path_factory.mktemp("contract")
    target = _save_target(root / "target", seed=0)
    draft = _save_target(root / "draft", seed=0, noise=0.2)
    model = SpecDecoder.from_pretrained(target, device="cpu", dtype="float32").target_model
    heads = {}
    for i, m in enumerate(methods.all_methods()):
        if m.head is not None and m.head.trainer:
            torch.manual_seed(100 + i)
            save_any(new_head(m.name, model), root / m.name, dtype=torch.float32)
            heads[m.name] = str(root / m.name)
    return target, draft, heads


@pytest.fixture(scope="module")
def decoders(models):
    target, draft, heads = models
    return {runner: SpecDecoder.from_pretrained(target, draft, device="cpu", dtype="float32", runner=runner,
                                                heads=heads) for runner in ("eager", "static")}


def _settings(method: str, form: str) -> dict:
    """generate() keywords for ``method`` drafting a chain or a tree of ``form``."""
    if form == "chain":
        return {"num_speculative_tokens": 3}
    from specviz.tree import DraftTree

    tree = DraftTree.parse(TREE_SPECS[form])
    return {"num_speculative_tokens": tree.max_depth or 3, **tree.settings(method)}


def test_every_method_is_in_the_contract():
    """A method registered later is covered too (the cases are read from the registry), and every tree form has a
    spec here."""
    assert {m for m, _ in CASES} == set(SPECULATIVE) and len(SPECULATIVE) >= 9
    assert {f for m in SPECULATIVE for f in methods.get(m).tree_forms} <= set(TREE_SPECS)


@pytest.mark.parametrize("runner", ["eager", "static"])
@pytest.mark.parametrize("method, form", CASES)
def test_greedy_equals_plain_greedy(decoders, method, form, runner):
    dec = decoders[runner]
    want = dec.generate(PROMPT, method="none", max_new_tokens=12).output_token_ids
    got = dec.generate(PROMPT, method=method, max_new_tokens=12, **_settings(method, form))
    assert got.output_token_ids == want, (method, form, runner)
    assert sum(s.num_drafted for s in got.steps) > 0, "nothing was drafted: the check would be empty"
    if form != "chain" and form != "branches":  # a branches tree may degrade to a chain where one continuation exists
        assert any(s.is_tree for s in got.steps), "no step drafted a tree"


@torch.inference_mode()
def exact_marginals(model, prompt, temperature: float, n: int) -> np.ndarray:
    """[n, V]: the marginal distribution of generated tokens 1..n under plain sampling from ``model`` at
    ``temperature``, by enumerating all V^(n-1) continuations."""
    out, joint = [], torch.ones(1, dtype=torch.float64)
    prefixes = torch.tensor([prompt])
    for _ in range(n):
        p = logits_to_probs(model(input_ids=prefixes).logits[:, -1].float(), temperature, None, None).double()
        out.append((joint[:, None] * p).sum(0).numpy())
        joint = (joint[:, None] * p).reshape(-1)
        prefixes = torch.cat([prefixes.repeat_interleave(V, 0), torch.arange(V).repeat(prefixes.shape[0])[:, None]], 1)
    return np.stack(out)


def _emitted(dec, method: str, form: str, temperature: float) -> np.ndarray:
    counts = np.zeros((POSITIONS, V), dtype=np.int64)
    settings = {**_settings(method, form), "num_speculative_tokens": K} if form == "chain" else _settings(method, form)
    for seed in range(SEEDS):
        trace = dec.generate(PROMPT, method=method, temperature=temperature, verify="standard",
                             max_new_tokens=POSITIONS, seed=seed, detailed_trace=False, **settings)
        for i, t in enumerate(trace.output_token_ids[:POSITIONS]):
            counts[i, t] += 1
    return counts


LOSSLESS = [(m, "chain") for m in SPECULATIVE] + [(m, f) for m, f in CASES if f == "static"][:1]


def _check_lossless(dec, method: str, form: str, temperature: float = 1.0) -> list[str]:
    """The positions whose emitted tokens do not follow the target (empty: lossless at this sample size)."""
    want = exact_marginals(dec.target_model, PROMPT, temperature, POSITIONS)
    counts = _emitted(dec, method, form, temperature)
    bad = []
    for i in range(POSITIONS):
        stat, df, pval = chi_square(counts[i], want[i])
        if pval <= threshold(len(LOSSLESS) * POSITIONS):
            bad.append(f"position {i + 1}: chi2 {stat:.1f} (df {df}), p {pval:.2e}; counts {counts[i].tolist()} "
                       f"vs expected {np.round(want[i] * SEEDS, 1).tolist()}")
    return bad


@pytest.mark.slow
@pytest.mark.parametrize("method, form", LOSSLESS)
def test_lossless_at_temperature(decoders, method, form):
    bad = _check_lossless(decoders["eager"], method, form)
    assert not bad, f"{method} ({form}) is not lossless: " + "; ".join(bad)


def test_the_lossless_check_catches_a_planted_bug(decoders, monkeypatch):
    """Negative control: the acceptance ratio is inverted to min(1, q/p) (a classic slip of p/q), so a one-hot
    prompt-lookup draft is always accepted. The same test, at the same sample size, fails."""
    from specviz.sampling import reference

    real = reference._scan

    def inverted(p_all, q_all, ids, in_draft, method):
        out = real(p_all, q_all, ids, in_draft, method)
        p_x, q_x = out["p_x"], out["q_x"]
        out["ratio"] = torch.where(p_x > 0, q_x / p_x.clamp_min(1e-30), 0.0)
        return out

    monkeypatch.setattr(reference, "_scan", inverted)
    assert _check_lossless(decoders["eager"], "ngram", "chain"), "the planted bug went unnoticed"


@pytest.mark.parametrize("method", SPECULATIVE)
def test_views_and_lesson_render_every_step(decoders, method):
    """Its own view (or the generic note) and the lesson, for every step of a run."""
    from specviz.viz.lesson import chapter_html, lesson_chapters
    from specviz.viz.source import source_figure, source_html, source_note

    trace = decoders["eager"].generate(PROMPT, method=method, num_speculative_tokens=3, max_new_tokens=10)
    for s in range(len(trace.steps)):
        assert source_html(trace, s, 1).strip() and source_figure(trace, s) is not None
    source_note(trace)
    chapters = lesson_chapters(trace)
    assert methods.get(method).texts.lesson in chapter_html(chapters, 0)  # the intro names the method
    assert all(chapter_html(chapters, i) for i in range(len(chapters)))
    if methods.get(method).view:
        assert importlib.import_module(methods.get(method).view).panel_html  # the view module keeps the contract
    drafted = [c for c in chapters if c.kind == "draft" and trace.steps[c.step].draft_token_ids]
    if methods.get(method).head and drafted:  # a head's draft chapter highlights its own view of what it read
        assert {c.focus for c in drafted} == {"match"}, [(c.step, c.focus) for c in drafted]


@pytest.mark.parametrize("method", [m for m in SPECULATIVE if methods.get(m).head or methods.get(m).needs_draft])
def test_a_missing_head_or_draft_is_refused_with_what_to_pass(models, method):
    target = models[0]
    dec = SpecDecoder.from_pretrained(target, device="cpu", dtype="float32")
    with pytest.raises(ValueError) as exc:
        dec.generate(PROMPT, method=method, max_new_tokens=4)
    message = str(exc.value)
    assert method in message and ("--head" in message or "--draft" in message), message


@pytest.mark.parametrize("method", [m for m in SPECULATIVE if methods.get(m).options is not None])
def test_its_options_parse_from_the_cli(method, capsys):
    from specviz.cli import _parser, option_settings

    fields = methods.option_fields(methods.get(method).options)
    argv = ["generate", "--method", method, "--prompt", "x"]
    for f in fields:
        argv += [f"--{f.name.replace('_', '-')}", str(f.metadata["ui"])]
    args = _parser().parse_args(argv)
    assert option_settings(args) == {f.name: f.metadata["ui"] for f in fields}


@pytest.mark.gpu
@pytest.mark.parametrize("method", SPECULATIVE)
def test_at_most_one_host_wait_per_step_on_cuda(models, method, monkeypatch):
    """One verifier wait per step and no other host sync, but ngram_gpu's one read of its draft length k' on the
    steps that draft (its default on CUDA: tests/test_gpu_syncs.py holds it to exactly that)."""
    from test_gpu_syncs import count_waits

    target, draft, heads = models
    dec = SpecDecoder.from_pretrained(target, draft, device="cuda", dtype="float32", runner="static", heads=heads)
    kw = dict(method=method, num_speculative_tokens=K, max_new_tokens=24, seed=1, detailed_trace=False)
    for _ in range(2):  # warm-up: graph capture, Triton compilation, pinned buffers
        dec.generate(PROMPT, **kw)
    steps = count_waits(dec, monkeypatch, prompt=PROMPT, **kw)[1:]  # the first step runs the drafter's prefill
    core = {id(g.core_done) for g in dec.step_verifier.graphs.values()}
    reads = 1 if method == "ngram_gpu" else 0  # specviz.methods.ngram_gpu.PAD_ON_CUDA off: k' read on the host
    for i, s in enumerate(steps, start=1):
        extra = [w for w in s["syncs"] if "ngram_gpu/proposer.py" not in w] if reads else s["syncs"]
        assert not extra and len(s["syncs"]) <= reads, f"{method} step {i}: host syncs beyond the verifier's wait: " \
            f"{s['syncs']}"
        assert len([e for e in s["waits"] if id(e) in core]) == 1, f"{method} step {i}: not one verifier wait"
        assert len(s["waits"]) == 1, f"{method} step {i}: {len(s['waits'])} event waits"
