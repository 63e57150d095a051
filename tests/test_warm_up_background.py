"""The warm-up beside the app's requests: :class:`specviz.warmup.Gate` orders its units after requests, and
:class:`specviz.ui.cache.DecoderCache` serves runs as soon as the models are loaded while the warm-up goes on in
the background (CPU: a runner that says it captures graphs and takes its time over each)."""

from __future__ import annotations

import threading
import time

import pytest

from specviz import SpecDecoder
from specviz.ui.cache import DecoderCache
from specviz.warmup import Gate

from test_app_reliability import PROMPT, _GraphRunner


def _spans_overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> bool:
    return any(s1 < e2 and s2 < e1 for s1, e1 in a for s2, e2 in b)


def test_a_unit_waits_for_requests_and_a_request_waits_only_for_the_unit_in_progress():
    gate = Gate()
    unit_started, release_unit = threading.Event(), threading.Event()
    log: list[str] = []

    def background() -> None:
        with gate.unit():
            unit_started.set()
            with gate.unit():  # units nest in their own thread
                release_unit.wait(5)
            log.append("unit 1 done")
        with gate.unit():
            log.append("unit 2")

    t = threading.Thread(target=background)
    t.start()
    assert unit_started.wait(5)
    waited = threading.Event()

    def request() -> None:
        with gate.request():
            log.append("request")
            waited.set()
            time.sleep(0.3)  # unit 2 must not start meanwhile
            log.append("request done")

    r = threading.Thread(target=request)
    r.start()
    assert not waited.wait(0.3)  # the request waits for unit 1 ...
    release_unit.set()
    r.join(5)
    t.join(5)
    assert log == ["unit 1 done", "request", "request done", "unit 2"]  # ... and unit 2 waits for the request
    assert not gate.busy


class _SlowGraphRunner(_GraphRunner):
    """Each forward of a "capture" (a width the warm-up asks for) takes 50 ms."""

    def forward_features(self, token_ids, taps=(), parents=None):
        time.sleep(0.05)
        return super().forward_features(token_ids, taps, parents=parents)


@pytest.fixture()
def slow_capture(monkeypatch):
    real = SpecDecoder.from_pretrained.__func__

    def from_pretrained(cls, *a, **kw):
        dec = real(cls, *a, **kw)
        dec.runner_factory = _SlowGraphRunner
        return dec

    monkeypatch.setattr(SpecDecoder, "from_pretrained", classmethod(from_pretrained))


def test_runs_start_before_the_background_warm_up_ends_and_never_overlap_its_units(tiny_dirs, slow_capture,
                                                                                   monkeypatch):
    from specviz.warmup import WarmUp

    units: list[tuple[float, float]] = []
    real_unit = WarmUp.unit

    class _Timed:
        def __init__(self, ctx):
            self.ctx = ctx

        def __enter__(self):
            self.ctx.__enter__()
            self.t0 = time.perf_counter()

        def __exit__(self, *exc):
            units.append((self.t0, time.perf_counter()))
            return self.ctx.__exit__(*exc)

    monkeypatch.setattr(WarmUp, "unit", lambda self: _Timed(real_unit(self)))
    target, draft = tiny_dirs["llama"]
    cache = DecoderCache(str(target), str(draft), "cpu", background_warm_up=True)
    dec = cache.get()
    assert not cache.warmed.is_set() and cache.status  # loaded and serving; the warm-up goes on
    runs: list[tuple[float, float]] = []
    for _ in range(3):
        with cache.in_use():
            t0 = time.perf_counter()
            trace = dec.generate(PROMPT, method="ngram", num_speculative_tokens=3, max_new_tokens=6)
            runs.append((t0, time.perf_counter()))
        assert trace.output_token_ids
        time.sleep(0.1)  # a unit or two between the runs
    assert not cache.warmed.is_set(), "the warm-up ended before the runs: make its units slower"
    assert cache.wait_warmed_up(timeout=300) is dec
    assert cache.warm_up_error is None and cache.status == ""
    # the same work as a warm-up in the foreground: target widths 1..13 + 2 tree buckets + the drafter's 2 widths
    assert cache.warm_up_report["graphs"] >= 13 + 2 + 2
    assert len(units) > 20 and not _spans_overlap(units, runs)


def test_a_failing_background_warm_up_leaves_the_app_serving(tiny_dirs, monkeypatch):
    import specviz.warmup as warmup

    def broken(*a, **kw):
        raise RuntimeError("CUDA error: out of memory (simulated)")

    monkeypatch.setattr(warmup, "warm_up", broken)
    target, draft = tiny_dirs["llama"]
    cache = DecoderCache(str(target), str(draft), "cpu", background_warm_up=True)
    dec = cache.wait_warmed_up(timeout=60)
    assert "out of memory" in cache.warm_up_error and cache.status == ""
    from specviz.ui.cache import StopSignals
    from specviz.ui.handlers import SessionHandlers

    line, timer = SessionHandlers(cache, StopSignals()).warm_up_status()
    assert line.startswith("warm-up failed") and timer.active is False
    with cache.in_use():
        assert dec.generate(PROMPT, method="none", max_new_tokens=3).output_token_ids
