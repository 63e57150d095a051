"""Method none as the comparison's baseline: timed several times per prompt and seed, spread over the running order,
its median timing kept, so that one slow timing of method none on a busy CPU does not move every speedup of its
prompt and seed (a lecturer saw the measured speedups of identical comparisons move by about 15 %)."""

from __future__ import annotations

import json

import pytest

from specviz.compare import (BASELINE_TIMINGS, Prompt, RunConfig, iter_comparison, load_comparison, new_comparison,
                             plan, table)
from specviz.compare.run import add_timing
from specviz.trace import Emitted, Step, Trace


def _trace(method: str, verify_ms: float, tokens: int = 4, seed: int = 0) -> Trace:
    """``tokens`` one-token steps of ``verify_ms`` each: decode tokens/s = 1000 / verify_ms."""
    steps = [Step(index=i, proposer=method, draft_token_ids=[], num_accepted=0,
                  emitted=Emitted(position=1, token_id=5 + i, kind="target", p=0.5), positions=[],
                  committed_token_ids=[5 + i], timings_ms={"draft": 0.0, "verify": verify_ms, "sample": 0.0})
             for i in range(tokens)]
    return Trace(config={"method": method, "num_speculative_tokens": 1 if method == "none" else 2, "verify": "greedy",
                         "temperature": 0.0, "seed": seed}, prompt_token_ids=[1, 2], steps=steps,
                 output_token_ids=[5 + i for i in range(tokens)])


class FakeDecoder:
    """Answers every request with the same tokens; method none's requests take the next of ``none_ms`` per step, the
    others ``other_ms``. Records the methods in the order they ran."""

    device = "cpu"

    def __init__(self, none_ms: list[float], other_ms: float = 5.0):
        self.none_ms, self.other_ms, self.ran = list(none_ms), other_ms, []

    def generate(self, prompt: str, method: str, seed: int = 0, **_):
        self.ran.append(method)
        return _trace(method, self.none_ms.pop(0) if method == "none" else self.other_ms, seed=seed)


def _configs(n: int) -> list[RunConfig]:
    return [RunConfig("ngram", k) for k in range(1, n + 1)]


def test_plan_times_method_none_before_between_and_after_the_others():
    c = new_comparison(_configs(4), [Prompt("a", "x"), Prompt("b", "y")], [0, 1], 8)
    assert c.baseline_timings == BASELINE_TIMINGS == 3
    order = [cfg for cfg, p, s in plan(c) if (p, s) == (0, 0)]
    assert order == [0, 1, 2, 0, 3, 4, 0]  # none, half of the others, none, the other half, none
    assert len(plan(c)) == 4 * (4 + 3)  # every (prompt, seed) alike
    assert [cfg for cfg, p, s in plan(c) if (p, s) == (1, 1)] == order
    one = new_comparison(_configs(1), ["x"], [0], 8)
    assert [cfg for cfg, _, _ in plan(one)].count(0) == 3  # a single other configuration: still three timings
    once = new_comparison(_configs(4), ["x"], [0], 8, baseline_timings=1)
    assert [cfg for cfg, _, _ in plan(once)] == [0, 1, 2, 3, 4]  # the order before
    with pytest.raises(ValueError, match="baseline_timings"):
        new_comparison(_configs(1), ["x"], [0], 8, baseline_timings=0)


def test_the_median_timing_is_kept_even_when_an_earlier_one_was_dropped():
    c = new_comparison(_configs(1), ["x"], [0], 8)
    dec = FakeDecoder(none_ms=[10.0, 12.5, 8.0])  # 100, 80 and 125 tokens/s: the median is the first timing
    runs = list(iter_comparison(dec, c, warm=False))
    assert [r.config for r in runs] == [0, 1]  # each request yielded once, at its first timing
    none = c.runs_of(0)[0]
    assert none.timings == pytest.approx([100.0, 80.0, 125.0])
    assert none.trace.steps[0].timings_ms["verify"] == 10.0  # the median timing's trace
    assert dec.ran == ["none", "none", "ngram", "none"]
    traces: list = []
    run = c.runs_of(1)[0]
    add_timing(run, _trace("ngram", 4.0), 0.1, traces)  # 250 tokens/s after 200: the faster of an even count
    assert run.timings == pytest.approx([200.0, 250.0]) and run.trace.steps[0].timings_ms["verify"] == 4.0


