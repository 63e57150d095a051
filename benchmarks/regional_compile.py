"""Whole-forward against regional (per decoder layer) torch.compile in the static runner: compile time and replay.

The static runner compiles its whole forward (:meth:`specviz.static_runner.StaticRunner._model_out`), so Dynamo and
Inductor see every decoder layer of the model in each graph. PyTorch's regional-compilation recipe compiles the
repeated block instead: each decoder layer's ``forward`` through ``torch.compile``, the embedding, final norm and LM
head eager. Inductor's FX-graph cache then serves layers 2..N from layer 1's compile (one miss per shape kind). This
benchmark measures both scopes side by side, each in a fresh process, first with empty Inductor / Triton caches
(cold) and then again on the caches the cold process left (warm):

* ``compile_s``: wall seconds of the compile and CUDA-graph capture of each chain width (1 and ``--widths``);
* ``replay_ms``: median GPU ms of one graph replay at each width (CUDA events), uncompiled beside compiled;
* ``max_abs_diff``: the compiled graph's logits against the uncompiled graph's (same prompt, same position).

Shapes: ``bundled`` (the demo target, 20 layers), ``1b`` / ``8b`` (Llama shapes of ``bench_shapes.py``, random
bf16). Prints one JSON line per process and a table of medians and ratios at the end. ``--dry-run``: a 2-layer
model on the CPU with the ``eager`` backend (the code path only, for CI).

    python3 benchmarks/regional_compile.py --shapes bundled,8b --out $OUT/regional.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_shapes import DRY_SHAPES, PROMPT_LEN, SHAPES, build, forward_gpu_ms  # noqa: E402

from specviz.compiled_graphs import raise_recompile_limit  # noqa: E402
from specviz.static_runner import StaticRunner  # noqa: E402

SCOPES = ("model", "layers")


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated decoder blocks: the ModuleList of ``config.num_hidden_layers`` entries."""
    n = model.config.num_hidden_layers
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == n:
            return list(module)
    raise ValueError(f"no ModuleList of {n} decoder layers in {type(model).__name__}")


def regional(runner: StaticRunner, backend: str):
    """A compiled ``_model_out`` for ``runner`` that runs each decoder layer's forward through torch.compile (the
    layers' own ``forward`` is restored after each call, so the eager prefill and the uncompiled graphs keep it)."""
    layers = decoder_layers(runner.model)
    compiled = [torch.compile(layer.forward, backend=backend, dynamic=None) for layer in layers]

    @contextlib.contextmanager
    def swapped():
        before = [vars(layer).get("forward") for layer in layers]  # an instance forward set by others (hooks) stays
        for layer, fn in zip(layers, compiled):
            layer.forward = fn
        try:
            yield
        finally:
            for layer, old in zip(layers, before):
                if old is None:
                    del layer.forward
                else:
                    layer.forward = old

    def model_out(ids, hidden):
        with swapped():
            return runner._model_out(ids, hidden)
    return model_out


