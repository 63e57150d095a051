"""The comparison with method none after a run (specviz.ui.run.measure): it times segments no longer than what the
run generated, streams its progress, and Stop ends it with a note, while the run's own views stay."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from specviz.ui import run as run_ui
from specviz.ui.cache import StopSignals
from specviz.ui.outputs import MEASURE_STOPPED

PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a"
SETTINGS = {"method": "draft_model", "num_speculative_tokens": 3, "max_new_tokens": 40}


def _pending(dec, session: str, tokens: int) -> dict:
    """A finished run's state and its measurement registered for ``session``, as the Run handler leaves them."""
    trace = dec.generate(PROMPT, **dict(SETTINGS, max_new_tokens=tokens))
    run_ui._PENDING[session] = (dec, PROMPT, dict(SETTINGS), {}, 2, tokens, "")
    return {"trace": trace.to_dict(), "baseline": None, "no_baseline": run_ui.MEASURING, "streamed": True}


def test_the_segments_never_run_past_the_request(decoders):
    dec = decoders["llama"]
    state = _pending(dec, "short", 12)
    outs = list(run_ui.measure(StopSignals(), state, SimpleNamespace(session_hash="short")))
    final = outs[-1]
    meas = final.state["baseline"]["measurement"]
    assert meas["segment_tokens"] == 12 and meas["method_summary"]["tokens"] == 2 * 12  # not 2 x 32
    assert final.progress.startswith("**done** · 12 tokens") and "speedup measured" in final.progress
    text = re.sub(r"<[^>]+>", "", final.speedup)
    assert "What the segments time: the request's first 12 tokens (of the 12 this run generated)" in text
    assert final.stream.__class__ is dict and final.grid.__class__ is dict  # gr.skip(): the run's views stay
    assert "short" not in run_ui._PENDING  # measured once: a second call has nothing to do and changes nothing
    again = list(run_ui.measure(StopSignals(), final.state, SimpleNamespace(session_hash="short")))
    assert len(again) == 1 and all(isinstance(o, dict) and o.get("__type__") == "update" for o in again[0])


def test_stop_ends_the_measurement_and_says_so(decoders, monkeypatch):
    dec = decoders["llama"]
    signals = StopSignals()
    state = _pending(dec, "stopped", 16)
    real = dec.generate

    def generate(prompt, **settings):  # Stop pressed while the first segment decodes
        signals.stop("stopped")
        return real(prompt, **settings)

    monkeypatch.setattr(dec, "generate", generate)
    final = list(run_ui.measure(signals, state, SimpleNamespace(session_hash="stopped")))[-1]
    assert final.state["baseline"] is None and final.state["no_baseline"] == MEASURE_STOPPED
    assert MEASURE_STOPPED in final.speedup and "speedup measured" not in final.progress


def test_zero_pairs_is_within_the_range():
    run_ui.RunRequest(prompt=PROMPT, method="draft_model", max_new_tokens=8, pairs=0).settings()  # no error
    with pytest.raises(ValueError, match="less than minimum value 0"):
        run_ui.RunRequest(prompt=PROMPT, pairs=-1).settings()
