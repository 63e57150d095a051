"""Method dflash: greedy output equals plain greedy decoding (fp32, eager and static), one
drafter forward per step, the features / block / positions of docs/design/methods.md 1.1 and 6.1, the context
cache after partial accepts, MASK never drafted, lossless sampling (chi-square per position),
missing heads and bad k. Heads have random weights (built from a config) on tiny random targets."""

from __future__ import annotations

import pytest
import torch
from helpers import PROMPT, assert_greedy_equals_plain_greedy, assert_static_graphs_equal_eager, cli_args
from helpers import runner_decoders, target_features, tiny_head_dirs
from stats_helpers import chi2_pvalue, exact_marginals, first_two, save_small_word_target

from specviz import SpecDecoder
from specviz.methods.dflash.head import DFlashCache, DFlashHead, dflash_config_from_target, save_dflash
from specviz.methods.dflash.proposer import DFlashProposer

D, BLOCK = 32, 8
pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: one intra-op thread


@pytest.fixture(scope="module")
def dflash_dirs(tmp_path_factory):
    """(target dir, head dir): a 5-layer tiny Llama (pad = MASK = 1) and a random 2-layer DFlash head."""
    def random_dflash(model):
        torch.manual_seed(11)
        return DFlashHead(dflash_config_from_target(model.config, num_layers=2, block_size=BLOCK), model)

    return tiny_head_dirs(tmp_path_factory, "dflash", random_dflash, layers=5, save=save_dflash)


@pytest.fixture(scope="module")
def decoders(dflash_dirs):
    return runner_decoders(dflash_dirs[0], {"dflash": dflash_dirs[1]})


class OracleBlock(torch.nn.Module):
    """A stub with the head's call signature that records every call. Slot at position p puts its
    mass on ``oracle[p]`` (DFlash's same-position alignment), except at positions in ``wrong`` (a
    rejection there); ``favour_mask`` gives MASK an even larger logit everywhere."""

    def __init__(self, config, oracle: list[int], wrong=frozenset(), favour_mask: bool = False):
        super().__init__()
        self.config, self.oracle, self.wrong, self.favour_mask = config, list(oracle), set(wrong), favour_mask
        self.w = torch.nn.Parameter(torch.zeros(()))
        self.calls: list[dict] = []

    layers: list = []  # no layers: the static runner's buffers are empty, its step calls block_logits only

    def forward(self, features, context_positions, block_ids, block_positions, cache=None, attention_mask=None):
        self.calls.append({"features": features.clone(), "ctx_pos": context_positions.tolist(),
                           "block": block_ids.tolist(), "pos": block_positions.tolist()})
        return self.block_logits(block_ids[None], block_positions[None], [])[0]

    def context_kv(self, features, positions):
        return []

    def block_logits(self, block_ids, block_positions, kvs, attention_mask=None):
        V = self.config.vocab_size
        logits = torch.zeros(block_ids.shape[1], V)
        for r, p in enumerate(block_positions[0].tolist()):
            tok = self.oracle[p] if p < len(self.oracle) else 5
            logits[r, (tok + 1) % V if p in self.wrong else tok] = 10.0
        if self.favour_mask:
            logits[:, self.config.mask_token_id] = 20.0
        return logits[None]


def _plain(dec, n=16):
    return dec.generate(PROMPT, method="none", max_new_tokens=n).output_token_ids


@pytest.mark.parametrize("runner", ("eager", "static"))
def test_greedy_equals_plain_greedy(decoders, runner):
    """fp32 CPU, k in {1, 3, 7}: a random head (mostly rejected) and an oracle stub with injected
    errors (full and partial accepts) give exactly method none's tokens, on both runners."""
    assert_greedy_equals_plain_greedy(
        decoders[runner], runner, ("dflash",), (1, 3, 7),
        lambda kind, full, real: OracleBlock(real["dflash"].config, full, wrong={len(full) - 12, len(full) - 5}),
        min_accepted=16)


