"""The app under load, driven through gradio_client against a launched app bound to 127.0.0.1.

Two checks:

* concurrent sessions: N sessions (8 by default), each with its own method / verification / prompt /
  seed, submit at once. Every session's exported trace must belong to it (its prompt, method,
  verify, seed) and equal, token for token, what the same request gave when it ran alone (runs are
  reproducible for a seed); and no session may wait past a stated bound: its finish time after the
  common start is at most ``STALL_FACTOR`` x the sum of all the sessions' solo times + ``STALL_SLACK_S``
  (i.e. never worse than running them one after the other, with margin for a shared machine).
* soak: R consecutive runs (200 by default) in one app process, cycling through the same
  requests (a new client session every 25 runs), sampling the process's RSS (``/proc/self/status``)
  and, on CUDA, ``torch.cuda.memory_allocated`` / ``memory_reserved`` after every run; growth is the
  least-squares slope over the second half of the runs (MB per run) and the difference between the
  means of the last and the first quarter of that half.

    python benchmarks/load_app.py --soak 200 --out results/load/soak.json      # the committed figures
    python benchmarks/load_app.py --device cuda --soak 200                      # on a GPU

``tests/test_load.py`` runs a short version of both in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

STALL_FACTOR, STALL_SLACK_S = 1.5, 20.0
CODE = ("def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n\ndef add(a, b):\n")

# (method, verify, temperature, seed, prompt, synthetic rates): one per session, every method and verify mode
REQUESTS: list[tuple[str, str, float, int, str, str]] = [
    ("none", "auto", 0.0, 1, "for i in range(10):\n", ""),
    ("ngram", "greedy", 0.0, 2, CODE, ""),
    ("ngram_gpu", "greedy", 0.0, 3, "class A:\n    pass\n\nclass B:\n    pass\n\nclass", ""),
    ("suffix", "greedy", 0.0, 4, "x = [1, 2, 3]\ny = [1, 2, 3]\nz =", ""),
    ("draft_model", "greedy", 0.0, 5, "import torch\nimport torch.nn as nn\n", ""),
    ("draft_model", "standard", 1.0, 6, "def main():\n    print(", ""),
    ("draft_model", "block", 0.8, 7, "while True:\n    if", ""),
    ("ngram", "synthetic", 0.0, 8, CODE.replace("add", "mul"), "0.9, 0.8, 0.7, 0.6"),
]


def run_args(req: tuple, max_new: int, compare: bool = False, pairs: int = 1) -> tuple:
    """The /run endpoint's inputs for one of REQUESTS (k = 4, prompt lookup 1..3): a RunRequest's values."""
    from specviz.ui.run import RunRequest

    method, verify, temp, seed, prompt, rates = req
    return RunRequest(prompt=prompt, method=method, num_speculative_tokens=4, verify=verify, temperature=temp,
                      top_k=0, top_p=1.0, max_new_tokens=max_new, seed=seed, synthetic_rates=rates, compare=compare,
                      pairs=pairs, options={"prompt_lookup_min": 1, "prompt_lookup_max": 3}).values()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(target: str | None, draft: str | None, device: str | None):
    """Build, warm up and launch the app in this process on 127.0.0.1. Returns (demo, url)."""
    from specviz.ui import build_app, launch_options
    from specviz.ui.cache import DecoderCache

    cache = DecoderCache(target, draft, device)
    cache.wait_warmed_up()  # the load and warm-up are not part of what is measured
    demo = build_app(target, draft, device, cache=cache)
    port = free_port()
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, quiet=True, **launch_options())
    demo.specviz_cache = cache  # for scripts that also drive the app's warm decoder directly
    return demo, f"http://127.0.0.1:{port}/"


def exported(client) -> Any:
    """The session's current trace, as Export writes it."""
    from specviz.trace import Trace

    path = [p for p in client.predict(0, 1, api_name="/export") if p.endswith("trace.json")][0]
    return Trace.from_json(Path(path).read_text(encoding="utf-8"))


