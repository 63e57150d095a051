"""The app's only shared mutable state: decoders loaded lazily, once per (target, draft, device),
and per-session stop requests.

Nothing is loaded at import or when the UI is built; the first Run (or the launch) loads the models. A failed
load is not cached, so fixing the files and pressing Run again retries. Once loaded, a decoder serves requests at
once; its warm-up (:mod:`specviz.warmup`) runs on a background thread in the time between requests.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from pathlib import Path
from typing import Any, Iterator

from specviz.compile_stage import BACKGROUND_DEFAULT
from specviz.models import DEFAULT_DRAFT, DEFAULT_TARGET
from specviz.warmup import Gate

from .settings import MAX_UI_SPECULATIVE_TOKENS  # the k slider's cap: warm-up covers k' up to it



def device_in_use(device: str | None) -> str:
    """The device a run will use, in words, e.g. "cuda:0 (NVIDIA H200)" or "cpu" (None: CUDA when
    available). Reads the device without loading a model; an unusable device is named as asked."""
    import torch

    from specviz.models import resolve_device

    try:
        dev = resolve_device(device)
    except (ValueError, RuntimeError):
        return f"{device} (not available)"
    if dev.type != "cuda":
        return str(dev)
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    return f"cuda:{index} ({torch.cuda.get_device_name(index)})"


class DecoderCache:
    """Thread-safe lazy cache of :class:`specviz.SpecDecoder` objects.

    Args:
        target / draft: model directories or hub ids; None -> the bundled demo models
            (``assets/models/specviz-target`` / ``specviz-draft``).
        device: "cpu", "cuda", ... or None (CUDA when available).
        compile: ``SpecDecoder.from_pretrained(compile=...)``: "background" compiles the target's and the draft's
            forwards on CUDA after the warm-up, swapping each graph in when it is ready (:mod:`specviz.compile_stage`;
            the app's ``--compile-background``); True compiles every forward from the start (``--compile``); False
            never (``--no-compile``); None: the library's default.
        heads: ``SpecDecoder.from_pretrained(heads=...)``: {method: head directory} (the app's ``--head``);
            None: the bundled heads with the bundled target.
        background_warm_up: warm up on a background thread beside the requests (True), or inside the load, before
            :meth:`get` returns (False); None: in the background on CUDA (minutes of graph capture), in the load on
            the CPU (a few short requests, nothing captured).

    Attributes:
        status: what the load / warm-up is doing now ("" before it starts and once it is done).
        warm_up_report: :func:`specviz.warmup.warm_up`'s report once it is done; warm_up_error its failure.
        warmed: set once the warm-up has ended (done or failed).
    """

    def __init__(self, target: str | None = None, draft: str | None = None, device: str | None = None,
                 compile: bool | str | None = None, heads: dict[str, str] | None = None,
                 background_warm_up: bool | None = None):
        self.target, self.draft, self.device, self.compile = target, draft, device, compile
        self.heads = dict(heads) if heads else None
        self._lock = threading.Lock()
        self._decoders: dict[tuple[Any, ...], Any] = {}
        self._cold: set[tuple[Any, ...]] = set()  # keys loaded with get(warm=False), not warmed up yet
        self.status = ""
        self.warm_up_report: dict[str, float] | None = None
        self.warm_up_error: str | None = None
        self.warmed = threading.Event()
        self.gate: Gate = Gate()
        self.background_warm_up = background_warm_up

    @property
    def key(self) -> tuple[str | None, str | None, str | None]:
        return (self.target, self.draft, self.device)

    def describe(self) -> str:
        """One Markdown line naming the models the app will use, and whether they exist."""
        target = self.target or str(DEFAULT_TARGET)
        draft = self.draft or (str(DEFAULT_DRAFT) if self.target is None else None)
        draft = draft or "(none: method draft_model unavailable)"
        device = device_in_use(self.device)
        line = f"target: `{target}` · draft: `{draft}` · device: `{device}`"
        if self.heads:
            line += " · heads: " + ", ".join(f"{method} `{d}`" for method, d in self.heads.items())
        cuda = device.startswith("cuda")
        if self.compile is True:
            line += (" · torch.compile: on from the start" if cuda else
                     " · torch.compile: asked for, no effect on the CPU (the eager runner)")
        elif cuda and (self.compile == "background" or (self.compile is None and BACKGROUND_DEFAULT)):
            line += " · torch.compile: swapped in after the warm-up"
        if self.target is None and not DEFAULT_TARGET.exists():
            line += ("  \n**The bundled demo models are not in `assets/models/` yet** (train them with "
                     "`python -m specviz.train`, or start the app with `--target DIR --draft DIR`). "
                     "You can still upload a trace JSON below and explore it.")
        return line

    def get(self, warm: bool = True):
        """The decoder, loading it on first use (one load at a time), and warming it up after its load (in the
        background on CUDA); ``warm=False`` only loads (the app's launch checks a --head's fit so), and the next
        ``get()`` warms up.

        Raises:
            specviz.models.ModelLoadError: a model cannot be loaded (message says what to fix).
            ValueError: an unusable device.
        """
        with self._lock:
            decoder = self._decoders.get(self.key)
            if decoder is None:
                from specviz.engine import SpecDecoder
                from specviz.models import ModelLoadError

                if self.target is None and not Path(DEFAULT_TARGET).exists():
                    raise ModelLoadError(
                        f"the bundled demo model is missing ({DEFAULT_TARGET}); train it with "
                        "`python -m specviz.train` or start the app with --target/--draft. "
                        "Uploaded traces can still be viewed.")
                self.status = "loading the models"
                try:
                    decoder = SpecDecoder.from_pretrained(self.target, self.draft, device=self.device,
                                                          compile=self.compile,
                                                          heads=self.heads)
                finally:
                    self.status = ""
                self._decoders[self.key] = decoder
                self._cold.add(self.key)
                self.gate.device = decoder.device  # each unit holds the device lock (graph capture)
            if warm and self.key in self._cold:
                self._cold.discard(self.key)
                background = self.background_warm_up
                if background if background is not None else decoder.device.type == "cuda":
                    threading.Thread(target=self._warm_up, args=(decoder, self.gate), name="specviz-warm-up",
                                     daemon=True).start()
                else:  # inside the load: a gate of its own, as the request that called get() must not hold it up
                    self._warm_up(decoder, Gate(decoder.device))
            return decoder

    def _warm_up(self, decoder: Any, gate: Gate) -> None:
        """No run's timings (or speedup) should carry one-time costs: on CUDA the warm-up captures every graph the
        UI's settings reach (minutes for a large model), on the CPU it is quick. In the background the requests go
        first (:class:`specviz.warmup.Gate`). A failure is logged and shown in the status line; the app stays up and
        runs capture what they need on first use."""
        from specviz.warmup import warm_up

        self.status = "warm-up: first requests"
        try:
            self.warm_up_report = warm_up(decoder, MAX_UI_SPECULATIVE_TOKENS, progress=self._say, gate=gate)
        except Exception as exc:  # noqa: BLE001
            logging.getLogger(__name__).exception("warm-up failed")
            self.warm_up_error = f"{type(exc).__name__}: {exc}"
        finally:
            self.status = ""
            self.warmed.set()

    @contextlib.contextmanager
    def in_use(self) -> Iterator[None]:
        """``with cache.in_use():`` around a request's use of a decoder: the background warm-up pauses meanwhile
        (waiting here for at most the one unit in progress)."""
        with self.gate.request():
            yield

    def wait_warmed_up(self, timeout: float | None = None) -> Any:
        """Load if needed and wait until the warm-up has ended (benchmarks: nothing of it inside a measurement).
        Returns the decoder."""
        decoder = self.get()
        if not self.warmed.wait(timeout):
            raise TimeoutError(f"the warm-up did not end within {timeout} s")
        return decoder

    def _say(self, line: str) -> None:
        self.status = line

    def start_warm_up(self) -> threading.Thread:
        """Load and warm up on a background thread now (the app calls it at launch); the thread ends when the
        warm-up has. A Run pressed meanwhile waits for the load only. A failed load is left for the first Run
        to report."""

        def work() -> None:
            try:
                self.wait_warmed_up()
            except Exception:  # noqa: BLE001  (reported to the user by the first Run)
                pass

        thread = threading.Thread(target=work, name="specviz-warm-up", daemon=True)
        thread.start()
        return thread

    def compile_status(self) -> Any:
        """The loaded decoder's :class:`specviz.compile_stage.CompileStatus`, or None before the load."""
        decoder = self._decoders.get(self.key)
        return getattr(decoder, "compile_status", None)

    def loaded(self) -> bool:
        """Whether the decoder is already in memory."""
        return self.key in self._decoders


class StopSignals:
    """Per-session stop requests: the Run handler registers an Event, the Stop handler sets it,
    and the run ends cleanly after its current step (stop_reason "stopped"). This makes Stop
    work for API clients too, where the browser's event cancellation does not apply."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: dict[str, threading.Event] = {}

    def start(self, session: str) -> threading.Event:
        """A fresh Event for ``session``'s new run (replacing any earlier one)."""
        with self._lock:
            event = self._events[session] = threading.Event()
            return event

    def stop(self, session: str) -> bool:
        """Ask ``session``'s run to stop. Returns whether a run was registered."""
        with self._lock:
            event = self._events.get(session)
        if event is not None:
            event.set()
        return event is not None

    def finish(self, session: str, event: threading.Event) -> None:
        """Forget ``event`` once its run has ended."""
        with self._lock:
            if self._events.get(session) is event:
                del self._events[session]