def test_one_drafter_forward_per_step(decoders):
    """The block is drafted by ONE head forward per drafting step (counted by a forward hook on the
    real head), and no head call happens at a step without a draft."""
    dec = decoders["eager"]
    head = dec.heads["dflash"]
    calls: list[int] = []
    hook = head.register_forward_hook(lambda mod, args, out: calls.append(len(calls)))
    try:
        for kw in ({}, {"temperature": 0.9, "verify": "standard", "seed": 2}):
            calls.clear()
            tr = dec.generate(PROMPT, method="dflash", num_speculative_tokens=BLOCK - 1, max_new_tokens=20, **kw)
            drafting = [s for s in tr.steps if s.draft_token_ids]
            assert len(calls) == len(drafting) == dec.current_proposer.forwards
            assert len(drafting) >= len(tr.steps) - 1 and len(drafting) > 3
            assert all(s.match["drafter_forwards"] == 1 for s in drafting)
    finally:
        hook.remove()


def test_block_and_context_follow_the_alignment(decoders):
    """docs/design/methods.md 6.1: the first forward reads the prompt's target features at positions 0..n-1
    (outputs of target_layer_ids); each later forward reads exactly the positions committed by the
    last step; the block is [x_n, MASK x (B-1)] at positions n..n+B-1 (B = the trained size, also
    when k < B-1), and slot i's draft is the token at position n+i."""
    dec = decoders["eager"]
    want = _plain(dec, 20)
    ids = dec.encode(PROMPT)
    full = ids + want
    n0 = len(ids) - 1
    real = dec.heads["dflash"]
    stub = OracleBlock(real.config, full, wrong={n0 + 6})
    dec.heads["dflash"] = stub
    try:
        tr = dec.generate(PROMPT, method="dflash", num_speculative_tokens=4, max_new_tokens=20)
    finally:
        dec.heads["dflash"] = real
    assert tr.output_token_ids == want
    feats = target_features(dec, full, real.config.taps)  # [N, F]
    assert stub.calls[0]["ctx_pos"] == list(range(n0))
    drafting = [s for s in tr.steps if s.draft_token_ids]
    for s, c in zip(drafting, stub.calls):
        n = c["pos"][0]
        assert c["block"] == [full[n]] + [real.config.mask_token_id] * (BLOCK - 1)
        assert c["pos"] == list(range(n, n + BLOCK))
        for row, pos in enumerate(c["ctx_pos"]):
            torch.testing.assert_close(c["features"][row], feats[pos], rtol=1e-4, atol=1e-5)
        assert c["ctx_pos"][-1] == n - 1  # the context ends just before the root (strictly < n)
        assert s.match["root_position"] == n and s.match["context"]["length"] == len(c["ctx_pos"])
    for prev, c in zip(tr.steps, stub.calls[1:]):  # the forward after step s reads its committed positions
        assert len(c["ctx_pos"]) == len(prev.committed_token_ids) == prev.num_accepted + 1
    assert any(s.num_accepted < len(s.draft_token_ids) for s in tr.steps)
    assert any(s.num_accepted == len(s.draft_token_ids) for s in drafting)


def test_context_cache_equals_a_recompute_after_every_step(decoders):
    """docs/design/methods.md 11.3: after every step (partial accepts included) the drafter's context K/V of
    the committed positions equal a fresh computation from the target's features."""
    dec = decoders["eager"]
    checked = partial = 0
    for trace in dec.iter_generate(PROMPT, method="dflash", num_speculative_tokens=5, max_new_tokens=16,
                                   temperature=0.9, verify="standard", seed=1, detailed_trace=False):
        prop = dec.current_proposer
        assert isinstance(prop, DFlashProposer)
        ids = trace.prompt_token_ids + [t for s in trace.steps for t in s.committed_token_ids]
        Lc = prop.committed
        assert Lc == prop.cache.length and Lc + prop._pending_n == len(ids) - 1
        feats = target_features(dec, ids[:Lc], prop.taps)
        fresh = DFlashCache()
        with torch.no_grad():
            prop.head(feats, torch.arange(Lc), torch.tensor([ids[Lc]] + [1] * (BLOCK - 1)),
                      torch.arange(Lc, Lc + BLOCK), fresh)
        for got, want in zip(prop.cache.keys + prop.cache.values, fresh.keys + fresh.values):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        checked += 1
        partial += trace.steps[-1].num_accepted < len(trace.steps[-1].draft_token_ids)
    assert checked > 3 and partial > 0


