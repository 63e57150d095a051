"""Running a comparison on one loaded decoder, run by run, in :func:`~specviz.compare.model.plan`'s order."""

from __future__ import annotations

import threading
import time
from typing import Any, Iterator

from specviz import methods

from .model import Comparison, RunResult, plan


def iter_comparison(decoder: Any, comparison: Comparison, stop: threading.Event | None = None) -> Iterator[RunResult]:
    """Run every (config, prompt, seed) of :func:`plan` not yet in ``comparison.runs`` on ``decoder``
    (a loaded SpecDecoder), appending each result to ``comparison.runs`` and yielding it. A set
    ``stop`` ends the comparison after the current run. Each run starts from :func:`fresh_request_state`: no
    figure depends on what ran before (a method's state across requests starts empty). Raises ValueError for settings or prompts the
    engine refuses, naming the configuration, prompt and seed (the runs before it are kept)."""
    import torch

    if not comparison.machine:
        comparison.machine = {"device": str(decoder.device), "torch": torch.__version__,
                              "threads": torch.get_num_threads(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    done = {(r.config, r.prompt, r.seed) for r in comparison.runs}
    for c, p, s in plan(comparison):
        if (c, p, s) in done:
            continue
        if stop is not None and stop.is_set():
            return
        t0 = time.perf_counter()
        try:
            trace = decoder.generate(comparison.prompts[p].text, **comparison.configs[c].settings(s, comparison.max_new_tokens),
                                     **fresh_request_state(comparison.configs[c].method))
        except ValueError as exc:
            raise ValueError(f"{comparison.configs[c].label} on prompt {p + 1} ({comparison.prompts[p].name!r}), "
                             f"seed {s}: {exc}") from None
        result = RunResult(c, p, s, trace, time.perf_counter() - t0)
        comparison.runs.append(result)
        yield result


def fresh_request_state(method: str) -> dict[str, Any]:
    """The per-request state a comparison run starts from: a method that keeps state across requests (suffix's tree
    of earlier outputs: ``Method.request_state``) gets a new, empty one, so no row depends on what ran before it, in
    this comparison or on this server (the decoder's own state and a browser session's are never read)."""
    make = methods.get(method).request_state if method in methods.names() else None
    return {"request_state": make()} if make is not None else {}


def run_comparison(decoder: Any, comparison: Comparison) -> Comparison:
    """Run the whole comparison (see :func:`iter_comparison`) and return it."""
    for _ in iter_comparison(decoder, comparison):
        pass
    return comparison


