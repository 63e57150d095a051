"""One request decoded on a background thread, so drawing the views never slows the decode.

The Run handler polls :meth:`BackgroundRun.snapshot` a few times a second and redraws; the
engine meanwhile keeps stepping (its tensor work releases the GIL). A set ``stop_flag`` ends
the run after its current step: the engine then finishes the trace with stop_reason "stopped".
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

from specviz.trace import Trace


class BackgroundRun:
    """``decoder.iter_generate(prompt, **settings)`` on a daemon thread.

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
        self._thread = threading.Thread(target=self._work, name="specviz-run", daemon=True)
        self._thread.start()

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
        finally:
            self.finished.set()

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
