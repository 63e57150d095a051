"""The app under load, short versions of benchmarks/load_app.py: 8 concurrent
sessions with 8 different methods / verification modes never mix traces, never change each
other's output and finish within the stated bound; consecutive runs do not grow the process's
memory. The 200-run figures are in results/load/README.md."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow  # a served app under load: minutes on the CPU

pytest.importorskip("gradio_client")

from benchmarks import load_app  # noqa: E402


@pytest.fixture(scope="module")
def load_url(tiny_dirs):
    target, draft = tiny_dirs["llama"]
    demo, url = load_app.launch(str(target), str(draft), "cpu")
    yield url
    demo.close()


def test_eight_concurrent_sessions_keep_their_own_traces_and_do_not_stall(load_url):
    report = load_app.concurrent_sessions(load_url, max_new=12)  # raises on a mixed trace or a stall
    assert report["sessions"] == 8 == len({r[:3] for r in load_app.REQUESTS})
    assert {r[0] for r in load_app.REQUESTS} == {"none", "ngram", "ngram_gpu", "suffix", "draft_model"}
    assert {r[1] for r in load_app.REQUESTS} >= {"greedy", "standard", "block", "synthetic"}
    assert all(f is not None for f in report["first_update_s"]) or report["max_finish_s"] < 5


def test_consecutive_runs_do_not_grow_memory(tiny_dirs):
    """The engine, handlers, views and measurement hold nothing per run: RSS is flat over the second
    half of 30 runs (results/load/README.md: 0.008 MB per run over 160 runs on the demo models)."""
    from specviz.ui.cache import DecoderCache

    target, draft = tiny_dirs["llama"]
    report = load_app.handler_soak(DecoderCache(str(target), str(draft), "cpu"), runs=30, max_new=8,
                                   compare_every=8)
    g = report["rss_growth"]
    assert g["slope_mb_per_run"] < 0.1 and g["late_minus_early_mb"] < 4, g


def test_the_served_app_survives_consecutive_runs(load_url):
    """Through the web server (gradio's queue and sessions too): every run completes; gradio's own
    memory grows a little (about 0.1 MB per run over 200 runs, results/load/README.md), bounded here
    well below what keeping each run's trace (or the models' caches) would cost."""
    report = load_app.soak(load_url, runs=16, max_new=8, new_session_every=8)
    g = report["rss_growth"]
    assert g["slope_mb_per_run"] < 2.0, g


def test_the_stall_bound_and_the_checks_can_fail(load_url, monkeypatch):
    """The checks are not vacuous: a trace of another session, or a bound nothing can meet, fails them."""
    from specviz.trace import Trace

    req = load_app.REQUESTS[1]
    trace = Trace(config={"method": "ngram", "verify": "greedy", "seed": 99, "temperature": 0.0, "max_new_tokens": 16},
                  prompt_token_ids=[1], prompt_text=req[4])
    with pytest.raises(AssertionError):
        load_app.check_belongs(trace, req, 16)
    monkeypatch.setattr(load_app, "STALL_FACTOR", 0.0)
    monkeypatch.setattr(load_app, "STALL_SLACK_S", 0.0)
    with pytest.raises(AssertionError, match="past the bound"):
        load_app.concurrent_sessions(load_url, max_new=2, requests=load_app.REQUESTS[:2])