def test_static_runner_equals_the_eager_one(decoders):
    """The static-shape drafter step (preallocated context K/V, padded rows masked by key < n) gives
    the eager runner's logits for a prompt longer than B and then c = 1 .. B new rows per step, and
    its buffers hold the eager cache's K/V at every committed position; the static decoder drafts
    through one pooled runner, reused by the next request."""
    from specviz.methods.dflash.runner import EagerDFlashRunner, StaticDFlashRunner

    dec = decoders["eager"]
    head = dec.heads["dflash"]
    ids = list(range(2, 60))
    feats = target_features(dec, ids, head.config.taps)  # [58, F]
    eager, static = EagerDFlashRunner(head), StaticDFlashRunner(head, max_len=64)
    start = 0
    with torch.no_grad():
        for c in (13, 1, BLOCK, 3, BLOCK, 2, 5):
            n = start + c
            want = eager.step(feats[start:n], start, ids[n])
            got = static.step(feats[start:n], start, ids[n])
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
            for k_s, v_s, k_e, v_e in zip(static.keys, static.values, eager.cache.keys, eager.cache.values):
                torch.testing.assert_close(k_s[:, :, :n], k_e, rtol=1e-5, atol=1e-5)
                torch.testing.assert_close(v_s[:, :, :n], v_e, rtol=1e-5, atol=1e-5)
            start = n
        with pytest.raises(ValueError, match="holds 64 positions"):
            static.step(feats[:10], 58, 3)
    sdec = decoders["static"]
    sdec.generate(PROMPT, method="dflash", num_speculative_tokens=3, max_new_tokens=6)
    first = sdec.current_proposer.runner
    sdec.generate(PROMPT, method="dflash", num_speculative_tokens=3, max_new_tokens=6)
    assert isinstance(first, StaticDFlashRunner) and sdec.current_proposer.runner is first


def test_mask_token_is_never_drafted(decoders):
    """A head that ranks MASK (pad = 1) first everywhere still never drafts it: greedy takes the
    next token, and at T > 0 q(MASK) = 0."""
    from specviz.proposer import Outcome, StepContext

    dec = decoders["eager"]
    real = dec.heads["dflash"]
    oracle = dec.encode(PROMPT) + _plain(dec)
    stub = OracleBlock(real.config, oracle, favour_mask=True)
    dec.heads["dflash"] = stub
    try:
        greedy = dec.generate(PROMPT, method="dflash", num_speculative_tokens=7, max_new_tokens=16)
        sampled = dec.generate(PROMPT, method="dflash", num_speculative_tokens=7, max_new_tokens=16,
                               temperature=1.0, verify="standard", seed=0)
    finally:
        dec.heads["dflash"] = real
    mask = real.config.mask_token_id
    for tr in (greedy, sampled):
        assert all(mask not in s.draft_token_ids for s in tr.steps)
        assert all(sl["top_token_id"] != mask for s in tr.steps for sl in s.match.get("slots", []))
    assert greedy.output_token_ids == _plain(dec) and sum(s.num_accepted for s in greedy.steps) > 8
    prop = DFlashProposer(stub, 3)
    feats = target_features(dec, oracle[:5], prop.taps)
    prop.observe(Outcome(0, [], 0, oracle[1:6], {t: f for t, f in zip(prop.taps, feats.split(D, dim=-1))}))
    draft = prop.propose(oracle[:6], 3, StepContext(temperature=1.0, generator=torch.Generator().manual_seed(0)))
    assert draft.probs.shape == (3, real.config.vocab_size) and float(draft.probs[:, mask].max()) == 0.0


