"""Methods eagle / eagle3: greedy output equals plain greedy decoding, the (feature, token,
position) triples of docs/design/methods.md 1.1, the draft cache after partial accepts (1.2), lossless sampling,
missing heads. Heads have random weights (built from a config) on tiny random targets."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from helpers import PROMPT, assert_greedy_equals_plain_greedy, assert_static_graphs_equal_eager, cli_args
from helpers import runner_decoders, save_eagle_heads, save_tiny_target, target_features
from stats_helpers import chi2_pvalue, exact_marginals, first_two, save_small_word_target
from transformers import DynamicCache

from specviz import SpecDecoder
from specviz.methods.eagle.head import build_head
from specviz.methods.eagle.config import head_config_from_target
from specviz.heads import save_head
from specviz.methods.eagle.proposer import EagleProposer, head_taps
from specviz.static_runner import StaticRunner

D = 32  # the tiny target's hidden size
pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: one intra-op thread


@pytest.fixture(scope="module")
def eagle_dirs(tmp_path_factory):
    """(target dir, {kind: head dir}): a 4-layer tiny Llama and one random head of each kind."""
    root = tmp_path_factory.mktemp("eagle")
    target, model = save_tiny_target(root, layers=4, hidden=D)
    return target, save_eagle_heads(root, model)


@pytest.fixture(scope="module")
def eagle_decoders(eagle_dirs):
    return runner_decoders(*eagle_dirs)


class OracleHead(torch.nn.Module):
    """A stub head with the heads' call signature that records every call. Its logits put the mass
    on ``oracle[p + 2]`` for a row at position p (the token EAGLE's row predicts), except at the
    positions in ``wrong``, where it proposes another token (forcing a rejection there). Its hidden
    output is (position + 1) everywhere, so a fed-back feature names the row it came from."""

    def __init__(self, kind: str, oracle: list[int], vocab: int, d: int, wrong: set[int] = frozenset()):
        super().__init__()
        self.config = SimpleNamespace(kind=kind, aux_layer_ids=(2, 2, 1) if kind == "eagle3" else ())
        self.oracle, self.vocab, self.d, self.wrong = list(oracle), vocab, d, set(wrong)
        self.calls: list[dict] = []

    def forward(self, features, input_ids, position_ids, cache=None, *, from_target: bool):
        self.calls.append({"features": features.clone(), "ids": input_ids.tolist(), "pos": position_ids.tolist(),
                           "from_target": from_target})
        logits = torch.zeros(len(input_ids), self.vocab)
        for r, p in enumerate(position_ids.tolist()):
            tok = self.oracle[p + 2] if p + 2 < len(self.oracle) else 5
            logits[r, (tok + 1) % self.vocab if p in self.wrong else tok] = 10.0
        hidden = (position_ids.float() + 1)[:, None].expand(-1, self.d).clone()  # [T, d]
        return hidden, logits


def _plain(dec, **kw):
    return dec.generate(PROMPT, method="none", max_new_tokens=kw.pop("max_new_tokens", 16), **kw)


@pytest.mark.parametrize("runner", ("eager", "static"))
def test_greedy_equals_plain_greedy(eagle_decoders, runner):
    """fp32 CPU, k in {1, 2, 4, 7}: random heads (mostly rejected) and an oracle stub with injected
    errors (full and partial accepts) give exactly method none's tokens, on both runners."""
    dec = eagle_decoders[runner]
    assert_greedy_equals_plain_greedy(
        dec, runner, ("eagle", "eagle3"), (1, 2, 4, 7),
        lambda kind, full, real: OracleHead(kind, full, dec.vocab_size, D, wrong={len(full) - 12, len(full) - 5}),
        min_accepted=16 * 4, detailed_trace=False)


@pytest.mark.parametrize("kind", ("eagle", "eagle3"))
def test_head_inputs_follow_the_pairing(eagle_decoders, kind):
    """docs/design/methods.md 1.1: after the prefill the head reads (f_j, x_{j+1}) at position j for j < n; after
    a full accept the next first pass reads the k + 1 newly committed pairs, after a partial accept
    a + 1 of them; draft step m reads (its own previous output, d_{m-1}) at position n + m - 2."""
    dec = eagle_decoders["eager"]
    want = _plain(dec, max_new_tokens=20).output_token_ids
    ids = dec.encode(PROMPT)
    full = ids + want
    n0, k = len(ids) - 1, 3
    wrong = {n0 + 5}  # step 0 drafts at rows n0-1, n0, n0+1 (all right); a later step hits the wrong row
    head = OracleHead(kind, full, dec.vocab_size, D, wrong=wrong)
    real = dec.heads.get(kind)
    dec.heads[kind] = head
    try:
        trace = dec.generate(PROMPT, method=kind, num_speculative_tokens=k, max_new_tokens=20)
    finally:
        dec.heads[kind] = real
    assert trace.output_token_ids == want
    feats = target_features(dec, full, head_taps(head.config))  # [N, F]
    first_passes = [c for c in head.calls if c["from_target"]]
    # every first-pass row: the target feature of its own position, with the token after it
    for c in first_passes:
        for row, (tok, pos) in enumerate(zip(c["ids"], c["pos"])):
            dist = (feats - c["features"][row]).abs().amax(dim=-1)  # [N]
            assert int(dist.argmin()) == pos and float(dist.min()) < 1e-4, (row, pos)
            assert tok == full[pos + 1]
    assert first_passes[0]["pos"] == list(range(n0))  # the prefill: pairs (f_j, x_{j+1}), j < n
    steps = trace.steps
    for s, c in zip(steps, first_passes[1:]):  # the first pass after step s reads its committed pairs
        assert len(c["pos"]) == len(s.committed_token_ids) == s.num_accepted + 1
        assert c["ids"] == s.committed_token_ids
    assert steps[0].num_accepted == k  # a full accept ...
    assert any(s.num_accepted < len(s.draft_token_ids) for s in steps)  # ... and a partial one
    # draft steps: (the previous row's own output, d_{m-1}) at the next position
    calls = iter(head.calls)
    for s in (s for s in steps if s.draft_token_ids):  # the last steps may have no room to draft
        c = next(calls)
        assert c["from_target"]
        n = c["pos"][-1] + 1
        for m in range(2, len(s.draft_token_ids) + 1):
            c = next(calls)
            assert not c["from_target"] and c["pos"] == [n + m - 2] and c["ids"] == [s.draft_token_ids[m - 2]]
            assert torch.all(c["features"] == n + m - 2)  # fed back from the row at position n + m - 3
    details = steps[1].match
    assert details["kind"] == kind and details["positions"][0]["feature"] == "target"
    assert details["positions"][0]["input_token_id"] == full[details["root_position"]]


@pytest.mark.parametrize("kind", ("eagle", "eagle3"))
def test_draft_cache_equals_a_recompute_after_every_step(eagle_decoders, kind):
    """docs/design/methods.md 1.2 / vllm#14649: after every step (partial accepts included) the head's K/V of the
    committed positions equal a fresh first pass over (f_j, x_{j+1}) from the target's features."""
    dec = eagle_decoders["eager"]
    checked = partial = 0
    for trace in dec.iter_generate(PROMPT, method=kind, num_speculative_tokens=4, max_new_tokens=16, temperature=0.9,
                                   verify="standard", seed=1, detailed_trace=False):
        prop = dec.current_proposer
        assert isinstance(prop, EagleProposer)
        ids = trace.prompt_token_ids + [t for s in trace.steps for t in s.committed_token_ids]
        Lc = prop.committed
        assert Lc + len(prop._pending_ids) == len(ids) - 1
        feats = target_features(dec, ids[:Lc], prop.taps)
        fresh = DynamicCache()
        with torch.no_grad():
            prop.head(feats, torch.tensor(ids[1:Lc + 1]), torch.arange(Lc), fresh, from_target=True)
        got, want = prop.cache.layers[0], fresh.layers[0]
        torch.testing.assert_close(got.keys[:, :, :Lc], want.keys, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(got.values[:, :, :Lc], want.values, rtol=1e-4, atol=1e-5)
        checked += 1
        partial += trace.steps[-1].num_accepted < len(trace.steps[-1].draft_token_ids)
    assert checked > 3 and partial > 0


def test_missing_head_is_a_clear_error(tiny_dirs, eagle_dirs):
    target, heads = eagle_dirs
    dec = SpecDecoder.from_pretrained(target, device="cpu", dtype="float32")
    for kind in ("eagle", "eagle3"):
        with pytest.raises(ValueError, match=f"method '{kind}' needs an .*heads="):
            dec.generate(PROMPT, method=kind)
    other = tiny_dirs["llama"][0]  # a 2-layer target: the heads were built for 4 layers
    with pytest.raises(ValueError, match="does not match the target"):
        SpecDecoder.from_pretrained(other, device="cpu", dtype="float32", heads={"eagle": str(heads["eagle"])})
    with pytest.raises(ValueError, match="not 'eagle3'"):
        SpecDecoder.from_pretrained(target, device="cpu", dtype="float32", heads={"eagle3": str(heads["eagle"])})


# ---- lossless sampling: chi-square per position, small vocabulary ---------------------------------


@pytest.fixture(scope="module")
def small_decoder(tmp_path_factory):
    """A 4-layer random Llama over V = 8 word tokens (no EOS) with random eagle / eagle3 heads."""
    root = tmp_path_factory.mktemp("eagle-small")
    model = save_small_word_target(root)
    for kind in ("eagle", "eagle3"):
        torch.manual_seed(5)
        head = build_head(head_config_from_target(model.config, kind), model)
        save_head(head, root / kind, dtype=torch.float32)
    return SpecDecoder.from_pretrained(root / "target", device="cpu", dtype="float32",
                                       heads={k: str(root / k) for k in ("eagle", "eagle3")})


@pytest.mark.parametrize("kind,verify,sampling", (
    ("eagle", "standard", dict(temperature=0.9)), ("eagle", "block", dict(temperature=1.0, top_p=0.8)),
    ("eagle3", "standard", dict(temperature=0.8, top_k=4)), ("eagle3", "block", dict(temperature=0.9))))
def test_sampling_is_lossless_per_position(small_decoder, kind, verify, sampling):
    """T > 0 (top-k / top-p on p and q alike), k = 2: the first and second generated tokens (accepted
    drafts, recovered and bonus tokens alike) are distributed as the target's; chi-square over 400
    seeded runs (bins with expected count < 5 merged), p > 0.001."""
    dec, prompt, trials = small_decoder, [1, 6, 2, 3], 400
    counts, accepted = first_two(dec, prompt, trials, kind, num_speculative_tokens=2, verify=verify, **sampling)
    assert 0.1 * trials < accepted < 1.9 * trials  # drafts are accepted and rejected
    for i, p in enumerate(exact_marginals(dec, prompt, **sampling)):
        assert chi2_pvalue(counts[i], p, trials) > 1e-3, (kind, verify, i, counts[i].tolist())


def test_sampled_q_is_the_processed_head_distribution(small_decoder):
    """At T > 0 with top-k / top-p, Draft.probs[i] is logits_to_probs(head logits of row i) and d_i lies
    in its support: the q handed to the sampler is the distribution the draft was drawn from."""
    from specviz.proposer import Outcome, StepContext
    from specviz.sampling import logits_to_probs

    dec = small_decoder
    prop = EagleProposer(dec.heads["eagle3"], num_speculative_tokens=3)
    prompt = [1, 6, 2, 3, 4]
    feats = target_features(dec, prompt[:-1], prop.taps)
    prop.observe(Outcome(0, [], 0, prompt[1:], {t: f for t, f in zip(prop.taps, feats.split(32, dim=-1))}))
    ctx = StepContext(temperature=0.7, generator=torch.Generator().manual_seed(0), top_k=5, top_p=0.9)
    draft = prop.propose(prompt, 3, ctx)
    with torch.no_grad():  # replay the chain with the drafted tokens
        cache = DynamicCache()
        h, lg = prop.head(feats, torch.tensor(prompt[1:]), torch.arange(4), cache, from_target=True)
        rows = [lg[-1]]
        for m in range(1, 3):
            h, lg = prop.head(h[-1:], draft.token_ids[m - 1:m], torch.tensor([3 + m]), cache, from_target=False)
            rows.append(lg[0])
    want = logits_to_probs(torch.stack(rows), 0.7, 5, 0.9)
    torch.testing.assert_close(draft.probs, want)
    assert all(want[i, int(t)] > 0 for i, t in enumerate(draft.token_ids))
    assert int((want > 0).sum(-1).max()) <= 5



def test_eagle_views(eagle_decoders):
    """The app's 'where the draft came from' panel for eagle / eagle3 traces (looked up by method name):
    per draft position the feature and token that fed the head, its confidence and the target's
    decision; the figure shows acceptance by position, also beside a draft_model run."""
    from specviz.methods.eagle.view import acceptance_by_position_figure
    from specviz.viz.source import source_figure, source_html

    dec = eagle_decoders["eager"]
    real = dict(dec.heads)
    try:
        for kind in ("eagle", "eagle3"):
            ids = dec.encode(PROMPT)
            dec.heads[kind] = OracleHead(kind, ids + _plain(dec).output_token_ids, dec.vocab_size, D,
                                         wrong={len(ids) + 2})
            tr = dec.generate(PROMPT, method=kind, num_speculative_tokens=3, max_new_tokens=16)
            st = next(s for s in tr.steps if s.num_accepted < len(s.draft_token_ids))
            page = source_html(tr, st.index, st.num_accepted + 1)
            assert "sv-eagle" in page and page.count("<tr data-draft-index=") == len(st.draft_token_ids)
            assert "rejected" in page and (st.num_accepted == 0 or "accepted" in page)
            assert ("inputs of layers 2, 2, 1" in page and "target layers 2,2,1 @" in page) == (kind == "eagle3")
            assert f"<tr data-draft-index='{st.num_accepted + 1}' style='background" in page  # the selection
            for pos in st.match["positions"]:
                assert 0.0 <= pos["draft_prob"] <= pos["head_top_prob"] <= 1.0
            fig = source_figure(tr, st.index)
            assert [t.name for t in fig.data] == [f"{kind}: accepted >= i", f"{kind}: mean head confidence"]
            assert list(fig.data[0].y) == tr.metrics["acceptance_rate_per_position"]
    finally:
        dec.heads = real
    other = dec.generate(PROMPT, method="ngram", num_speculative_tokens=3, max_new_tokens=8, prompt_lookup_min=1)
    both = acceptance_by_position_figure([tr, other])
    assert [t.name for t in both.data][-1] == "ngram: accepted >= i"
    from specviz.methods.ngram.view import match_context_html, trie_figure

    for st in other.steps[:3]:  # other methods keep their own view
        assert source_html(other, st.index) == match_context_html(other, st.index)
        assert source_figure(other, st.index) == trie_figure(other, st.index)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ("eagle", "eagle3"))
def test_static_graphs_equal_eager_on_gpu(eagle_dirs, kind):
    """fp32 on CUDA: the static runner with CUDA graphs (taps captured in the graphs) gives the eager
    runner's tokens and per-step acceptances, greedy and seeded sampling, and method none's tokens."""
    target, heads = eagle_dirs
    decs = runner_decoders(target, heads, device="cuda")
    assert decs["static"].runner_factory.func is StaticRunner
    assert_static_graphs_equal_eager(decs, kind, 4, "block")
    # the taps were captured inside the graphs (the pooled runner also holds method none's tap-free graphs)
    assert any(key[1] for key in decs["static"].target_runner.graphs)
    # the head drafted through its static runner's graphs (specviz/methods/eagle/runner.py), none of which failed
    head_runner, = decs["static"].pool.free(("head", id(decs["static"].heads[kind])))
    assert head_runner.replays > 0 and head_runner.graphs and all(g is not None for g in head_runner.graphs.values())


def test_cli_eagle_methods(eagle_dirs, capsys):
    """``--method eagle3 --eagle3-head DIR`` runs; without a head the CLI says what to pass (exit 2)."""
    from specviz.cli import main

    target, heads = eagle_dirs
    common = cli_args(target)
    assert main([*common, "--method", "eagle3", "--eagle3-head", str(heads["eagle3"])]) == 0
    assert "mean acceptance length" in capsys.readouterr().out
    assert main([*common, "--method", "eagle"]) == 2
    assert "needs an EAGLE head" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ("eagle", "eagle3"))
