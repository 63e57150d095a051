"""One request decoded on a background thread, so drawing the views never slows the decode.

The Run handler polls :meth:`BackgroundRun.snapshot` a few times a second and redraws; the
engine meanwhile keeps stepping (its tensor work releases the GIL). A set ``stop_flag`` ends
the run after its current step: the engine then finishes the trace with stop_reason "stopped".

Runs go to one long-lived pool of threads (:data:`MAX_CONCURRENT_RUNS`), not a new thread each. With a thread
per run the app's host memory grew by megabytes per run over hundreds of runs on the H200 (results/gpu) while the
same requests on the engine alone stayed flat; a new thread that runs CUDA work gets
its own per-thread state and, from glibc, possibly its own malloc arena (up to 8 per core).
``scripts/rss_probe.py --via thread|pool`` measures the two side by side.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from typing import Any

from specviz.trace import Trace


MAX_CONCURRENT_RUNS = 32  # threads at most; a run beyond that waits for a free one


class RunPool:
    """Long-lived daemon threads that run submitted callables (a thread is added only while every existing one
    is busy, up to ``max_threads``). Daemon, unlike ``concurrent.futures.ThreadPoolExecutor``'s workers, so a
    run in progress never holds up the app's exit."""

    def __init__(self, max_threads: int = MAX_CONCURRENT_RUNS):
        self.max_threads = max_threads
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._idle = 0

    def submit(self, fn, on_done=None) -> None:
        """Run ``fn()`` on a pool thread, then ``on_done()`` (if given) once that thread counts as idle again
        (so a caller that waits for ``on_done`` and submits again reuses the thread)."""
        with self._lock:
            if self._idle <= 0 and len(self._threads) < self.max_threads:
                t = threading.Thread(target=self._serve, name=f"specviz-run-{len(self._threads)}", daemon=True)
                self._threads.append(t)
                self._idle += 1
                t.start()
            self._idle -= 1  # this job will occupy one thread
        self._jobs.put((fn, on_done))

    @property
    def threads(self) -> int:
        return len(self._threads)

    def _serve(self) -> None:
        while True:
            fn, on_done = self._jobs.get()
            try:
                fn()
            finally:
                with self._lock:
                    self._idle += 1
                if on_done is not None:
                    on_done()


_POOL = RunPool()


def run_pool() -> RunPool:
    """The process's pool of run threads."""
    return _POOL


class BackgroundRun:
    """``decoder.iter_generate(prompt, **settings)`` on a thread of :func:`run_pool`.

    Attributes:
        finished: set when the run has ended (normally, stopped, or with an error).
        error: the exception the run raised (e.g. ValueError for settings the engine refuses,
            torch.cuda.OutOfMemoryError), else None.
    """

    def __init__(self, decoder: Any, prompt: str, settings: dict[str, Any], stop_flag: threading.Event):
        self.decoder, self.prompt, self.settings, self.stop_flag = decoder, prompt, settings, stop_flag
        self.finished = threading.Event()
        self.error: BaseException | None = None
        self._trace: Trace | None = None
        run_pool().submit(self._work, on_done=self.finished.set)

    def _work(self) -> None:
        try:
            it = self.decoder.iter_generate(self.prompt, **self.settings)
            try:
                for trace in it:
                    self._trace = trace
                    if self.stop_flag.is_set():
                        break
            finally:
                it.close()  # a stopped run finishes its trace here (stop_reason "stopped")
        except BaseException as exc:  # handed to the UI thread, which turns it into a message
            self.error = exc
        # ``finished`` is set by the pool once this thread is free again (RunPool.submit's on_done)

    def snapshot(self) -> Trace | None:
        """A shallow copy of the live trace with its steps list and token texts frozen (None
        before the first step). Steps are appended whole by the engine, so every copied step is
        complete, and the engine has decoded a text for every id they mention."""
        trace = self._trace
        if trace is None:
            return None
        return dataclasses.replace(trace, steps=list(trace.steps), token_texts=dict(trace.token_texts))

    def result(self) -> Trace | None:
        """The finished trace (call after ``finished`` is set); None if the run failed first."""
        return self._trace