def test_bad_k_and_missing_head_are_clear_errors(dflash_dirs, decoders):
    target, head_dir = dflash_dirs
    with pytest.raises(ValueError, match="num_speculative_tokens must be >= 1"):
        DFlashProposer(decoders["eager"].heads["dflash"], 0)
    # k above B - 1 drafts one block's B - 1, as Medusa drafts one token per head, and the trace says so
    over = decoders["eager"].generate(PROMPT, method="dflash", num_speculative_tokens=9, max_new_tokens=12)
    assert max(len(s.draft_token_ids) for s in over.steps) == 7
    assert over.config["draft_note"].startswith("dflash drafts at most 7 tokens per step (one block of B = 8")
    assert "positions 8-9 are never filled" in over.config["draft_note"]
    from specviz.methods.dflash.view import dflash_figure

    assert max(dflash_figure(over, 0).data[-1].x) == 7  # the run's rate line stops at the block's last slot
    assert "draft_note" not in decoders["eager"].generate(PROMPT, method="dflash", num_speculative_tokens=7,
                                                          max_new_tokens=4).config
    dec = SpecDecoder.from_pretrained(target, device="cpu", dtype="float32")
    with pytest.raises(ValueError, match="method 'dflash' needs a DFlash block drafter.*heads="):
        dec.generate(PROMPT, method="dflash")
    with pytest.raises(ValueError, match="not a specviz-dflash-v1"):
        from specviz.methods.eagle.head import build_head
        from specviz.methods.eagle.config import head_config_from_target
        from specviz.heads import save_head

        eagle = head_dir.parent / "eagle"
        save_head(build_head(head_config_from_target(dec.target_model.config, "eagle")), eagle)
        SpecDecoder.from_pretrained(target, device="cpu", dtype="float32", heads={"dflash": str(eagle)})


def test_cli_dflash(dflash_dirs, capsys):
    from specviz.cli import main

    target, head = dflash_dirs
    common = cli_args(target, 7, "--method", "dflash")
    assert main([*common, "--dflash-head", str(head)]) == 0
    assert "mean acceptance length" in capsys.readouterr().out
    assert main(common) == 2
    assert "needs a DFlash block drafter" in capsys.readouterr().err


# ---- lossless sampling: chi-square per position, small vocabulary ---------------------------------


@pytest.fixture(scope="module")
def small_decoder(tmp_path_factory):
    """A 4-layer random Llama over V = 8 word tokens (no EOS) with a random DFlash head (B = 4, MASK = 7)."""
    root = tmp_path_factory.mktemp("dflash-small")
    model = save_small_word_target(root)
    torch.manual_seed(5)
    head = DFlashHead(dflash_config_from_target(model.config, num_layers=1, block_size=4, mask_token_id=7), model)
    with torch.no_grad():  # sharpen the random head so that its drafts are accepted often
        head.norm.weight.mul_(4.0)
    save_dflash(head, root / "dflash", dtype=torch.float32)
    return SpecDecoder.from_pretrained(root / "target", device="cpu", dtype="float32",
                                       heads={"dflash": str(root / "dflash")})


@pytest.mark.parametrize("verify,sampling", (("standard", dict(temperature=0.9)),
                                             ("block", dict(temperature=1.0, top_p=0.8)),
                                             ("standard", dict(temperature=0.8, top_k=4))))
def test_sampling_is_lossless_per_position(small_decoder, verify, sampling):
    """T > 0, k = 2: the first and second generated tokens are distributed as the target's;
    chi-square over 400 seeded runs (bins with expected count < 5 merged), p > 0.001."""
    dec, prompt, trials = small_decoder, [1, 6, 2, 3], 400
    counts, accepted = first_two(dec, prompt, trials, "dflash", num_speculative_tokens=2, verify=verify, **sampling)
    assert 0.1 * trials < accepted < 1.9 * trials  # drafts are accepted and rejected
    for i, p in enumerate(exact_marginals(dec, prompt, **sampling)):
        assert chi2_pvalue(counts[i], p, trials) > 1e-3, (verify, i, counts[i].tolist())


