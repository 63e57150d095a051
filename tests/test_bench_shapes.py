"""benchmarks/bench_shapes.py imports and runs: a --dry-run (tiny shapes, CPU) writes its JSON and table."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import bench_shapes  # noqa: E402


def test_dry_run_writes_json_and_table(tmp_path):
    result = bench_shapes.main(["--out", str(tmp_path), "--dry-run", "--commit", "test"])
    saved = json.loads((tmp_path / "bench_shapes.json").read_text())
    assert saved["commit"] == "test" and saved["copy_GBps"] > 0 and len(saved["shapes"]) == 1
    rows = {r["name"]: r for r in saved["shapes"][0]["rows"]}
    assert {"hf generate", "specviz none trace=on", "specviz none trace=off"} <= set(rows)
    synthetic = [r for r in rows.values() if "synthetic" in r["name"] and not r["name"].endswith("compile=on")]
    assert [r["expected_tokens"] for r in synthetic] == [bench_shapes.expected_tokens(a, 4) for a in (0.6, 0.8, 0.9)]
    assert all(r["tok_s"] > 0 and r["speedup_vs_none"] > 0 and r["mean_acceptance_length"] >= 1 for r in synthetic)
    table = (tmp_path / "bench_shapes.md").read_text()
    assert "% of roofline" in table and "synthetic a=0.8" in table
    assert result["shapes"][0]["profile_eager_forward"] is None  # kernel profiles need CUDA
    # --compile both (default): the compiled rows beside the uncompiled ones (dry run: the "eager" backend)
    compiled = [r for r in rows.values() if r["name"].endswith("compile=on")]
    assert len(compiled) == 2 and all(r["tok_s"] > 0 and r["speedup_vs_uncompiled"] > 0 for r in compiled)
    facts = saved["shapes"][0]["compiled"]
    assert facts["backend"] == "eager" and facts["target_compiled"] and facts["drafter_compiled"]
    assert "compiled / uncompiled" in table and "Compiled (eager)" in table


def test_weight_bytes_count_the_lm_head_and_skip_an_untied_input_embedding():
    cfg = dict(bench_shapes.DRY_SHAPES["dry"])
    untied = bench_shapes.build(cfg, torch.device("cpu"), torch.float32, 0)
    tied = bench_shapes.build({**cfg, "tie_word_embeddings": True}, torch.device("cpu"), torch.float32, 0)
    emb = cfg["vocab_size"] * cfg["hidden_size"] * 4
    all_untied = sum(p.numel() * 4 for p in untied.parameters())
    assert bench_shapes.weight_bytes_per_token(untied) == all_untied - emb
    assert bench_shapes.weight_bytes_per_token(tied) == sum(p.numel() * 4 for p in tied.parameters()) == all_untied - emb


def test_expected_tokens_formula():
    assert bench_shapes.expected_tokens(0.8, 4) == pytest.approx(1 + 0.8 + 0.8**2 + 0.8**3 + 0.8**4)
    assert bench_shapes.expected_tokens(1.0, 4) == 5.0


def test_roofline_dry_run_and_kernel_kinds(tmp_path):
    import roofline

    result = roofline.main(["--out", str(tmp_path), "--dry-run", "--compile", "dry", "--commit", "test"])
    (shape,) = result["shapes"]
    assert shape["weight_bytes_per_token"] > 0 and shape["roofline_ms"] > 0
    # transformers' layers, then the default runner (fused on CUDA only), then compiled
    assert [r["compile"] for r in shape["runners"]] == [False, False, True] and shape["runners"][2]["compiled"]
    assert not any(r["fused"] for r in shape["runners"])
    assert shape["gemv"] is None and shape["gemv_fused"] is None and "replay_ms" not in shape["runners"][0]  # graphs and the profiler need CUDA
    assert "roofline" in (tmp_path / "roofline.md").read_text()
    kinds = {  # kernel names as cuBLAS, FlashAttention, SDPA and inductor print them
        "void gemv2T_kernel_val<int, int, __nv_bfloat16, float, 128, 16, 4, 4>": "gemm/gemv",
        "nvjet_hsh_64x8_64x16_4x1_v_bz_splitK_TNT": "gemm/gemv",
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64": "gemm/gemv",
        "void pytorch_flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128>>": "attention",
        "fmha_cutlassF_bf16_aligned_64x128_rf_sm80": "attention",
        "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0": "norm",
        "triton_poi_fused_cat_cos_mul_sin_2": "rotary",
        "_rms_norm_kernel": "norm",  # specviz.kernels.fused_decode
        "_rope_kernel": "rotary",
        "void at::native::index_copy_kernel_impl<...>": "cache write",
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>": "other elementwise",
    }
    assert {name: roofline.kind_of(name) for name in kinds} == kinds


def test_graph_launch_measures_only_on_cuda():
    """benchmarks/graph_launch.py: nothing on the CPU (and says so); on a GPU one row per node count with its host
    launch, GPU and step times."""
    import graph_launch

    rows = graph_launch.main(["--nodes", "8,64", "--repeats", "5"])
    if not torch.cuda.is_available():
        assert rows == []
        return
    assert [r["nodes"] for r in rows] == [8, 64]
    assert all(r["gpu_us"] > 0 and r["step_us"] >= r["launch_us"] > 0 for r in rows)
