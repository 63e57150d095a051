"""A small typed event bus: proposers and the sampler publish, anyone may subscribe.

The engine publishes one event per phase of a verification step; the trace
:class:`~specviz.trace.Recorder` is just one subscriber (a console printer is another, see
``specviz.cli``). Handlers run synchronously, in subscription order, on the engine's thread.

    bus = EventBus()
    bus.subscribe(StepVerified, lambda e: print(e.record["num_accepted"]))
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable

Handler = Callable[[Any], None]


@dataclass(frozen=True)
class GenerationStarted:
    """A request begins. ``config``: the generation settings (plain data);
    ``prompt_token_ids``: the tokenised prompt."""

    config: dict[str, Any]
    prompt_token_ids: list[int]


@dataclass(frozen=True)
class DraftProposed:
    """The proposer's output for step ``step``: ``token_ids`` (the draft, host list),
    ``proposer`` (method name), ``details`` (the proposer's plain-data match details) and the
    wall time spent drafting, ``draft_ms`` (the proposer's ``propose`` for this step plus its ``observe`` of
    the tokens this step committed; one-time graph captures excluded)."""

    step: int
    proposer: str
    token_ids: list[int]
    details: dict[str, Any]
    draft_ms: float


@dataclass(frozen=True)
class StepVerified:
    """The sampler's decision for step ``step``, already copied to the host (one packed
    device-to-host copy per step). ``record``: plain data, the per-position fields of
    :class:`specviz.trace.Step` (built by :mod:`specviz.record`)."""

    step: int
    record: dict[str, Any]
    verify_ms: float
    sample_ms: float
    capture_ms: float = 0.0  # one-time CUDA-graph capture inside the step, excluded from the times above


@dataclass(frozen=True)
class TokensCommitted:
    """Tokens appended to the output at step ``step`` (after EOS / max_new_tokens truncation)."""

    step: int
    token_ids: list[int]
    num_generated: int


@dataclass(frozen=True)
class GenerationFinished:
    """The request ended: ``stop_reason`` is "eos", "max_new_tokens", "max_length" or "stopped"."""

    stop_reason: str
    output_token_ids: list[int]
    wall_time_s: float
    target_forward_passes: int
    extra: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)  # config entries known at the end (runner_compiled)


class EventBus:
    """Synchronous publish/subscribe keyed by event class (``None`` = every event)."""

    def __init__(self) -> None:
        self._handlers: dict[type | None, list[Handler]] = defaultdict(list)

    def subscribe(self, event_type: type | None, handler: Handler) -> Callable[[], None]:
        """Call ``handler(event)`` for each published event of ``event_type`` (or all events if
        None). Returns a function that unsubscribes."""
        self._handlers[event_type].append(handler)
        return lambda: self._handlers[event_type].remove(handler)

    def publish(self, event: Any) -> None:
        for handler in (*self._handlers.get(type(event), ()), *self._handlers.get(None, ())):
            handler(event)


class Publication:
    """One engine step's events, published when called (once; later calls do nothing): the engine publishes a
    step's events during the next step's target forward."""

    def __init__(self, publish: Callable[[], None]):
        self._publish: Callable[[], None] | None = publish

    def __call__(self) -> None:
        fn, self._publish = self._publish, None
        if fn is not None:
            fn()


def publish_all(pending: list[Publication]) -> None:
    """Publish every pending step's events, in order, and empty ``pending``."""
    for publication in pending:
        publication()
    pending.clear()