def test_sampled_q_is_the_processed_slot_distribution(small_decoder):
    """At T > 0 with top-k / top-p, Draft.probs[i] = logits_to_probs(slot i+1's logits with MASK at
    -inf) of the one block forward, and d_i lies in its support."""
    from specviz.proposer import Outcome, StepContext
    from specviz.sampling import logits_to_probs

    dec = small_decoder
    head = dec.heads["dflash"]
    prop = DFlashProposer(head, num_speculative_tokens=3)
    prompt = [1, 6, 2, 3, 4]
    feats = target_features(dec, prompt[:-1], prop.taps)
    prop.observe(Outcome(0, [], 0, prompt[1:], {t: f for t, f in zip(prop.taps, feats.split(32, dim=-1))}))
    ctx = StepContext(temperature=0.7, generator=torch.Generator().manual_seed(0), top_k=5, top_p=0.9)
    draft = prop.propose(prompt, 3, ctx)
    with torch.no_grad():
        lg = head(feats, torch.arange(4), torch.tensor([4, 7, 7, 7]), torch.arange(4, 8), DFlashCache())[1:]
    lg[:, 7] = float("-inf")
    want = logits_to_probs(lg, 0.7, 5, 0.9)
    torch.testing.assert_close(draft.probs, want)
    assert all(want[i, int(t)] > 0 for i, t in enumerate(draft.token_ids))


@pytest.mark.gpu
def test_static_graphs_equal_eager_on_gpu(dflash_dirs):
    """fp32 on CUDA: the static runner with CUDA graphs gives the eager runner's tokens and per-step
    acceptances, greedy and seeded sampling, and method none's tokens."""
    target, head = dflash_dirs
    assert_static_graphs_equal_eager(runner_decoders(target, {"dflash": head}, device="cuda"), "dflash", 7, "block")


def test_dflash_views(decoders):
    """The app's 'where the draft came from' panel for dflash traces (looked up by method name): the
    root and all B-1 slots of the block with each slot's top token and confidence, the target's
    decision per drafted slot, the undrafted slots marked, and what was kept; the figure shows the
    step's per-slot confidence next to the run's per-position acceptance."""
    from specviz.viz.source import source_figure, source_html

    dec = decoders["eager"]
    real = dec.heads["dflash"]
    ids = dec.encode(PROMPT)
    dec.heads["dflash"] = OracleBlock(real.config, ids + _plain(dec), wrong={len(ids) + 3})
    try:
        tr = dec.generate(PROMPT, method="dflash", num_speculative_tokens=5, max_new_tokens=16)
    finally:
        dec.heads["dflash"] = real
    st = next(s for s in tr.steps if 0 < s.num_accepted < len(s.draft_token_ids))
    page = source_html(tr, st.index, st.num_accepted + 1)
    assert "sv-dflash" in page and page.count("data-slot=") == BLOCK  # root + B-1 slots
    fates = [f"data-fate='{position_fate}'" for position_fate in
             ["accepted"] * st.num_accepted + ["rejected"] + ["unused"] * (5 - st.num_accepted - 1)
             + ["not drafted"] * (BLOCK - 1 - 5)]
    assert [page.count(f) for f in set(fates)] == [fates.count(f) for f in set(fates)]
    assert f"it kept {st.num_accepted} (accepted)" in page and "<b>one</b> forward" in page
    assert f"data-slot='{st.num_accepted + 1}' data-fate='rejected' style='min-width:74px;max-width:110px;" \
           "padding:4px 6px;border:2px solid" in page  # the selected slot is outlined
    for slot in st.match["slots"]:
        assert 0.0 < slot["top_prob"] <= 1.0 and slot["token_id"] == slot["top_token_id"]  # greedy: top = drawn
    fig = source_figure(tr, st.index)
    want = ["accepted"] * st.num_accepted + ["rejected"] + ["unused"] * (4 - st.num_accepted) + ["not drafted"] * 2
    assert [t.name for t in fig.data] == [*dict.fromkeys(want), "run: blocks keeping ≥ i"]
    assert sorted(x for t in fig.data[:-1] for x in t.x) == list(range(1, BLOCK))
    assert [f for t in fig.data[:-1] for f in [t.name] * len(t.x)] == want
    assert list(fig.data[-1].y) == tr.metrics["acceptance_rate_per_position"]
    tr.steps[0].match = {"kind": "dflash"}  # a step without a block (no room left to draft)
    assert "drafted nothing" in source_html(tr, 0)
    assert "no DFlash block" in source_figure(tr, 0).layout.annotations[0].text


