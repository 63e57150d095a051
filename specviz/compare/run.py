"""Running a comparison on one loaded decoder, run by run, in :func:`~specviz.compare.model.plan`'s order."""

from __future__ import annotations

import threading
import time
from typing import Any, Iterator

from specviz import methods

from .model import Comparison, RunResult, plan
from .stats import decode_rate


def iter_comparison(decoder: Any, comparison: Comparison, stop: threading.Event | None = None,
                   warm: bool = True) -> Iterator[RunResult]:
    """Run every (config, prompt, seed) of :func:`plan` not yet in ``comparison.runs`` on ``decoder``
    (a loaded SpecDecoder), appending each result to ``comparison.runs`` and yielding it. A request that
    :func:`plan` lists more than once (method none, ``comparison.baseline_timings``) is yielded at its first timing;
    each later timing updates that result in place (:func:`add_timing`: the trace kept is the median timing's) and
    is not yielded. A set ``stop`` ends the comparison after the current run. Each run starts from
    :func:`fresh_request_state`: no figure depends on what ran before (a method's state across requests starts
    empty). ``warm``: before a configuration's first timed run, one untimed short request of it
    (:func:`warm_configuration`), so no row's timings carry a first use's capture or compile. Raises ValueError for
    settings or prompts the engine refuses, naming the configuration, prompt and seed (the runs before it are
    kept)."""
    import torch

    if not comparison.machine:
        comparison.machine = {"device": str(decoder.device), "torch": torch.__version__,
                              "threads": torch.get_num_threads(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    found = {(r.config, r.prompt, r.seed): r for r in comparison.runs}
    seen: dict[tuple[int, int, int], int] = {}  # timings of each request met in the plan so far
    kept: dict[tuple[int, int, int], list] = {}  # the traces of a repeated request's timings, while it runs
    warmed = {r.config for r in comparison.runs} if warm else set(range(len(comparison.configs)))
    for key in plan(comparison):
        c, p, s = key
        seen[key] = seen.get(key, 0) + 1
        old = found.get(key)
        if old is not None and seen[key] <= max(len(old.timings), 1):
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
        wall = time.perf_counter() - t0
        if old is not None:
            add_timing(old, trace, wall, kept.setdefault(key, []))
            continue
        result = found[key] = RunResult(c, p, s, trace, wall)
        comparison.runs.append(result)
        yield result


def add_timing(result: RunResult, trace: Any, wall_s: float, traces: list) -> None:
    """One more timing of ``result``'s request (``trace``, ``wall_s``): its decode tokens/s joins ``result.timings``
    and ``result`` keeps the trace and wall time of the median timing (of an even count, the faster of the middle
    two). ``traces``: (rate, trace, wall_s) of the timings whose traces are still at hand, updated here (empty at the
    request's first repeat; a timing of a saved comparison has its rate only and is never the one kept unless its
    trace is the stored one)."""
    if not traces:
        traces.append((decode_rate(result.trace), result.trace, result.wall_s))
    rates = list(result.timings) or [traces[0][0]]
    rate = decode_rate(trace)
    traces.append((rate, trace, wall_s))
    result.timings = rates + [rate]
    ranked = sorted(result.timings)
    median = ranked[len(ranked) // 2]
    _, result.trace, result.wall_s = min(traces, key=lambda t: abs(t[0] - median))


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


def fitting(decoder: Any, prompts: list, max_new_tokens: int) -> tuple[list, list[str]]:
    """(the prompts whose tokens plus ``max_new_tokens`` fit the decoder's context, "prompt 'name' (why)" for the
    others): a target of your own may have a shorter context than the bundled prompt sets need. Raises ValueError
    when none fits (an empty prompt raises from ``encode``)."""
    limit = getattr(decoder, "max_length", None)
    if not limit:
        return list(prompts), []
    sizes = [len(decoder.encode(p.text)) for p in prompts]
    keep = [p for p, n in zip(prompts, sizes) if n + max_new_tokens <= limit]
    left = [f"prompt {p.name!r} ({n} tokens + {max_new_tokens} new > the model's context of {limit})"
            for p, n in zip(prompts, sizes) if n + max_new_tokens > limit]
    if prompts and not keep:
        raise ValueError(f"no prompt fits the model's context of {limit} tokens with {max_new_tokens} new tokens: "
                         + "; ".join(left) + ". Lower max new tokens or choose shorter prompts")
    return keep, left
