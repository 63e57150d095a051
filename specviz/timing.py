"""A verification step's cost, split the way the speedup panel and Compare read it.

:class:`StepTimer` adds wall-clock laps to buckets: "draft" (the proposer: propose, and observe of what was
committed), "verify" (the target forward), "sample" (the verifier: p, the acceptance test, recovered and bonus
tokens); a lap with no bucket (publishing earlier steps' events) counts nowhere. One-time CUDA-graph capture (and the
compilation inside it) is never a step's cost: the seconds the runners, the verifier and the proposer report spending
on it (``capture_s``: graph captures, a proposer's kernel compilation) are taken out of the lap they fell in, and
reported alone as "capture" (the trace's ``timings_ms["capture"]``; Compare marks a row whose runs had any).
"""

from __future__ import annotations

import time
from typing import Any, Callable

BUCKETS = ("draft", "verify", "sample")


def capture_seconds(*objects: Any) -> float:
    """Seconds the runners / verifier / proposer spent on one-time captures and compiles so far (their ``capture_s``)."""
    return sum(float(getattr(o, "capture_s", 0.0)) for o in objects if o is not None)


class StepTimer:
    """Laps of one step. ``captured``: () -> capture seconds so far (:func:`capture_seconds` of the step's runners)."""

    def __init__(self, captured: Callable[[], float]):
        self._captured = captured
        self._t, self._c = time.perf_counter(), captured()
        self._c0 = self._c
        self.ms = dict.fromkeys(BUCKETS, 0.0)

    def lap(self, bucket: str | None) -> None:
        """Add the time since the last lap, less any capture in it, to ``bucket`` (None: to nothing)."""
        t, c = time.perf_counter(), self._captured()
        if bucket is not None:
            self.ms[bucket] += (t - self._t - (c - self._c)) * 1e3
        self._t, self._c = t, c

    def timings(self) -> dict[str, float]:
        """{"draft_ms", "verify_ms", "sample_ms", "capture_ms"} (milliseconds)."""
        return {**{f"{b}_ms": v for b, v in self.ms.items()}, "capture_ms": (self._c - self._c0) * 1e3}
