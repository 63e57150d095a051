"""Running a comparison on one loaded decoder, run by run, in :func:`~specviz.compare.model.plan`'s order."""

from __future__ import annotations

import threading
import time
from typing import Any, Iterator

from specviz import methods

from .model import Comparison, RunResult, plan


def iter_comparison(decoder: Any, comparison: Comparison, stop: threading.Event | None = None,
                   warm: bool = True) -> Iterator[RunResult]:
    """Run every (config, prompt, seed) of :func:`plan` not yet in ``comparison.runs`` on ``decoder``
    (a loaded SpecDecoder), appending each result to ``comparison.runs`` and yielding it. A set
    ``stop`` ends the comparison after the current run. Each run starts from :func:`fresh_request_state`: no
    figure depends on what ran before (a method's state across requests starts empty). ``warm``: before a
    configuration's first timed run, one untimed short request of it (:func:`warm_configuration`), so no row's
    timings carry a first use's capture or compile. Raises ValueError for settings or prompts the engine refuses,
    naming the configuration, prompt and seed (the runs before it are kept)."""
    import torch

    if not comparison.machine:
        comparison.machine = {"device": str(decoder.device), "torch": torch.__version__,
                              "threads": torch.get_num_threads(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    done = {(r.config, r.prompt, r.seed) for r in comparison.runs}
    warmed = {r.config for r in comparison.runs} if warm else set(range(len(comparison.configs)))
    for c, p, s in plan(comparison):
        if (c, p, s) in done:
            continue
        if stop is not None and stop.is_set():
            return
        try:
            if c not in warmed:
                comparison.machine["warm_up_s"] = comparison.machine.get("warm_up_s", 0.0) + warm_configuration(
                    decoder, comparison, c, p, s)
                warmed.add(c)
            t0 = time.perf_counter()
            trace = decoder.generate(comparison.prompts[p].text, **comparison.configs[c].settings(s, comparison.max_new_tokens),
                                     **fresh_request_state(comparison.configs[c].method))
        except ValueError as exc:
            raise ValueError(f"{comparison.configs[c].label} on prompt {p + 1} ({comparison.prompts[p].name!r}), "
                             f"seed {s}: {exc}") from None
        result = RunResult(c, p, s, trace, time.perf_counter() - t0)
        comparison.runs.append(result)
        yield result


WARM_UP_TOKENS = 16  # a warm-up request's length: enough to reach every draft length k' = k .. 0 of its last steps


def warm_configuration(decoder: Any, comparison: Comparison, config: int, prompt: int, seed: int) -> float:
    """One untimed request of ``config`` on ``prompt`` and ``seed``, at most WARM_UP_TOKENS long and from a fresh
    request state, its trace dropped: it pays the configuration's first-use costs (CUDA-graph captures of its
    widths, a kernel's compilation, the proposer's first call, allocations) outside every timed run. Its last steps
    draft k' = k down to 0 (never past max_new_tokens), so the timed runs meet no new width. Returns its seconds."""
    t0 = time.perf_counter()
    settings = comparison.configs[config].settings(seed, min(comparison.max_new_tokens, WARM_UP_TOKENS))
    decoder.generate(comparison.prompts[prompt].text, **settings, **fresh_request_state(comparison.configs[config].method))
    return time.perf_counter() - t0


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