def test_tree_requests_leave_the_chain_head_runner_pool_alone(eagle_decoders, kind):
    """A tree request drafts with its own eager head runner; that runner must not join the pool the chain
    draws from (it did: later chain requests then drafted eagerly, 2.3x slower per step on the H200)."""
    from specviz.methods.eagle.runner import StaticHeadRunner

    dec = eagle_decoders["static"]
    key = ("head", id(dec.heads[kind]))
    dec.generate(PROMPT, method=kind, num_speculative_tokens=3, max_new_tokens=6)
    pooled = dec.pool.free(key)
    assert pooled and all(isinstance(r, StaticHeadRunner) for r in pooled)
    dec.generate(PROMPT, method=kind, num_speculative_tokens=4, max_new_tokens=6, eagle_tree_top_k=2,
                 eagle_tree_depth=3, eagle_tree_total_tokens=6)
    assert dec.pool.free(key) == pooled  # the same runners, nothing added
    dec.generate(PROMPT, method=kind, num_speculative_tokens=3, max_new_tokens=6)
    assert isinstance(dec.current_proposer.runner, StaticHeadRunner)  # the chain after the tree drafts statically


def test_the_lesson_says_which_feature_drafted_each_token():
    """The lesson's draft chapter for the bundled EAGLE-3 head names the target layers of its first feature, and
    each drafted token with the feature it came from and its confidence (the method's draft_why)."""
    from specviz import SpecDecoder
    from specviz.viz.common import fmt_prob, quoted
    from specviz.viz.lesson import _draft_why

    dec = SpecDecoder.from_pretrained(device="cpu", dtype="float32")
    trace = dec.generate("def fib(n):\n    if n < 2:\n        return n\n    return", method="eagle3",
                         num_speculative_tokens=3, max_new_tokens=8)
    st = next(s for s in trace.steps if s.draft_token_ids)
    text = _draft_why(trace, st)
    layers = ", ".join(map(str, st.match["aux_layer_ids"]))
    assert f"The EAGLE-3 head ran {len(st.draft_token_ids)} time(s)" in text and f"inputs of layers {layers}" in text
    for i, (row, t) in enumerate(zip(st.match["positions"], st.draft_token_ids), start=1):
        assert f"x{i} = {quoted(trace, t)} from " in text and f"(confidence {fmt_prob(row['draft_prob'])})" in text
