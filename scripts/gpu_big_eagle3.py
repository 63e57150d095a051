"""An 8B-shaped target with an EAGLE-3 head of the published shape, in the app on a GPU.

Builds, with random bf16 weights (nothing is downloaded):

* a Llama-3.1-8B-shaped target (``benchmarks/bench_shapes.py`` SHAPES["8b"]: 32 layers x 4096, 128256 tokens) saved
  with safetensors, with the bundled byte-level tokenizer padded to 128256 ids by added tokens ``<tN>`` (random
  weights generate any id, and each must print);
* an EAGLE-3 head in SafeAILab's layout with the shape of ``yuhuili/EAGLE3-LLaMA3.1-Instruct-8B``
  (``../shared/docs/drafter_formats.md`` 2.1: ``midlayer.*``, ``fc`` [4096, 3 x 4096], ``lm_head`` over a
  32000-token draft vocabulary, ``d2t`` offsets and ``t2d`` mask, no embedding, no ``rope_theta``);

then launches ``python app.py --target T --head eagle3=H`` as a user does and, through the app's ``/run`` and
``/measure`` endpoints, runs eagle3 at k = 4 with ``verify="synthetic"`` (set acceptance rates: random weights agree
with nothing) measured beside method none. Reports the step time, the head's share of it (the trace's draft ms over
the step's draft + verify + sample ms), tokens per target forward and the app's measured speedup. One JSON object
printed and written to --out.

    PYTHONPATH=/root/gpu-site python3 scripts/gpu_big_eagle3.py --out $OUT/big_eagle3.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

EAGLE3_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
             "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 1,
             "rms_norm_eps": 1e-05, "max_position_embeddings": 2048, "vocab_size": 128256,
             "draft_vocab_size": 32000, "tie_word_embeddings": False, "torch_dtype": "float16",
             "hidden_act": "silu", "bos_token_id": 128000, "eos_token_id": 128001, "pad_token_id": None}


def shapes(dry: bool) -> tuple[dict, dict]:
    """(target config, head config): the 8B shapes, or (``--dry-run``) tiny ones for a CPU check of this script."""
    from bench_shapes import SHAPES

    if not dry:
        return SHAPES["8b"], EAGLE3_8B
    target = dict(SHAPES["8b"], hidden_size=64, intermediate_size=128, num_hidden_layers=8, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=8448, max_position_embeddings=512)
    head = dict(EAGLE3_8B, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                vocab_size=8448, draft_vocab_size=4096)
    return target, head


def write_target(path: Path, cfg: dict, device: torch.device, seed: int) -> dict:
    """The random target of config ``cfg`` and its padded tokenizer under ``path``; returns sizes and seconds."""
    from tokenizers import Tokenizer

    from bench_shapes import build

    t0 = time.time()
    model = build(cfg, device, torch.bfloat16, seed)
    built = time.time() - t0
    model.save_pretrained(path, safe_serialization=True, max_shard_size="5GB")
    params = sum(p.numel() for p in model.parameters())
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    bundled = ROOT / "assets/models/specviz-target"
    tok = Tokenizer.from_file(str(bundled / "tokenizer.json"))
    tok.add_tokens([f"<t{i}>" for i in range(tok.get_vocab_size(), cfg["vocab_size"])])
    tok.save(str(path / "tokenizer.json"))
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        if (bundled / name).exists():
            shutil.copy(bundled / name, path / name)
    return {"parameters": params, "build_s": round(built, 1), "saved_s": round(time.time() - t0 - built, 1)}


def write_head(path: Path, c: dict, device: torch.device, seed: int) -> dict:
    """A random EAGLE-3 head of config ``c`` in SafeAILab's layout (see the module docstring) under ``path``."""
    from safetensors.torch import save_file

    H, I, V, Vd = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["draft_vocab_size"]
    kv = H // c["num_attention_heads"] * c["num_key_value_heads"]
    g = torch.Generator(device=device).manual_seed(seed)

    def w(rows, cols):
        return (torch.randn(rows, cols, generator=g, device=device) * 0.02).to(torch.float16).cpu()

    ones = torch.ones(H, dtype=torch.float16)
    used = torch.randperm(V, generator=torch.Generator().manual_seed(seed))[:Vd].sort().values
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[used] = True
    tensors = {"midlayer.self_attn.q_proj.weight": w(H, 2 * H), "midlayer.self_attn.k_proj.weight": w(kv, 2 * H),
               "midlayer.self_attn.v_proj.weight": w(kv, 2 * H), "midlayer.self_attn.o_proj.weight": w(H, H),
               "midlayer.mlp.gate_proj.weight": w(I, H), "midlayer.mlp.up_proj.weight": w(I, H),
               "midlayer.mlp.down_proj.weight": w(H, I), "midlayer.hidden_norm.weight": ones.clone(),
               "midlayer.input_layernorm.weight": ones.clone(),
               "midlayer.post_attention_layernorm.weight": ones.clone(),
               "fc.weight": w(H, 3 * H), "norm.weight": ones.clone(), "lm_head.weight": w(Vd, H),
               "d2t": used - torch.arange(Vd), "t2d": t2d}  # d2t holds offsets, as SafeAILab writes it
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(c, indent=1))
    return {"parameters": sum(t.numel() for k, t in tensors.items() if k not in ("d2t", "t2d")),
            "bytes": (path / "model.safetensors").stat().st_size}


