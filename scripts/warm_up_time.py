"""How long ``SpecDecoder.warm_up`` (what the app runs at launch) takes on this machine, with its progress lines
timestamped, so a run cut short still shows how far it got. ``--compile``: the app's ``--compile``.

    python scripts/warm_up_time.py [--compile] [--max-speculative-tokens 12]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--device", default=None)
    ap.add_argument("--max-speculative-tokens", type=int, default=None, help="default: the app's slider maximum")
    a = ap.parse_args()
    from specviz import SpecDecoder
    from specviz.ui.settings import MAX_UI_SPECULATIVE_TOKENS

    t0 = time.perf_counter()
    dec = SpecDecoder.from_pretrained(device=a.device, compile=a.compile or None)
    print(f"{time.perf_counter() - t0:7.1f} s  loaded ({dec.device}, compile={a.compile})", flush=True)
    last = [""]

    def say(line: str) -> None:
        if line.split(" ")[:3] != last[0].split(" ")[:3] or line.endswith("done"):  # one line per kind of work
            print(f"{time.perf_counter() - t0:7.1f} s  {line}", flush=True)
        last[0] = line

    report = dec.warm_up(a.max_speculative_tokens or MAX_UI_SPECULATIVE_TOKENS, progress=say)
    print(f"{time.perf_counter() - t0:7.1f} s  warm_up returned {report}", flush=True)
    t1 = time.perf_counter()
    tr = dec.generate("def add(a, b):\n    return", method="eagle3", num_speculative_tokens=6, max_new_tokens=64,
                      eagle_tree_top_k=4, eagle_tree_depth=5, eagle_tree_total_tokens=24)
    print(f"first eagle3 tree request after warm-up: {time.perf_counter() - t1:.2f} s, "
          f"capture {tr.metrics['capture_ms']:.0f} ms", flush=True)


if __name__ == "__main__":
    main()
