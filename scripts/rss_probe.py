"""Where the app's host memory grows on CUDA: the same requests as benchmarks/load_app.py's soak, run
on the engine (no web server, no handlers), RSS and the pinned-memory allocator's stats every 20 runs.

    python scripts/rss_probe.py [--runs 240] [--device cuda] [--via direct|thread|pool]

--via: where each request runs: ``direct`` on the main thread; ``thread`` on a new thread per request (what the
app's Run handler did before it ran on a worker thread); ``pool`` through :class:`specviz.ui.worker.BackgroundRun` (the app's
long-lived run threads now).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=240)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--via", default="direct", choices=["direct", "thread", "pool"])
    a = ap.parse_args()
    import threading
    import torch

    from load_app import REQUESTS, rss_mb
    from specviz import SpecDecoder

    dec = SpecDecoder.from_pretrained(device=a.device)
    keep = []
    for n in range(a.runs):
        method, verify, temp, seed, prompt, rates = REQUESTS[n % len(REQUESTS)]
        kw = dict(method=method, num_speculative_tokens=4, temperature=temp, seed=seed, max_new_tokens=24,
                  verify=None if verify == "auto" else verify, prompt_lookup_min=1, prompt_lookup_max=3,
                  synthetic_rates=[float(x) for x in rates.split(",")] if rates else None)
        tr = run(a.via, dec, prompt, kw)
        if n % 4 == 0:
            run(a.via, dec, prompt, dict(method="none", max_new_tokens=24))
        keep = [tr.to_dict()]  # what a session's state keeps: the last trace only
        if (n + 1) % 20 == 0:
            gc.collect()
            row = {"via": a.via, "runs": n + 1, "rss_mb": round(rss_mb(), 1), "threads": threading.active_count()}
            if a.device == "cuda":
                row["cuda_alloc_mb"] = round(torch.cuda.memory_allocated() / 2**20, 1)
                stats = getattr(torch.cuda, "host_memory_stats", None)
                if stats is not None:
                    s = stats()
                    row["pinned"] = {k: s[k] for k in s if "allocated_bytes.current" in k or "reserved_bytes.current" in k
                                     or k in ("num_host_alloc", "num_host_free")}
            print(json.dumps(row), flush=True)
    del keep


def run(via: str, dec, prompt: str, kw: dict):
    """One request on the main thread, a new thread, or the app's run pool; returns its trace."""
    import threading

    if via == "direct":
        return dec.generate(prompt, **kw)
    if via == "thread":
        out = {}
        t = threading.Thread(target=lambda: out.setdefault("trace", dec.generate(prompt, **kw)), daemon=True)
        t.start()
        t.join()
        return out["trace"]
    from specviz.ui.worker import BackgroundRun

    job = BackgroundRun(dec, prompt, kw, threading.Event())
    job.finished.wait()
    if job.error is not None:
        raise job.error
    return job.result()


if __name__ == "__main__":
    main()
