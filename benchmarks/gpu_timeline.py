"""Where a step's GPU time goes (why a tree step costs more than a chain step on the H200): one warm
request per setting under ``torch.profiler`` (CPU + CUDA), each kernel charged to the engine phase whose host call
launched it (graph replays included: CUPTI reports a replay's kernels with the launch's correlation id).

Per setting it prints, per step (medians are not meaningful for a profile; these are means over the request):
the wall time, the GPU's busy time (the union of kernel, memcpy and memset intervals) and so its idle share, and per
phase the kernel count and kernel time. Phases are the ``SpecDecoder._step`` callees: ``propose`` (the drafter, its
graphs included), ``observe``, ``forward`` (the target's verify forward), ``verify`` (sampler and record:
``StepVerifier.queue`` for a chain or a tree, and the step's wait, ``QueuedStep.result``), ``commit`` (the K/V
compaction), ``publish`` (an earlier step's detail and events), and ``step`` for what ``_step`` launches itself.
Then the GPU's idle time per step by the host phase open meanwhile (the innermost one; ``walk`` is the tree
verifier's host walk after its read, ``truncate`` the cache rollback, ``between`` the engine's loop between steps):
what the host does while the GPU waits for it. The profiler slows the
host (on the H200 a 4 ms chain step took 7-10 ms under it) but not the kernels, so these idle figures are
upper bounds that overstate the host's share; the kernel counts and kernel times are not affected. CUDA only.

    python benchmarks/gpu_timeline.py [--max-new 96] [--settings "eagle3 chain k=5,eagle3 tree 4x5x24"] [--top 8]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
PHASES = ("propose", "observe", "forward", "verify", "walk", "commit", "truncate", "publish", "step")


def _annotated(fn, label):
    from torch.profiler import record_function

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with record_function(f"phase:{label}"):
            return fn(*args, **kwargs)
    return wrapper


@contextlib.contextmanager
def annotate_phases(dec):
    """Wrap the engine's phase calls in ``record_function("phase:NAME")`` ranges for the duration (restored after)."""
    from specviz import engine, events, static_runner
    from specviz.sampling import tree as tree_sampling
    from specviz.verify import QueuedStep, StepVerifier

    patches = [(static_runner.StaticRunner, "forward_features", "forward"),
               (static_runner.StaticRunner, "commit", "commit"),
               (static_runner.StaticRunner, "truncate", "truncate"),
               (tree_sampling, "_walk", "walk"),
               (StepVerifier, "queue", "verify"),  # a chain's or a tree's verification, queued
               (QueuedStep, "result", "verify"),  # its wait, and a tree's walk
               (events.Publication, "__call__", "publish"),
               (engine.SpecDecoder, "_step", "step")]
    # what each owner held itself (an inherited method, e.g. the runner's commit, is removed again, not copied in)
    saved = [(obj, name, vars(obj).get(name)) for obj, name, _ in patches]
    make = dec.make_proposer

    def make_proposer(*args, **kwargs):
        p = make(*args, **kwargs)
        if p is not None:
            p.propose, p.observe = _annotated(p.propose, "propose"), _annotated(p.observe, "observe")
        return p

    try:
        for obj, name, label in patches:
            setattr(obj, name, _annotated(getattr(obj, name), label))
        dec.make_proposer = make_proposer
        yield
    finally:
        for obj, name, fn in saved:
            if fn is None:
                delattr(obj, name)
            else:
                setattr(obj, name, fn)
        del dec.make_proposer


def timeline(events: list[dict]) -> dict:
    """From a chrome trace's events: per phase (kernel count, kernel ms), the GPU busy ms (union of intervals) and
    the top kernels by time. A kernel's phase is the OUTERMOST phase range open on the host at its launch."""
    ranges = sorted((e["ts"], e["ts"] + e["dur"], e["name"][len("phase:"):]) for e in events
                    if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("phase:"))
    launch = {e["args"]["correlation"]: e["ts"] for e in events
              if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    gpu = [e for e in events if e.get("cat") in GPU_CATS]
    count, ms = collections.Counter(), collections.Counter()
    by_name = collections.Counter()
    for e in gpu:
        t = launch.get(e.get("args", {}).get("correlation"))
        phase = "outside"
        if t is not None:
            # outermost open range, but "step" only when no inner phase holds it
            open_ = [(b - a, name) for a, b, name in ranges if a <= t <= b]
            inner = [x for x in open_ if x[1] != "step"]
            phase = max(inner)[1] if inner else ("step" if open_ else "outside")
        count[phase] += 1
        ms[phase] += e["dur"] / 1e3
        by_name[e["name"][:70]] += e["dur"] / 1e3
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in gpu)
    busy, end, gaps = 0.0, None, []
    for a, b in spans:
        if end is not None and a > end:
            gaps.append((end, a))
        if end is None or a > end:
            busy += b - a
            end = b
        elif b > end:
            busy += b - end
            end = b
    return {"count": count, "ms": ms, "busy_ms": busy / 1e3, "top": by_name.most_common(),
            "idle": idle_by_phase(gaps, ranges)}