def step_split(trace) -> dict:
    """Per-step milliseconds of a trace: the median step and the sums' shares (draft = the head's forwards)."""
    import statistics

    parts = ("draft", "verify", "sample")
    steps = [s for s in trace.steps if s.draft_token_ids or s.nodes]
    totals = {p: sum(float(s.timings_ms.get(p, 0.0)) for s in steps) for p in parts}
    whole = sum(totals.values()) or 1.0
    per_step = [sum(float(s.timings_ms.get(p, 0.0)) for p in parts) for s in steps]
    return {"drafting_steps": len(steps), "median_step_ms": round(statistics.median(per_step), 3) if per_step else None,
            "ms_per_step": {p: round(v / max(len(steps), 1), 3) for p, v in totals.items()},
            "share": {p: round(v / whole, 3) for p, v in totals.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default="/tmp/big-eagle3", help="where the target and head are written")
    ap.add_argument("--rates", default="0.8, 0.64, 0.512, 0.4096",
                    help="synthetic_rates: the unconditional acceptance a_i of draft position i (i.i.d. a = 0.8: a^i)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--timeout", type=float, default=400.0)
    ap.add_argument("--dry-run", action="store_true",
                    help="tiny shapes on the CPU: checks this script, measures nothing")
    a = ap.parse_args()
    from gradio_client import Client

    from app_ready import _wait_for_server, stop_app
    from load_app import exported, free_port
    from specviz.ui.run import RunRequest

    work = Path(a.work)
    device = torch.device("cpu" if a.dry_run else "cuda")
    target_cfg, head_cfg = shapes(a.dry_run)
    res: dict = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                 "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu (dry run)",
                 "target_config": target_cfg, "head_config": head_cfg}
    res["target"] = write_target(work / "target", target_cfg, device, seed=0)
    res["head"] = write_head(work / "eagle3", head_cfg, device, seed=1)
    port = free_port()
    cmd = [sys.executable, str(ROOT / "app.py"), "--port", str(port), "--device", device.type,
           "--target", str(work / "target"), "--head", f"eagle3={work / 'eagle3'}"]
    res["command"] = " ".join(cmd[1:])
    url = f"http://127.0.0.1:{port}/"
    t0 = time.time()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=dict(os.environ, PYTHONUNBUFFERED="1"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for_server(url, proc, a.timeout)
        res["server_up_s"] = round(time.time() - t0, 1)
        client = Client(url, verbose=False)
        prompt = "def fibonacci(n):\n    "
        runs = []
        for method, k, verify, rates in (("eagle3", 4, "synthetic", a.rates), ("eagle3", 4, "synthetic", a.rates),
                                         ("eagle3", 4, "greedy", "")):
            req = RunRequest(prompt=prompt, method=method, num_speculative_tokens=k, verify=verify, temperature=0.0,
                             max_new_tokens=a.max_new_tokens, synthetic_rates=rates, compare=True, pairs=3).values()
            t = time.time()
            out = client.predict(*req, api_name="/run")
            print("progress:", str(out[0])[:400], flush=True)
            client.predict(api_name="/measure")
            tr = exported(client)
            m = tr.metrics
            meas = (m.get("baseline_none") or {}).get("measurement") or {}
            runs.append({"method": method, "verify": verify, "rates": rates, "k": k, "progress": str(out[0])[:240],
                         "wall_s": round(time.time() - t, 1), "at_s": round(time.time() - t0, 1),
                         "tokens": m.get("num_generated_tokens"), "capture_ms": m.get("capture_ms"),
                         "tokens_per_target_forward": m.get("tokens_per_target_forward"),
                         "mean_acceptance_length": m.get("mean_acceptance_length"),
                         "decode_tokens_per_second": m.get("decode_tokens_per_second"),
                         "speedup_median": meas.get("median"), "speedup_low": meas.get("low"),
                         "speedup_high": meas.get("high"), "speedup_n": meas.get("n"),
                         "none_tokens_per_second": (m.get("baseline_none") or {}).get("decode_tokens_per_second"),
                         "steps": step_split(tr), "head_source": (tr.config.get("head") or {})})
            print(json.dumps(runs[-1]), flush=True)
        res["runs"] = runs
    finally:
        res["app_log_tail"] = stop_app(proc, timeout=30)[-2000:]
    print(json.dumps(res, indent=1))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
