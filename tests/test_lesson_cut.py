"""A step cut by the stop, told as the metrics count it (specviz.trace.metrics.counted): accepted = committed - 1, the
last kept token (the EOS) the step's own token, the dropped bonus named as dropped; the per-step chapters of a lesson
add up to the statistics chapter's count."""

from __future__ import annotations

import re

from specviz.trace import Emitted, Position, RunMetrics, Step, Trace, compute_metrics
from specviz.trace.metrics import counted
from specviz.viz.lesson import commit_chapter, lesson_chapters, outcome_chapter
from specviz.viz.residual import decision_heading

EOS = 2


def _pos(i: int, tok: int, accepted: bool) -> Position:
    return Position(i, tok, 0.8, 0.6, 0.1 if accepted else 0.99, 1.0, accepted, 0.2, [[tok, 0.8]], [[tok, 0.6]],
                    [[9, 1.0]])


def cut_trace() -> Trace:
    """Three steps, k = 4: step 0 accepts 1 and recovers t8; step 1 accepts all 4 and keeps its bonus t15; step 2
    accepts all 4 with the EOS as its third draft, so the stop keeps 3 tokens and drops the fourth draft and the
    bonus t13."""
    s0 = Step(0, "draft_model", [5, 6, 7, 3], 1, Emitted(2, 8, "recovered", 0.5, [[8, 1.0]]),
              [_pos(1, 5, True), _pos(2, 6, False), _pos(3, 7, False), _pos(4, 3, False)], [5, 8])
    s1 = Step(1, "draft_model", [10, 11, 12, 14], 4, Emitted(5, 15, "bonus", 0.7, [[15, 0.7]]),
              [_pos(i + 1, t, True) for i, t in enumerate([10, 11, 12, 14])], [10, 11, 12, 14, 15])
    s2 = Step(2, "draft_model", [16, 17, EOS, 18], 4, Emitted(5, 13, "bonus", 0.6, [[13, 0.6]]),
              [_pos(i + 1, t, True) for i, t in enumerate([16, 17, EOS, 18])], [16, 17, EOS])
    cfg = {"method": "draft_model", "verify": "standard", "num_speculative_tokens": 4, "temperature": 1.0}
    texts = {str(t): f"t{t}" for t in range(30)} | {str(EOS): "<|endoftext|>"}
    out = [t for s in (s0, s1, s2) for t in s.committed_token_ids]
    tr = Trace(cfg, [1, 4], steps=[s0, s1, s2], output_token_ids=out, token_texts=texts, stop_reason="eos")
    tr.metrics = compute_metrics(tr.steps, 4)
    return tr


def plain(text: str) -> str:
    return re.sub(r"<[^>]+>", "", text)


def _accepted_in(title: str) -> int:
    return int(re.match(r"Step \d+: (\d+) of \d+ draft token\(s\) accepted", title).group(1))


def test_a_cut_step_is_counted_as_the_metrics_count_it():
    tr = cut_trace()
    cut = tr.steps[2]
    assert counted(cut)[0] == 2 and not cut.emitted_committed
    brief = [c for c in lesson_chapters(tr, full_steps=0) if c.kind == "step"]
    assert sum(_accepted_in(c.title) for c in brief) == RunMetrics.of(tr).num_accepted_tokens == 1 + 4 + 2
    title, text = brief[2].title, plain(brief[2].text)
    assert title.startswith("Step 2: 2 of 4 draft token(s) accepted, + 1: the last kept ‘&lt;|endoftext|&gt;’")
    assert "bonus token" not in title and "cut by the stop" in title
    assert "commits 3 token(s)" in text and "2 accepted draft token(s) + 1 = 3" in text
    assert "its last kept token is the step's own token" in text  # the one clause on how a cut step is counted
    assert "dropped" in text and "t13" in text and "+ 1 bonus token" not in text
    assert brief[2].position == 3  # the panels select the EOS, the step's counted own token, not the dropped bonus
    whole = plain(commit_chapter(tr, tr.steps[1]).text)  # an uncut step as before
    assert "commits 5 token(s)" in whole and "(4 accepted draft token(s) + 1 bonus token)" in whole


def test_the_dropped_bonus_is_named_dropped_and_never_yielded():
    tr = cut_trace()
    out = outcome_chapter(tr, tr.steps[2])
    assert out.title.endswith("dropped at the stop") and "yields" not in out.text
    assert "was dropped: it is not in the output" in plain(out.text)
    assert "yields 5 tokens" in outcome_chapter(tr, tr.steps[1]).text
    assert decision_heading(tr, tr.steps[2], 5).endswith("(dropped: the request stopped first)")
    assert decision_heading(tr, tr.steps[1], 5) == "Where did the bonus token ‘t15’ come from?"
