"""Trace JSON validation (uploads are data: checked, size-capped, never executed) and metrics."""

from __future__ import annotations

import json

import pytest

from specviz.trace import Emitted, Step, Trace, TraceFormatError, compute_metrics

PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a"


@pytest.fixture(scope="module")
def trace_json(self_decoders):
    return self_decoders["llama"].generate(PROMPT, method="draft_model", num_speculative_tokens=3,
                                           max_new_tokens=10).to_json()


def _mutate(text: str, fn) -> str:
    data = json.loads(text)
    fn(data)
    return json.dumps(data)


BAD = [
    ("not json", lambda t: "{nope", "not valid JSON"),
    ("a list", lambda t: "[1, 2]", "must be an object"),
    ("wrong version", lambda t: _mutate(t, lambda d: d.update(version=99)), "version"),
    ("missing config", lambda t: _mutate(t, lambda d: d.pop("config")), "config is missing"),
    ("steps not a list", lambda t: _mutate(t, lambda d: d.update(steps={"a": 1})), "steps must be a list"),
    ("string token id", lambda t: _mutate(t, lambda d: d.update(output_token_ids=["1"])), "list of integers"),
    ("bad position type", lambda t: _mutate(t, lambda d: d["steps"][0]["positions"][0].update(p="high")),
     r"positions\[0\].p must be"),
    ("missing emitted", lambda t: _mutate(t, lambda d: d["steps"][0].pop("emitted")), "emitted must be an object"),
    ("NaN", lambda t: t.replace('"wall_time_s": ', '"wall_time_s": NaN, "x": '), "must be finite"),
    # a token the trace's own vocabulary does not have (it was drawn as <999999999>)
    ("token outside the vocabulary", lambda t: _mutate(t, lambda d: d["steps"][0]["emitted"].update(token_id=999999999)),
     r"steps\[0\].emitted.token_id holds token id 999999999, outside the trace's vocabulary"),
    ("negative output id", lambda t: _mutate(t, lambda d: d["output_token_ids"].__setitem__(0, -5)),
     "output_token_ids holds token id -5"),
    # 200 KB that json's recursive parser cannot read: a RecursionError before this check
    ("nested too deeply", lambda t: "[" * 100_000 + "]" * 100_000, "nests too deeply"),
]


@pytest.mark.parametrize("name,make,message", BAD, ids=[b[0] for b in BAD])
def test_malformed_traces_are_refused(trace_json, name, make, message):
    with pytest.raises(TraceFormatError, match=message):
        Trace.from_json(make(trace_json))


def test_size_cap(trace_json):
    with pytest.raises(TraceFormatError, match="limit"):
        Trace.from_json(trace_json, max_bytes=100)


def test_valid_trace_loads(trace_json):
    trace = Trace.from_json(trace_json)
    assert trace.steps and isinstance(trace.steps[0].emitted, Emitted)
    assert trace.metrics["draft_acceptance_rate"] == 1.0


def _step(k: int, acc: int) -> Step:
    emitted = Emitted(position=acc + 1, token_id=0, kind="bonus" if acc == k else "recovered", p=0.5)
    return Step(index=0, proposer="x", draft_token_ids=list(range(k)), num_accepted=acc, emitted=emitted,
                positions=[], committed_token_ids=list(range(acc + 1)))


def test_metrics_follow_vllm_definitions():
    steps = [_step(3, 3), _step(3, 1), _step(3, 0), _step(0, 0), _step(2, 2)]
    m = compute_metrics(steps, 3)
    assert m["num_drafts"] == 4  # the k' = 0 step drafted nothing
    assert m["num_draft_tokens"] == 11 and m["num_accepted_tokens"] == 6
    assert m["mean_acceptance_length"] == pytest.approx(1 + 6 / 4)
    assert m["draft_acceptance_rate"] == pytest.approx(6 / 11)
    assert m["accepted_per_position"] == [3, 2, 1]
    assert m["acceptance_rate_per_position"] == pytest.approx([3 / 4, 2 / 4, 1 / 4])
    # position 3 was offered to steps that drafted >= 3 and accepted >= 2: only the first (k'=2 step excluded)
    assert m["conditional_acceptance_rate"] == pytest.approx([3 / 4, 2 / 3, 1 / 1])
    assert m["acceptance_histogram"] == [1, 1, 1, 1]
    assert m["num_generated_tokens"] == 4 + 2 + 1 + 1 + 3