def load(shape: str, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    if shape == "bundled":
        from specviz.models import load_model
        return load_model(str(ROOT / "assets/models/specviz-target"), device, dtype)
    return build((DRY_SHAPES | SHAPES)[shape], device, dtype, 0)


def child(shape: str, scope: str, widths: list[int], repeats: int, dry: bool) -> dict:
    """One process: the uncompiled graphs of every width, then the compiled ones of ``scope``, timed."""
    device = torch.device("cpu" if dry else "cuda")
    dtype = torch.float32 if dry else torch.bfloat16
    backend = "eager" if dry else "inductor"
    t0 = time.perf_counter()
    model = load(shape, device, dtype)
    prompt = torch.randint(0, model.config.vocab_size, (PROMPT_LEN,), generator=torch.Generator().manual_seed(0))
    out = {"shape": shape, "scope": scope, "load_s": time.perf_counter() - t0, "widths": {}}
    with torch.inference_mode():
        ref = {}
        plain = StaticRunner(model, PROMPT_LEN + 64, cuda_graphs=not dry, compile=False)
        plain.forward(prompt.to(device))
        for n in widths:
            rows = prompt[-n:].to(device)
            ref[n] = plain.forward(rows)
            plain.truncate(PROMPT_LEN)
            out["widths"][n] = {"uncompiled_ms": None if dry else forward_gpu_ms(plain, n, repeats)}
        del plain
        runner = StaticRunner(model, PROMPT_LEN + 64, cuda_graphs=not dry, compile=False)
        raise_recompile_limit()
        if scope == "model":
            runner._compiled = torch.compile(runner._model_out, backend=backend, dynamic=None)
        else:
            runner._compiled = regional(runner, backend)
        runner.forward(prompt.to(device))
        for n in widths:
            rows = prompt[-n:].to(device)
            t = time.perf_counter()
            logits = runner.forward(rows)  # the compile and the capture happen in this first forward
            if not dry:
                torch.cuda.synchronize()
            row = out["widths"][n]
            row["compile_s"] = time.perf_counter() - t
            row["max_abs_diff"] = float((logits - ref[n]).abs().max())
            row["argmax_equal"] = bool(torch.equal(logits.argmax(-1), ref[n].argmax(-1)))
            runner.truncate(PROMPT_LEN)
            row["compiled_ms"] = None if dry else forward_gpu_ms(runner, n, repeats)
        out["compiled_graphs"] = len(runner.compiled_keys())
    return out


def render(rows: list[dict]) -> str:
    lines = ["| shape | scope | caches | width | compile + capture s | uncompiled ms | compiled ms | ratio | "
             "max abs diff |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        for n, w in r["widths"].items():
            ratio = (f"{w['uncompiled_ms'] / w['compiled_ms']:.2f}x" if w.get("compiled_ms") else "")
            fmt = lambda v: "" if v is None else f"{v:.3f}"  # noqa: E731
            lines.append(f"| {r['shape']} | {r['scope']} | {r['caches']} | {n} | {w.get('compile_s', 0):.1f} | "
                         f"{fmt(w['uncompiled_ms'])} | {fmt(w.get('compiled_ms'))} | {ratio} | "
                         f"{w.get('max_abs_diff', 0):.2e} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default="bundled,8b")
    p.add_argument("--widths", default="1,5", help="chain widths compiled and timed (comma-separated)")
    p.add_argument("--repeats", type=int, default=100)
    p.add_argument("--out", type=Path)
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    widths = [int(w) for w in args.widths.split(",")]
    if args.child:
        shape, scope = args.child.split(":")
        print("RESULT " + json.dumps(child(shape, scope, widths, args.repeats, args.dry_run)), flush=True)
        return []
    rows = []
    shapes = ["dry"] if args.dry_run else args.shapes.split(",")
    for shape in shapes:
        for scope in SCOPES:
            cache = tempfile.mkdtemp(prefix=f"regional-{shape}-{scope}-")
            env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=f"{cache}/inductor", TRITON_CACHE_DIR=f"{cache}/triton")
            for caches in ("cold", "warm"):
                cmd = [sys.executable, __file__, "--child", f"{shape}:{scope}", "--widths", args.widths,
                       "--repeats", str(args.repeats)] + (["--dry-run"] if args.dry_run else [])
                t = time.perf_counter()
                done = subprocess.run(cmd, env=env, capture_output=True, text=True)
                found = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
                if done.returncode or not found:
                    print(f"{shape} {scope} {caches}: failed (exit {done.returncode})\n{done.stderr[-2000:]}",
                          flush=True)
                    continue
                row = json.loads(found[-1][7:]) | {"caches": caches, "process_s": time.perf_counter() - t}
                print(json.dumps(row), flush=True)
                rows.append(row)
    print(render(rows), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        device = "cpu" if args.dry_run else torch.cuda.get_device_name()
        args.out.write_text(json.dumps({"device": device, "torch": torch.__version__, "rows": rows}, indent=1))
    return rows


if __name__ == "__main__":
    main()
