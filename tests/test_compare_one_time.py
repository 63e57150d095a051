"""Compare keeps one-time costs out of its timings (specviz/compare/run.py, stats.timing_check).

A fake method whose proposer is slow on the first call of the process (a compile, say) must not change its row's
timing: the comparison warms every configuration once, untimed, before its first timed run; without that warm-up
the slow first call lands in a timed step, and the row is marked "slow step". A proposer that reports a capture
(``capture_s``, as the graph runners do) inside timed steps has those seconds kept out of the step times, and the
row is marked "capture".
"""

from __future__ import annotations

import csv
import dataclasses
import io
import time

import pytest
import toy_method
from toy_method.proposer import RepeatProposer

from specviz import SpecDecoder, methods
from specviz.compare import RunConfig, new_comparison, run_comparison, table
from specviz.compare.run import iter_comparison

FIRST_CALL_S = 3.0  # the fake compile: far above a tiny model's step (a few ms; ~100 ms on a busy shared CPU)
SLOW = "slow_first"
pytestmark = pytest.mark.usefixtures("one_thread")
CAPTURING = "captures"


class SlowFirstCall(RepeatProposer):
    """repeat_last, with the process's first propose() sleeping FIRST_CALL_S (a one-time cost nobody reports)."""

    name = SLOW
    paid = False

    def propose(self, token_ids, num_tokens=None, context=None):
        if not SlowFirstCall.paid:
            SlowFirstCall.paid = True
            time.sleep(FIRST_CALL_S)
        return super().propose(token_ids, num_tokens, context)


class CapturesEveryCall(RepeatProposer):
    """repeat_last, reporting a 0.05 s capture (and spending it) in every propose(), as a runner that captures."""

    name = CAPTURING

    def __init__(self, *args):
        super().__init__(*args)
        self.capture_s = 0.0

    def propose(self, token_ids, num_tokens=None, context=None):
        t0 = time.perf_counter()
        time.sleep(0.05)
        self.capture_s += time.perf_counter() - t0
        return super().propose(token_ids, num_tokens, context)


def _method(name, cls):
    return dataclasses.replace(toy_method.METHOD, name=name, view=None,
                               make=lambda build: cls(build.options.repeat_lag, build.config.num_speculative_tokens))


@pytest.fixture(scope="module")
def decoder(tiny_dirs):
    for name, cls in ((SLOW, SlowFirstCall), (CAPTURING, CapturesEveryCall)):
        methods.register(_method(name, cls))
    yield SpecDecoder.from_pretrained(tiny_dirs["llama"][0], device="cpu", dtype="float32")
    for name in (SLOW, CAPTURING):
        methods.unregister(name)


def _row(dec, method: str, warm: bool):
    c = new_comparison([RunConfig(method, 3)], ["def add(a, b):\n    return a + b\n"], [0], max_new_tokens=24)
    for _ in iter_comparison(dec, c, warm=warm):
        pass
    return next(r for r in table(c) if r["method"] == method), c


def test_a_slow_first_call_is_warmed_outside_the_timed_runs(decoder):
    SlowFirstCall.paid = False
    row, c = _row(decoder, SLOW, warm=True)
    assert SlowFirstCall.paid and c.machine["warm_up_s"] >= FIRST_CALL_S  # the warm-up paid it
    assert row["ms_per_step"]["draft"] * row["steps"] < 0.3 * FIRST_CALL_S * 1e3  # not in any timed step
    assert row["timing"]["mark"] == "" and row["timing"]["detail"] == ""


def test_without_the_warm_up_the_slow_step_is_marked(decoder):
    SlowFirstCall.paid = False
    row, _ = _row(decoder, SLOW, warm=False)
    assert row["ms_per_step"]["draft"] * row["steps"] >= FIRST_CALL_S * 1e3  # the cost is inside the timings ...
    assert row["timing"]["mark"] == "⚠ 1 slow step(s)" and len(row["timing"]["slow_steps"]) == 1  # ... and marked
    assert "one-time cost" in row["timing"]["detail"]


def test_a_capture_inside_a_timed_step_is_kept_out_and_marked(decoder):
    row, c = _row(decoder, CAPTURING, warm=True)
    steps = [st for r in c.runs_of(1) for st in r.trace.steps if st.draft_token_ids]  # the steps that proposed
    assert c.configs[1].method == CAPTURING and all(st.timings_ms.get("capture", 0) >= 50 for st in steps)
    assert row["ms_per_step"]["draft"] < 25  # the 50 ms per step reported as capture are not drafting time
    assert row["timing"]["mark"] == "⚠ capture" and row["timing"]["capture_steps"] == len(steps)
    assert row["timing"]["capture_ms"] >= 50 * len(steps)


def test_method_none_rows_are_clean_and_csv_carries_the_mark(decoder):
    from specviz.compare import table_csv

    c = new_comparison([RunConfig(CAPTURING, 2)], ["x = 1\n"], [0], max_new_tokens=8)
    run_comparison(decoder, c)
    rows = {r["method"]: r for r in table(c)}
    assert rows["none"]["timing"]["mark"] == ""
    header, *lines = csv.reader(io.StringIO(table_csv(c)))
    assert [line[header.index("timing_mark")] for line in lines] == ["", "⚠ capture"]
