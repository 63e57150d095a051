"""The app's launch with the background compile stage, without the web server: what a run waits for, and what a second
launch on the same machine gets from the caches (CUDA; the bundled models, bf16).

Each launch is a new process that does what ``app.py --compile-background`` does behind its page: a
:class:`specviz.ui.cache.DecoderCache` with ``compile="background"`` loads the models and warms up on a background
thread (:mod:`specviz.warmup`, whose last stage compiles behind the served graphs: :mod:`specviz.compile_stage`,
:mod:`specviz.precompile`), while the main thread sends runs one after the other the way the app's Run does
(``DecoderCache.in_use``: a run waits for at most the warm-up unit in progress). Per run: when it was sent (s after
the launch), its wall time (the wait for a unit included), its own graph captures (``capture_ms``, outside its step
times), which graphs it replayed (``runner_compiled``) and the warm-up line at that moment. A run's wall time beside
the runs after the warm-up is what the stage made it wait. The launch ends a few runs after the warm-up has.

Launches share ``--work``'s Inductor / Triton cache directories and specviz's compile-cache file, so the second one
starts from the first one's caches. Printed line by line as it happens (``at_s``); ``--out`` gets one JSON object.

    python3 benchmarks/compile_background.py --launches 2 --out $OUT/compile_background.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
PROMPT = "class LlamaDecoderLayer(nn.Module):\n    def __init__(self, config, layer_idx):"


def child(args: argparse.Namespace) -> None:
    """One launch (see the module docstring); every event is a JSON line on stdout."""
    t0 = time.perf_counter()

    def say(**row) -> None:
        print(json.dumps({"at_s": round(time.perf_counter() - t0, 2), **row}), flush=True)

    import torch

    from specviz.ui.cache import DecoderCache

    cache = DecoderCache(device=args.device, compile="background")
    dec = cache.get()  # loads, then starts the warm-up thread
    say(event="loaded", device=torch.cuda.get_device_name() if dec.device.type == "cuda" else "cpu",
        status=cache.status)
    after, n = 0, 0
    end = time.perf_counter() + args.timeout
    while time.perf_counter() < end and after < args.runs_after:
        line = cache.status
        sent = time.perf_counter()
        with cache.in_use():
            waited = time.perf_counter() - sent
            trace = dec.generate(PROMPT, method=args.method, num_speculative_tokens=args.k, temperature=0.0,
                                 max_new_tokens=args.max_new_tokens)
        wall = time.perf_counter() - sent
        n += 1
        warmed = cache.warmed.is_set()
        after += int(warmed)
        m = trace.metrics
        say(event="run", n=n, wall_s=round(wall, 3), waited_s=round(waited, 3), capture_ms=m.get("capture_ms"),
            tokens_per_s=m.get("decode_tokens_per_second"), runner=trace.config.get("runner_compiled"),
            warm_up_line=line[:160], warmed_up=warmed)
        time.sleep(args.gap)
    st = dec.compile_status
    say(event="end", warmed_up=cache.warmed.is_set(), warm_up_error=cache.warm_up_error,
        compile={"state": st.state, "done": st.done, "total": st.total, "failed": st.failed,
                 "seconds": round(st.seconds, 1), "artifacts": st.artifacts, "where": st.where},
        warm_up_report=cache.warm_up_report)
    from specviz import precompile

    precompile.stop_all()  # os._exit skips atexit: the compiling process must not run on into the next launch
    os._exit(0)  # the warm-up thread may still be compiling: a launch cut short ends here


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--launches", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=240.0,
                    help="seconds of runs per launch at most (two launches fit gpu_call.sh's 560 s)")
    ap.add_argument("--runs-after", type=int, default=3, help="runs after the warm-up has ended, then the launch ends")
    ap.add_argument("--gap", type=float, default=2.0, help="seconds between runs (a user reading the last one)")
    ap.add_argument("--method", default="draft_model")
    ap.add_argument("-k", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--work", default="/tmp/specviz-compile-background", help="the caches the launches share")
    ap.add_argument("--device", default="cuda", help="cuda (what it is for); cpu runs the same code uncompiled")
    ap.add_argument("--out", default=None)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a)
        return
    work = Path(a.work)
    env = dict(os.environ, PYTHONUNBUFFERED="1", TORCHINDUCTOR_CACHE_DIR=str(work / "inductor"),
               TRITON_CACHE_DIR=str(work / "triton"), SPECVIZ_COMPILE_CACHE=str(work / "specviz"))
    out: dict = {"launches": []}
    passed = ["--timeout", str(a.timeout), "--runs-after", str(a.runs_after), "--gap", str(a.gap), "--method",
              a.method, "-k", str(a.k), "--max-new-tokens", str(a.max_new_tokens), "--device", a.device]
    for i in range(a.launches):
        rows: list[dict] = []
        print(json.dumps({"launch": i + 1}), flush=True)
        proc = subprocess.Popen([sys.executable, __file__, "--child", *passed], env=env, stdout=subprocess.PIPE,
                                text=True)
        for line in proc.stdout:  # printed as it comes: a call cut short keeps what it measured
            print(line.rstrip(), flush=True)
            if line.startswith("{"):
                rows.append(json.loads(line))
        proc.wait()
        out["launches"].append({"exit": proc.returncode, "events": rows})
        if a.out:
            Path(a.out).parent.mkdir(parents=True, exist_ok=True)
            Path(a.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