def test_sampled_slots_show_the_token_drawn_not_the_top_one(decoders):
    """At T > 0 a slot's draft is the token drawn from q, which the target verified: the cell and the bar name it
    (with q of it), the top token only beside it. A rejected slot must not headline its top token, which may be the
    very token the target then recovered."""
    from specviz.methods.dflash.view import dflash_figure, dflash_html

    dec = decoders["eager"]
    tr = dec.generate(PROMPT, method="dflash", num_speculative_tokens=5, max_new_tokens=24, temperature=1.0,
                      verify="standard", seed=0)
    st, slot = next((s, sl) for s in tr.steps for sl in s.match.get("slots", [])
                    if sl.get("drafted") and sl["token_id"] != sl["top_token_id"])
    assert st.draft_token_ids[slot["slot"] - 1] == slot["token_id"]
    cell = dflash_html(tr, st.index).split(f"<div data-slot='{slot['slot']}'")[1].split("<div data-slot=")[0]
    drawn, top = (html_token(tr, slot[key], quote=True) for key in ("token_id", "top_token_id"))
    assert cell.index(drawn) < cell.index(f"top <code>{top}</code>") and f"q {slot['draft_prob']:.2f}" in cell
    fig = dflash_figure(tr, st.index)
    bars = {x: y for t in fig.data[:-1] for x, y in zip(t.x, t.y)}
    assert bars[slot["slot"]] == pytest.approx(slot["draft_prob"])
    from specviz.methods.dflash.view import draft_why
    from specviz.viz.common import fmt_prob, quoted

    assert f"slot {slot['slot']} → {quoted(tr, slot['token_id'])} (q {fmt_prob(slot['draft_prob'])})" in \
        draft_why(tr, st)  # the lesson's sentence too
    ticks = dict(zip(fig.layout.xaxis.tickvals, fig.layout.xaxis.ticktext))  # labels under the axis, not on bars
    assert ticks[slot["slot"]] == f"{slot['slot']}<br>{html_token(tr, slot['token_id'])[:8]}"
    assert all(t.text is None for t in fig.data)


def html_token(trace, token_id, quote=False):
    import html

    from specviz.viz.common import token_text, visible

    return html.escape(visible(token_text(trace, int(token_id))), quote=quote)


@pytest.mark.gpu
@pytest.mark.parametrize("settings", (dict(), dict(verify="standard", temperature=0.8, top_p=0.9)),
                         ids=("greedy", "standard"))
def test_at_most_one_wait_per_step_on_gpu(dflash_dirs, monkeypatch, settings):
    """The one-host-wait rule for dflash too (counted as in tests/test_gpu_syncs.py): no host sync in a warm
    step beyond the verifier's one wait (sampled drafts by the exponential race, the per-slot numbers
    by a queued pinned copy read in observe)."""
    from test_gpu_syncs import PROMPT as SYNC_PROMPT
    from test_gpu_syncs import count_waits

    target, head = dflash_dirs
    dec = SpecDecoder.from_pretrained(target, device="cuda", dtype="float32", runner="static",
                                      heads={"dflash": str(head)})
    kw = dict(method="dflash", num_speculative_tokens=7, max_new_tokens=48, seed=1, **settings)
    for _ in range(2):
        dec.generate(SYNC_PROMPT, **kw)
    steps = count_waits(dec, monkeypatch, **kw)[1:]
    core = {id(g.core_done) for g in dec.step_verifier.graphs.values()}
    for i, s in enumerate(steps, start=1):
        assert not s["syncs"], f"step {i}: host syncs beyond the verifier's wait: {s['syncs']}"
        assert sum(id(e) in core for e in s["waits"]) == 1, f"step {i}: waits {s['waits']}"


