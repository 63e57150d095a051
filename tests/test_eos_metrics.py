"""Metrics after a stop inside a step: the trace keeps the sampler's decision
(``num_accepted``) and what was committed; every metric counts only committed tokens, and a
drafting step counts accepted = committed tokens - 1 (vLLM's len(output) - 1), so the mean
acceptance length's two forms, 1 + accepted / drafts and committed tokens of drafting steps /
drafts, are one number for runs stopped by EOS, by max_new_tokens or by the user.

An identical-copy draft (draft = target) accepts every greedy draft, so choosing which token
counts as EOS puts the stop at a chosen slot of the first step."""

from __future__ import annotations

import pytest

from specviz.trace import RunMetrics, compute_metrics
from specviz.viz import estimated_alpha

PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a"


def _first_new(plain: list[int]) -> int:
    """An index >= 2 whose token does not occur earlier (so it can play EOS there)."""
    return next(i for i in range(2, len(plain)) if plain[i] not in plain[:i])


def _run_with_eos(dec, eos: int, **kw):
    saved = dec.eos_token_ids
    dec.eos_token_ids = {eos}
    try:
        return dec.generate(PROMPT, method="draft_model", **kw)
    finally:
        dec.eos_token_ids = saved


def _check_committed_metrics(trace) -> dict:
    """The metrics agree with counts taken from the committed tokens alone, and both forms of the mean
    acceptance length give the same number."""
    m = trace.metrics
    drafting = [s for s in trace.steps if s.draft_token_ids]
    out = trace.output_token_ids
    assert sum(len(s.committed_token_ids) for s in trace.steps) == len(out) == m["num_generated_tokens"]
    for s in drafting:  # committed = accepted prefix (+ the emitted token if it was kept)
        a = s.num_accepted_committed
        assert s.committed_token_ids[:a] == s.draft_token_ids[:a]
        assert s.emitted_committed == (len(s.committed_token_ids) == a + 1)
    committed = sum(len(s.committed_token_ids) for s in drafting)
    assert m["num_accepted_tokens"] == committed - len(drafting)  # every drafting step: 1 + accepted tokens
    assert m["mean_acceptance_length"] == pytest.approx(committed / len(drafting))
    assert m["mean_acceptance_length"] == pytest.approx(1 + m["num_accepted_tokens"] / len(drafting))
    assert m["num_drafting_step_tokens"] == committed
    assert RunMetrics.of(trace).to_dict() == m  # every view computes the same numbers from the steps
    return m


@pytest.mark.parametrize("arch", ("llama", "qwen2"))
@pytest.mark.parametrize("case", ("mid_block", "last_draft", "bonus"))
def test_eos_inside_first_step(self_decoders, arch, case):
    dec = self_decoders[arch]
    plain = dec.generate(PROMPT, method="none", max_new_tokens=20).output_token_ids
    idx = _first_new(plain)  # EOS is the (idx+1)-th generated token
    k = {"mid_block": idx + 2, "last_draft": idx + 1, "bonus": idx}[case]
    trace = _run_with_eos(dec, plain[idx], num_speculative_tokens=k, max_new_tokens=20)
    assert trace.output_token_ids == plain[: idx + 1] and trace.stop_reason == "eos"
    assert len(trace.steps) == 1
    step = trace.steps[0]
    m = _check_committed_metrics(trace)
    n = idx + 1  # tokens committed
    if case == "bonus":  # the EOS is the bonus token: nothing is cut
        assert step.num_accepted == k and step.emitted_committed and step.emitted.kind == "bonus"
        assert m["num_accepted_tokens"] == k and m["mean_acceptance_length"] == k + 1 == n
        assert m["num_discarded_draft_tokens"] == 0
    else:  # the sampler accepted all k drafts (and drew a bonus); the stop kept only n drafts, the EOS last
        assert step.num_accepted == k and not step.emitted_committed
        assert step.num_accepted_committed == n and step.num_drafts_discarded == k - n
        # the EOS counts as the step's own token: n - 1 accepted, the drafts from the EOS's depth on discarded
        assert m["num_accepted_tokens"] == n - 1 and m["num_cut_steps"] == 1
        assert m["num_discarded_draft_tokens"] == k - n + 1
        assert m["mean_acceptance_length"] == pytest.approx(n) == m["tokens_per_step"]
    assert m["draft_acceptance_rate"] == 1.0  # an identical draft: nothing was rejected
    assert m["acceptance_histogram"] == [0] * m["num_accepted_tokens"] + [1] + [0] * (k - m["num_accepted_tokens"])
    assert m["accepted_per_position"] == [1] * m["num_accepted_tokens"] + [0] * (k - m["num_accepted_tokens"])
    assert m["conditional_acceptance_rate"][: m["num_accepted_tokens"]] == [1.0] * m["num_accepted_tokens"]
    assert estimated_alpha(trace) == 1.0
    assert RunMetrics.from_steps(trace.steps, k).mean_acceptance_length == m["mean_acceptance_length"]


