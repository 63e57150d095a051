"""Eager device ops the host issues per engine step, by where they come from (why a tree step costs more
host time than a chain step). Prints medians per step over a warm request; no timing, so it runs on the CPU too.

On CUDA with the static runner the count is exact: a CUDA graph replay is not an aten op, so what is counted is what
the host dispatches and launches one by one. On the CPU (no graphs) the calls that CUDA replays from a graph are
counted as ONE op each ("graph regions", listed in ``REGIONS``): the static runner's forwards, the static head
runner's draft graphs, the verifier's core and detail, the K/V compaction. So the CPU figure estimates the CUDA one;
the two differ where a CUDA path skips or adds host work (e.g. the Triton sampler's settings copies).

    python benchmarks/host_ops.py [--device cpu|cuda] [--max-new 48] [--by function|phase] [--top 25]

Each op is charged to the innermost frame under ``specviz/`` that is not in a graph region; the phase is the
``SpecDecoder._step`` callee it ran under (propose, forward_features, queue, result, commit, observe, the previous
step's publish, ...; ``_step`` for torch calls written in ``_step`` itself).
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

SPECVIZ = str(ROOT / "specviz")
# (module, class or None, function): calls replayed from a CUDA graph on the static runners
REGIONS = [
    ("specviz.static_runner", "StaticRunner", "_small"),  # a chain forward (its graph)
    ("specviz.static_runner", "StaticRunner", "_tree_body"),  # a tree forward's graph (mask and model)
    ("specviz.methods.eagle.runner", "StaticHeadRunner", "_forward"),  # a head step / first pass graph
    ("specviz.methods.eagle.runner", "StaticHeadRunner", "_forward_tree"),  # one tree level's graph
    # a whole draft tree's graph (tree_draft's body; a wrapper of tree_draft's fn would not do: the runner keeps the
    # first fn given per key, so a later request's wrapper is never called)
    ("specviz.methods.eagle.runner", "StaticHeadRunner", "_draft_body"),
    ("specviz.verify.chain", None, "_core"),  # the chain verifier's core graph (Triton on CUDA)
    ("specviz.record", None, "gather_detail"),  # its detail graph
    # the tree verifier's core graph (greedy / rule A: StepVerifier.queue_tree's tree_unit on CUDA; on the CPU the
    # same decisions and walk run eagerly through these two) and its detail graph
    ("specviz.sampling.tree", None, "queue_verify_tree"),
    ("specviz.sampling.tree", None, "device_path"),
    ("specviz.record", None, "tree_detail_rows"),
]


# the chain and tree settings this tool and scripts/profile_tree_step.py compare (the demo prompt, bundled models)
SETTINGS = {
    "eagle3 chain k=5": dict(method="eagle3", num_speculative_tokens=5),
    "eagle3 tree 4x5x24": dict(method="eagle3", num_speculative_tokens=6, eagle_tree_top_k=4, eagle_tree_depth=5,
                               eagle_tree_total_tokens=24),
    "eagle3 tree 4x3x12": dict(method="eagle3", num_speculative_tokens=4, eagle_tree_top_k=4, eagle_tree_depth=3,
                               eagle_tree_total_tokens=12),
    "draft_model static tree": dict(method="draft_model", num_speculative_tokens=4,
                                    speculative_token_tree="[(0,), (1,), (0, 0), (0, 1), (0, 0, 0), (0, 0, 0, 0)]"),
}


class Counter(TorchDispatchMode):
    """Counts aten ops by (phase, innermost specviz function); ops inside a region count once, at its entry."""

    def __init__(self):
        super().__init__()
        self.depth = 0  # > 0 inside a graph region
        self.ops: collections.Counter = collections.Counter()

    def charge(self, label: str | None = None) -> None:
        f = sys._getframe(2)
        where, below = label, None  # below: the frame called by SpecDecoder._step (the phase)
        while f is not None:
            co = f.f_code
            if co.co_name == "_step" and co.co_filename.endswith("engine.py"):
                break
            if co.co_filename.startswith(SPECVIZ):
                if where is None:
                    where = f"{Path(co.co_filename).relative_to(ROOT)}:{co.co_name}"
                below = f  # (decorators' frames, e.g. inference_mode's, are skipped)
            f = f.f_back
        if f is None:
            phase = "outside _step"
        elif below is None:
            phase = "_step"  # a torch call written in _step itself
        else:
            phase = {"__call__": "publish (previous step)"}.get(below.f_code.co_name, below.f_code.co_name)
        self.ops[(phase, where or "torch")] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.depth == 0:
            self.charge()
        return func(*args, **(kwargs or {}))


def install_regions(counter: Counter, device: str) -> list:
    """Wrap each region so that, on the CPU, its ops count as one graph replay. Returns undo closures."""
    import importlib

    undo = []
    if device == "cuda":
        return undo  # the graphs themselves are the regions: replays are not aten ops
    for mod_name, cls_name, fn_name in REGIONS:
        mod = importlib.import_module(mod_name)
        owner = getattr(mod, cls_name) if cls_name else mod
        original = getattr(owner, fn_name)

        def wrapped(*a, __original=original, __name=fn_name, **k):
            if counter.depth == 0:
                counter.charge(f"graph replay ({__name})")
            counter.depth += 1
            try:
                return __original(*a, **k)
            finally:
                counter.depth -= 1

        setattr(owner, fn_name, wrapped)
        undo.append(lambda o=owner, n=fn_name, f=original: setattr(o, n, f))
        if cls_name is None:  # module functions imported by name elsewhere: patch those references too
            for other in list(sys.modules.values()):
                if getattr(other, "__name__", "").startswith("specviz") and getattr(other, fn_name, None) is original:
                    setattr(other, fn_name, wrapped)
                    undo.append(lambda o=other, n=fn_name, f=original: setattr(o, n, f))
    return undo


def count_steps(dec, prompt: str, max_new: int, **kw) -> tuple[list[collections.Counter], object]:
    """Per-step op counters of one warm request (the first step, with the drafter's prefill, left out)."""
    per_step: list[collections.Counter] = []
    original = dec._step
    counter = Counter()

    def step(*a, **k):
        counter.ops = collections.Counter()
        with counter:
            out = original(*a, **k)
        per_step.append(counter.ops)
        return out

    undo = install_regions(counter, dec.device.type)
    dec.generate(prompt, max_new_tokens=max_new, **kw)  # warm (captures on CUDA)
    dec._step = step
    try:
        trace = dec.generate(prompt, max_new_tokens=max_new, **kw)
    finally:
        dec._step = original
        for u in undo:
            u()
    return per_step[1:], trace


def summarise(per_step, by: str) -> dict[str, float]:
    keys = {k if by == "function" else k[0] for c in per_step for k in c}
    out = {}
    for key in keys:
        vals = [sum(v for k, v in c.items() if (k if by == "function" else k[0]) == key) for c in per_step]
        out[key] = statistics.median(vals)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--max-new", type=int, default=48)
    ap.add_argument("--by", choices=("function", "phase"), default="phase")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--trace", choices=("on", "off", "both"), default="both")
    ap.add_argument("--only", default="", help="comma-separated substrings of the settings to run (default all)")
    a = ap.parse_args()
    from bench_e2e import DEMO_PROMPT
    from specviz import SpecDecoder

    dec = SpecDecoder.from_pretrained(device=a.device, runner="static")
    settings = SETTINGS
    traces = {"on": (True,), "off": (False,), "both": (True, False)}[a.trace]
    print(f"device {a.device}; eager ops per step (median over the warm request's steps after the first); "
          f"{'exact (graph replays are not ops)' if a.device == 'cuda' else 'graph regions count 1 each'}")
    for name, kw in settings.items():
        if a.only and not any(o.strip() in name for o in a.only.split(",")):
            continue
        for detailed in traces:
            per_step, trace = count_steps(dec, DEMO_PROMPT, a.max_new, detailed_trace=detailed, **kw)
            totals = [sum(c.values()) for c in per_step]
            print(f"\n## {name}, trace {'on' if detailed else 'off'}: {statistics.median(totals):.0f} ops per step "
                  f"(min {min(totals)}, max {max(totals)}, {len(per_step)} steps, "
                  f"tau {trace.metrics['mean_acceptance_length']:.2f})")
            rows = sorted(summarise(per_step, a.by).items(), key=lambda kv: -kv[1])[: a.top]
            for key, v in rows:
                label = key if isinstance(key, str) else f"{key[0]:18s} {key[1]}"
                print(f"  {v:6.1f}  {label}")


if __name__ == "__main__":
    main()