def test_lesson_tells_the_block(decoders):
    """Lesson mode's draft chapter of a dflash step says the block came from one forward and names
    the drafted slots with their confidence (from the trace's numbers)."""
    from specviz.viz.lesson import lesson_chapters

    dec = decoders["eager"]
    tr = dec.generate(PROMPT, method="dflash", num_speculative_tokens=3, max_new_tokens=8)
    chapters = lesson_chapters(tr)
    assert "method dflash (a block drafter" in chapters[0].text
    draft = next(c for c in chapters if c.kind == "draft" and c.step == 0)
    assert "DFlash ran <b>one</b> forward" in draft.text and draft.text.count("confidence") == 3


def test_rope_frequencies_stay_float32_in_bf16(dflash_dirs):
    """A head cast to bf16 (as load_dflash does for a bf16 target) keeps RoPE's inv_freq in fp32,
    like the target's, so the angles at large positions are the trained ones."""
    from specviz.methods.dflash.head import load_dflash
    from specviz.models import load_model

    target_dir, head_dir = dflash_dirs
    target = load_model(target_dir, torch.device("cpu"), torch.bfloat16)
    head = load_dflash(head_dir, target)
    assert head.fc.weight.dtype == torch.bfloat16
    rot = head.rotary_emb
    assert rot.inv_freq.dtype == torch.float32 == target.model.rotary_emb.inv_freq.dtype
    torch.testing.assert_close(rot.inv_freq, target.model.rotary_emb.inv_freq)


def test_comparison_runs_dflash_beside_none(decoders):
    """The Compare view's engine (specviz.compare) runs dflash like any registered method: pooled
    metrics from committed tokens, method none added at the same temperature, outputs equal at T = 0."""
    from specviz.compare import RunConfig, new_comparison, run_comparison, table

    dec = decoders["eager"]
    c = run_comparison(dec, new_comparison([RunConfig("dflash", 7, None, 0.0)], [PROMPT], [0], max_new_tokens=12))
    rows = {r["method"]: r for r in table(c)}
    assert set(rows) == {"dflash", "none"} and rows["dflash"]["k"] == 7
    assert rows["dflash"]["tokens"] == rows["none"]["tokens"] == 12 and rows["dflash"]["mean_acceptance_length"] >= 1
    i = next(j for j, cfg in enumerate(c.configs) if cfg.method == "dflash")
    (mine,), (plain,) = c.runs_of(i), c.runs_of(c.baseline_of(i))
    assert mine.trace.output_token_ids == plain.trace.output_token_ids


BUNDLED = __import__("specviz.loading", fromlist=["bundled_heads"]).bundled_heads()["dflash"]


@pytest.mark.skipif(not (BUNDLED / "model.safetensors").exists(), reason="the bundled DFlash head is not trained yet")
@pytest.mark.parametrize("runner", ("eager", "static"))
def test_bundled_head_greedy_equals_plain_greedy(runner):
    """The trained head in assets/models/specviz-dflash on the bundled target (fp32 CPU): greedy
    output equals method none's token for token, one drafter forward per drafting step, and it
    drafts tokens the target accepts (a trained head, not a random one)."""
    dec = SpecDecoder.from_pretrained(device="cpu", dtype="float32", runner=runner)
    assert "dflash" in dec.heads, dec.head_errors
    accepted = drafts = 0
    for prompt in (PROMPT, "import torch\n\n\nclass Linear(torch.nn.Module):\n    def __init__(self"):
        want = dec.generate(prompt, method="none", max_new_tokens=32).output_token_ids
        tr = dec.generate(prompt, method="dflash", num_speculative_tokens=7, max_new_tokens=32)
        assert tr.output_token_ids == want, (runner, prompt)
        assert dec.current_proposer.forwards == sum(1 for s in tr.steps if s.draft_token_ids)
        accepted += tr.metrics["num_accepted_tokens"]
        drafts += tr.metrics["num_drafts"]
    assert accepted / drafts > 0.3, (accepted, drafts)