def check_belongs(trace: Any, req: tuple, max_new: int) -> None:
    """Raise AssertionError unless ``trace`` is the run of ``req``."""
    method, verify, temp, seed, prompt, _ = req
    cfg = trace.config
    want_verify = ("greedy" if temp == 0 else "standard") if verify == "auto" else verify
    got = (trace.prompt_text, cfg["method"], cfg["verify"], cfg["seed"], cfg["temperature"], cfg["max_new_tokens"])
    assert got == (prompt, method, want_verify, seed, temp, max_new), (got, req)


def concurrent_sessions(url: str, max_new: int = 24, requests: list[tuple] = REQUESTS) -> dict[str, Any]:
    """Each request alone, then all at once from one session each (see the module docstring).
    Returns the timings and raises AssertionError on a mixed trace, a changed output or a stall."""
    from gradio_client import Client

    solo, outputs = [], []
    for req in requests:
        client = Client(url, verbose=False)
        t0 = time.perf_counter()
        out = client.predict(*run_args(req, max_new), api_name="/run")
        solo.append(time.perf_counter() - t0)
        assert out[0].startswith("**done**"), out[0]
        trace = exported(client)
        check_belongs(trace, req, max_new)
        outputs.append(trace.output_token_ids)
    clients = [Client(url, verbose=False) for _ in requests]
    results: list[Any] = [None] * len(requests)
    first: list[float | None] = [None] * len(requests)
    start = threading.Barrier(len(requests) + 1)
    t_start: list[float] = []

    def session(i: int) -> None:
        start.wait()
        job = clients[i].submit(*run_args(requests[i], max_new), api_name="/run")
        while not job.done():
            if first[i] is None and job.outputs():
                first[i] = time.perf_counter() - t_start[0]
            time.sleep(0.02)
        results[i] = (job.result(), time.perf_counter() - t_start[0])

    threads = [threading.Thread(target=session, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    t_start.append(time.perf_counter())
    start.wait()
    bound = STALL_FACTOR * sum(solo) + STALL_SLACK_S
    for t in threads:
        t.join(timeout=bound + 60)
    finish = []
    for i, req in enumerate(requests):
        assert results[i] is not None, f"session {i} ({req[0]}) did not finish within {bound + 60:.0f} s"
        out, done_at = results[i]
        assert out[0].startswith("**done**"), (req, out[0])
        trace = exported(clients[i])
        check_belongs(trace, req, max_new)
        assert trace.output_token_ids == outputs[i], f"session {i} ({req[0]}/{req[1]}): output differs from its solo run"
        finish.append(done_at)
    assert max(finish) <= bound, f"a session waited {max(finish):.1f} s, past the bound {bound:.1f} s"
    return {"sessions": len(requests), "max_new_tokens": max_new, "solo_s": solo, "solo_sum_s": sum(solo),
            "first_update_s": first, "finish_s": finish, "max_finish_s": max(finish), "bound_s": bound,
            "requests": [f"{r[0]}/{r[1]}/T{r[2]}" for r in requests]}


def rss_mb() -> float:
    """This process's resident set size, MB (Linux /proc/self/status VmRSS)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cuda_mb() -> tuple[float, float] | None:
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.memory_allocated() / 2**20, torch.cuda.memory_reserved() / 2**20


_CAPTURES = [0]


def graph_captures() -> int:
    """CUDA-graph captures begun in this process since the first call (a wrapper on
    ``torch.cuda.CUDAGraph.capture_begin``, installed once): a soak whose count keeps rising re-captures
    graphs per run, and a capture's host memory is what RSS growth on a GPU would come from."""
    import torch

    cls = torch.cuda.CUDAGraph
    if not getattr(cls, "_specviz_counted", False):
        original = cls.capture_begin

        def counted(self, *args, **kwargs):
            _CAPTURES[0] += 1
            return original(self, *args, **kwargs)

        cls.capture_begin, cls._specviz_counted = counted, True
    return _CAPTURES[0]


def _slope(ys: list[float]) -> float:
    xs = list(range(len(ys)))
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else 0.0


def growth(samples: list[float]) -> dict[str, float]:
    """Growth over the second half of ``samples``: slope (MB per run) and last-quarter minus
    first-quarter mean (MB)."""
    half = samples[len(samples) // 2:]
    q = max(len(half) // 4, 1)
    return {"slope_mb_per_run": _slope(half), "late_minus_early_mb": statistics.fmean(half[-q:]) -
            statistics.fmean(half[:q]), "first_mb": samples[0], "last_mb": samples[-1], "max_mb": max(samples)}


def soak(url: str, runs: int = 200, max_new: int = 24, compare_every: int = 4, new_session_every: int = 25,
         requests: list[tuple] = REQUESTS, report_every: int = 0) -> dict[str, Any]:
    """``runs`` consecutive runs (every ``compare_every``-th with the method-none measurement, one
    pair), sampling memory after each. Returns the samples and their growth; ``report_every`` > 0
    also prints one JSON line of the memory so far every that many runs (a time limit keeps them)."""
    from gradio_client import Client

    import gc

    rss, cuda, times, captures, threads = [], [], [], [], []
    client = None
    graph_captures()
    for n in range(runs):
        if n % new_session_every == 0:
            client = Client(url, verbose=False)
        req = requests[n % len(requests)]
        t0 = time.perf_counter()
        out = client.predict(*run_args(req, max_new, compare=n % compare_every == 0), api_name="/run")
        times.append(time.perf_counter() - t0)
        assert out[0].startswith("**done**"), (n, req, out[0])
        gc.collect()
        rss.append(rss_mb())
        captures.append(graph_captures())
        threads.append(threading.active_count())
        c = cuda_mb()
        if c is not None:
            cuda.append(c)
        if report_every and (n + 1) % report_every == 0:
            print(json.dumps({"soak_runs": n + 1, "rss_mb": round(rss[-1], 1), "run_s_median": statistics.median(times),
                              "graph_captures": captures[-1], "threads": threads[-1],
                              "cuda_allocated_reserved_mb": [round(x, 1) for x in cuda[-1]] if cuda else None}),
                  flush=True)
    result = {"runs": runs, "max_new_tokens": max_new, "run_s_median": statistics.median(times),
              "rss_mb": rss, "rss_growth": growth(rss), "graph_captures": [captures[0], captures[-1]] if captures else [],
              "threads": [min(threads), max(threads)] if threads else []}
    if cuda:
        result["cuda_allocated_growth"] = growth([a for a, _ in cuda])
        result["cuda_reserved_growth"] = growth([r for _, r in cuda])
    return result


def handler_soak(cache: Any, runs: int = 160, max_new: int = 24, compare_every: int = 4,
                 requests: list[tuple] = REQUESTS) -> dict[str, Any]:
    """The soak without the web server: the Run handler called in this process (engine, handlers,
    views, the measurement), one session state carried over; RSS after every run (after gc)."""
    import gc

    from specviz.ui import handlers
    from specviz.ui.cache import StopSignals

    signals, state, rss = StopSignals(), None, []
    for n in range(runs):
        out = None
        for out in handlers.run(cache, signals, state, *run_args(requests[n % len(requests)], max_new,
                                                                 compare=n % compare_every == 0)):
            pass
        assert str(out[0]).startswith("**done**"), out[0]
        state = out[-1]
        gc.collect()
        rss.append(rss_mb())
    return {"runs": runs, "rss_mb": rss, "rss_growth": growth(rss)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=None)
    ap.add_argument("--draft", default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--soak", type=int, default=200, help="consecutive runs (0: skip)")
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--out", default=None, help="write the figures here (JSON)")
    args = ap.parse_args()
    demo, url = launch(args.target, args.draft, args.device)
    try:
        report = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.platform(),
                  "cpus": os.cpu_count(), "device": args.device,
                  "commit": subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                                           capture_output=True, text=True).stdout.strip(),
                  "concurrent": concurrent_sessions(url, args.max_new_tokens)}
        print(json.dumps(report["concurrent"], indent=1))
        if args.soak:
            report["soak"] = soak(url, args.soak, args.max_new_tokens)
            print(json.dumps({k: v for k, v in report["soak"].items() if k != "rss_mb"}, indent=1))
            from specviz.ui.cache import DecoderCache

            cache = DecoderCache(args.target, args.draft, args.device)
            report["handler_soak"] = handler_soak(cache, args.soak, args.max_new_tokens)
            print(json.dumps(report["handler_soak"]["rss_growth"], indent=1))
    finally:
        demo.close()
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