def test_one_slow_timing_of_method_none_no_longer_moves_every_speedup():
    """A busy spell during method none's first timing made it 3x slower: with one timing the baseline pooled over both
    prompts halved and every speedup doubled; with three timings spread over the comparison the median stays the
    calm one."""
    prompts = [Prompt("a", "x"), Prompt("b", "y")]
    calm = new_comparison(_configs(2), prompts, [0], 8)
    list(iter_comparison(FakeDecoder([10.0] * 6), calm, warm=False))
    busy = new_comparison(_configs(2), prompts, [0], 8)
    list(iter_comparison(FakeDecoder([30.0, 10.0, 10.0, 10.0, 10.0, 10.0]), busy, warm=False))
    for row_calm, row_busy in zip(table(calm), table(busy)):
        assert row_busy["speedup"] == pytest.approx(row_calm["speedup"])
    assert table(busy)[1]["speedup"] == pytest.approx(2.0)
    once = new_comparison(_configs(2), prompts, [0], 8, baseline_timings=1)
    list(iter_comparison(FakeDecoder([30.0, 10.0]), once, warm=False))
    assert table(once)[1]["speedup"] == pytest.approx(4.0)  # before: the pooled baseline halved by one slow timing


def test_method_nones_row_shows_how_far_its_own_timings_moved():
    c = new_comparison(_configs(2), [Prompt("a", "x"), Prompt("b", "y")], [0], 8)
    list(iter_comparison(FakeDecoder([10.0, 20.0, 8.0, 10.0, 10.0, 10.0]), c, warm=False))
    none = table(c)[0]
    s = none["speedup_spread"]  # prompt a: 100, 50, 125 tokens/s around the median 100; prompt b: all 100
    assert (s["n"], s["low"], s["high"]) == (6, pytest.approx(0.5), pytest.approx(1.25))
    # one slow timing of six moves the range, not the middle half: not noisy (a range rule fires more often as n grows)
    assert not s["noisy"]
    assert none["speedup"] == pytest.approx(1.0)
    c2 = new_comparison(_configs(2), [Prompt("a", "x"), Prompt("b", "y")], [0], 8)
    list(iter_comparison(FakeDecoder([10.0, 20.0, 8.0, 10.0, 5.0, 14.0]), c2, warm=False))
    assert table(c2)[0]["speedup_spread"]["noisy"]  # ratios 0.5, 0.71, 1, 1, 1.25, 2: the middle half spreads
    assert table(c)[1]["speedup_spread"]["n"] == 2  # a drafting row: one ratio per (prompt, seed), as before


def test_timings_round_trip_and_older_files_load_as_timed_once():
    c = new_comparison(_configs(1), ["x"], [0], 8)
    list(iter_comparison(FakeDecoder([10.0, 12.5, 8.0]), c, warm=False))
    back = load_comparison(c.to_json())
    assert back.baseline_timings == 3 and back.runs_of(0)[0].timings == c.runs_of(0)[0].timings
    assert back.runs_of(1)[0].timings == [] and table(back) == table(c)
    old = json.loads(c.to_json())
    del old["baseline_timings"]
    for r in old["runs"]:
        r.pop("timings", None)
    older = load_comparison(json.dumps(old))
    assert older.baseline_timings == 1 and older.runs_of(0)[0].timings == []
    old["runs"][0]["timings"] = ["fast"]
    with pytest.raises(ValueError, match=r"runs\[0\].timings\[0\]"):
        load_comparison(json.dumps(old))
