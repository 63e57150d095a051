"""A static Medusa tree chosen from measured acceptance (Cai et al. 2024, section 3.3.2: the tree that maximises the
expected accepted length for a node budget), for the bundled target and Medusa heads.

Calibration text: Python standard-library files of the machine it runs on (in the training corpus's distribution;
not the held-out prompts the tree is then judged on). For every position t, with the text's own prefix: head i's
candidates ranked on the target's final-norm feature f_t, and the target's argmax at position t + 1 + i (what greedy
verification accepts at depth i + 1 after the root x_{t+1}). A path (r_1, .., r_d) of candidate ranks is accepted at
t when each depth's label is that rank's candidate; its probability is counted, not assumed independent across heads.
The best ``--nodes`` paths by probability form the tree (prefix-closed: a path is never likelier than its prefix;
ties go to the shorter, then smaller ranks). Prints the tree in vLLM's ``speculative_token_tree`` format and the
expected accepted length of it and of ``DEFAULT_MEDUSA_TREE`` on the calibration text.

    python scripts/medusa_tree.py [--nodes 31] [--tokens 40000] [--ranks 8] [--head DIR]
"""

from __future__ import annotations

import argparse
import sys
import sysconfig
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def calibration_ids(tok, tokens: int, window: int) -> list[list[int]]:
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    windows, buf = [], []
    for f in files:
        buf += tok.encode(f.read_text(encoding="utf-8", errors="replace"))
        while len(buf) >= window:
            windows.append(buf[:window])
            buf = buf[window:]
        if len(windows) * window >= tokens:
            break
    return windows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=31)
    ap.add_argument("--tokens", type=int, default=40_000)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--head", default=None, help="Medusa head directory (default: the bundled one)")
    a = ap.parse_args()
    import torch

    from specviz import tree as tree_mod
    from specviz.heads.io import default_head_dir, load_head
    from specviz.models import DEFAULT_TARGET, load_model, load_tokenizer
    from specviz.methods.medusa.proposer import DEFAULT_MEDUSA_TREE

    torch.manual_seed(0)
    target = load_model(DEFAULT_TARGET, torch.device("cpu"), torch.float32)
    tok = load_tokenizer(DEFAULT_TARGET)
    head = load_head(a.head or default_head_dir("medusa"), target, torch.float32)
    K = head.config.num_heads
    counts: Counter = Counter()
    positions = 0
    with torch.inference_mode():
        for ids in calibration_ids(tok, a.tokens, a.window):
            x = torch.tensor([ids])
            out = target.model(input_ids=x)
            final = out.last_hidden_state[0]  # [T, d]
            labels = target.lm_head(final).argmax(-1)  # [T]: argmax at position t (predicting t + 1)
            cand = head(final).topk(a.ranks, dim=-1).indices  # [K, T, R]: head i on f_t predicts x_{t+2+i}
            T = len(ids)
            for t in range(T - K - 1):
                path = []
                for i in range(K):
                    hit = (cand[i, t] == labels[t + 1 + i]).nonzero()
                    if not len(hit):
                        break
                    path.append(int(hit[0]))
                    counts[tuple(path)] += 1
                positions += 1
    prob = {p: c / positions for p, c in counts.items()}
    best = sorted(prob, key=lambda p: (-prob[p], len(p), p))[: a.nodes]
    chosen = set(best)
    assert all(p[:j] in chosen for p in best for j in range(1, len(p))), "not prefix-closed"
    ordered = sorted(best, key=lambda p: (len(p), p))
    print(f"calibration: {positions} positions of the {sysconfig.get_paths()['stdlib']} files")
    print("tree:", "[" + ", ".join("(" + ", ".join(map(str, p)) + ("," if len(p) == 1 else "") + ")" for p in ordered) + "]")
    default = [tuple(p) for p in tree_mod.parse_choices(DEFAULT_MEDUSA_TREE)]
    for name, paths in (("this tree", ordered), ("DEFAULT_MEDUSA_TREE", default)):
        print(f"{name}: {len(paths)} nodes, expected accepted drafts per step {sum(prob.get(p, 0.0) for p in paths):.3f}"
              f" (mean acceptance length {1 + sum(prob.get(p, 0.0) for p in paths):.3f})")


if __name__ == "__main__":
    main()