def idle_by_phase(gaps: list[tuple[float, float]], ranges: list[tuple[float, float, str]]) -> collections.Counter:
    """GPU idle time (ms) by the host phase open meanwhile: each idle interval's time goes to the INNERMOST phase
    range open at each moment ("between" when none is: the engine's loop between steps)."""
    out = collections.Counter()
    for g0, g1 in gaps:
        cuts = sorted({g0, g1, *(t for a, b, _ in ranges for t in (a, b) if g0 < t < g1)})
        for a, b in zip(cuts, cuts[1:]):
            mid = (a + b) / 2
            open_ = [(r1 - r0, name) for r0, r1, name in ranges if r0 <= mid <= r1]
            out[min(open_)[1] if open_ else "between"] += (b - a) / 1e3
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-new", type=int, default=96)
    ap.add_argument("--settings", default=None, help="comma-separated names from host_ops.SETTINGS (default: all)")
    ap.add_argument("--top", type=int, default=8, help="kernels listed per setting")
    ap.add_argument("--trace-on", action="store_true", help="the detailed trace on (default off)")
    ap.add_argument("--shape", default=None, help="a bench_shapes.py shape (1b, 8b): its random Llama target and 74 M "
                    "draft instead of the bundled models; settings: method none and draft_model synthetic "
                    "a = 0.8, k = 4")
    a = ap.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    from bench_e2e import DEMO_PROMPT
    from host_ops import SETTINGS
    from specviz import SpecDecoder

    if not torch.cuda.is_available():
        raise SystemExit("gpu_timeline.py needs CUDA")
    settings = dict(SETTINGS)
    names = [s.strip() for s in a.settings.split(",")] if a.settings else list(settings)
    prompt = DEMO_PROMPT
    if a.shape:
        import bench_shapes as bs
        from specviz.static_runner import StaticRunner

        target, draft = (bs.build(cfg, torch.device("cuda"), torch.bfloat16, seed)
                         for cfg, seed in ((bs.SHAPES[a.shape], 0), (bs.DRAFT, 1)))
        dec = SpecDecoder(target, bs.IdTokenizer(), draft, runner_factory=functools.partial(
            StaticRunner, max_cache_len=bs.PROMPT_LEN + a.max_new + 16))
        prompt = torch.randint(0, bs.SHAPES[a.shape]["vocab_size"], (bs.PROMPT_LEN,),
                               generator=torch.Generator().manual_seed(0)).tolist()
        settings = {"draft_model synthetic a=0.8 k=4": dict(
            method="draft_model", verify="synthetic", num_speculative_tokens=bs.K,
            synthetic_rates=[0.8 ** i for i in range(1, bs.K + 1)], temperature=0.0)}
        names = list(settings)
    else:
        dec = SpecDecoder.from_pretrained(device="cuda", runner="static")
    print(f"GPU time per step by phase; trace {'on' if a.trace_on else 'off'}, {a.max_new} new tokens, static runner")
    for name in ["method none"] + names:
        kw = settings.get(name, dict(method="none"))
        for _ in range(2):  # capture, compile, warm
            dec.generate(prompt, max_new_tokens=a.max_new, detailed_trace=a.trace_on, **kw)
        torch.cuda.synchronize()
        with annotate_phases(dec), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            tr = dec.generate(prompt, max_new_tokens=a.max_new, detailed_trace=a.trace_on, **kw)
            torch.cuda.synchronize()
            wall = (time.perf_counter() - t0) * 1e3
        fd, path = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
        os.unlink(path)
        t = timeline(events)
        steps = len(tr.steps)
        tau = tr.metrics["mean_acceptance_length"]
        print(f"\n## {name}: {steps} steps, tau {tau:.2f}; per step: wall {wall / steps:.2f} ms (under the profiler), "
              f"GPU busy {t['busy_ms'] / steps:.2f} ms ({100 * t['busy_ms'] / wall:.0f}%), "
              f"kernels {sum(t['count'].values()) / steps:.0f}")
        for phase in PHASES + ("outside",):
            if t["count"][phase]:
                print(f"    {phase:8s} {t['count'][phase] / steps:6.1f} kernels {t['ms'][phase] / steps:7.3f} ms")
        idle = t["idle"]
        print(f"    GPU idle {sum(idle.values()) / steps:.3f} ms per step under the profiler (an upper bound: it slows "
              f"the host), by the host phase open meanwhile (innermost): "
              + ", ".join(f"{k} {v / steps:.3f}" for k, v in idle.most_common()))
        for kname, kms in t["top"][: a.top]:
            print(f"      {kms / steps:7.3f} ms  {kname}")


if __name__ == "__main__":
    main()