@pytest.mark.parametrize("max_new", (2, 3, 4, 6))
def test_max_new_tokens_inside_a_block_commits_every_counted_token(self_decoders, max_new):
    """max_new_tokens shortens the draft (k' <= remaining - 1), so the step is never cut: every
    counted token is committed, and mean acceptance length equals tokens per drafting step."""
    dec = self_decoders["llama"]
    trace = _run_with_eos(dec, -1, num_speculative_tokens=5, max_new_tokens=max_new)
    assert len(trace.output_token_ids) == max_new and trace.stop_reason == "max_new_tokens"
    m = _check_committed_metrics(trace)
    assert m["num_discarded_draft_tokens"] == 0
    assert all(s.emitted_committed for s in trace.steps)
    assert m["num_accepted_tokens"] == m["num_draft_tokens"] == max_new - len(trace.steps)


def test_synthetic_cut_step_counts():
    """compute_metrics on hand-built steps: one normal step (2 of 3 accepted + recovered), one cut
    by EOS after its first of 3 accepted drafts."""
    from specviz.trace import Emitted, Step

    def step(i, drafts, acc, committed):
        return Step(index=i, proposer="ngram", draft_token_ids=drafts, num_accepted=acc,
                    emitted=Emitted(position=acc + 1, token_id=9, kind="recovered", p=0.5), positions=[],
                    committed_token_ids=committed)

    steps = [step(0, [1, 2, 3], 2, [1, 2, 9]), step(1, [4, 5, 6], 3, [4])]
    m = compute_metrics(steps, 3)
    # step 1 kept one token, its own (the EOS): 0 accepted, all 3 drafts discarded
    assert m["num_accepted_tokens"] == 2 and m["num_discarded_draft_tokens"] == 3
    assert m["mean_acceptance_length"] == pytest.approx((3 + 1) / 2) == pytest.approx(1 + 2 / 2)
    assert m["draft_acceptance_rate"] == pytest.approx(2 / 3)
    assert m["accepted_per_position"] == [1, 1, 0] and m["acceptance_histogram"] == [1, 0, 1, 0]
    assert m["offered_per_position"] == [1, 1, 1]  # step 1 reached no position: nothing of it was verified
    assert m["conditional_acceptance_rate"] == [1.0, 1.0, 0.0]
    assert m["alpha"] == pytest.approx(2 / 3)


def _check_totals(trace) -> RunMetrics:
    """A (partial or finished) trace's totals: the prefill + one target forward per step, a wall time that ran,
    and the mean acceptance length's two forms equal."""
    m = RunMetrics.of(trace)
    assert m.target_forward_passes == len(trace.steps) + 1 == trace.target_forward_passes
    assert trace.wall_time_s > 0 and m.wall_time_s == trace.wall_time_s
    assert m.tokens_per_second == pytest.approx(m.num_generated_tokens / trace.wall_time_s)
    assert m.num_drafts and m.mean_acceptance_length == pytest.approx(1 + m.num_accepted_tokens / m.num_drafts)
    assert m.mean_acceptance_length == pytest.approx(m.num_drafting_step_tokens / m.num_drafts)
    return m


def test_user_stopped_run_counts_its_forwards_and_wall_time(self_decoders):
    """A run stopped by the user (closing iter_generate, as the app's Stop does) counts its target forwards and wall
    time truly, in every partial trace it yielded (what the app shows when Stop cancels the stream) and at the end."""
    dec = self_decoders["llama"]
    it = dec.iter_generate(PROMPT, method="draft_model", num_speculative_tokens=3, max_new_tokens=60)
    for n, trace in enumerate(it, 1):
        snapshot = _check_totals(trace)
        if n == 3:
            break
    it.close()
    assert trace.stop_reason == "stopped" and len(trace.steps) == 3
    final = _check_totals(trace)
    assert final.wall_time_s >= snapshot.wall_time_s and trace.metrics == final.to_dict()


def test_eos_stopped_run_agrees_in_both_forms(self_decoders):
    """A whole run stopped by an EOS drafted and accepted inside its last step (not its first): the two forms of the
    mean acceptance length are one number, and the totals are the engine's."""
    dec = self_decoders["llama"]
    plain = dec.generate(PROMPT, method="none", max_new_tokens=30).output_token_ids
    idx = next(i for i in range(8, len(plain)) if plain[i] not in plain[:i])  # EOS well after the first step
    trace = _run_with_eos(dec, plain[idx], num_speculative_tokens=4, max_new_tokens=30)
    assert trace.stop_reason == "eos" and trace.output_token_ids == plain[: idx + 1] and len(trace.steps) > 1
    m = _check_committed_metrics(trace)
    _check_totals(trace)
    last = trace.steps[-1]
    assert m["num_cut_steps"] == (0 if last.emitted_committed else 1)
