"""Every Triton kernel compiles for sm_90 (Hopper) on this CPU machine.

The interpreter accepts code the real compiler rejects, so the kernels are also compiled with
``triton.compile(ASTSource(...), target=GPUTarget("cuda", 90, 32))`` by ``kernels.compile_check``,
run in a child process with TRITON_INTERPRET=0 (triton's mode is fixed per process; see
tests/kernel_testing.py). The sampler kernels must also compile to IEEE divisions and no fused
multiply-add, which their exactness against PyTorch relies on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kernel_testing import REPO_ROOT

EXPECTED = {"_sampler_pass_kernel": 12, "_sampler_finalize_kernel": 12, "_ngram_first_end_kernel": 1, "_ngram_finalize_kernel": 1}


@pytest.fixture(scope="module")
def records() -> list[dict]:
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-m", "specviz.kernels.compile_check"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    recs = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert recs, f"compile_check printed nothing (rc={proc.returncode}):\n{proc.stderr[-4000:]}"
    return recs


def test_every_configuration_compiles_for_sm90(records):
    failed = [f"{r['kernel']} {r['config']}: {r.get('error')}" for r in records if not r["ok"]]
    assert not failed, "\n".join(failed)
    counts = {name: sum(r["kernel"] == name for r in records) for name in EXPECTED}
    assert counts == EXPECTED


def test_sampler_kernels_use_ieee_division_and_no_fma(records):
    sampler = [r for r in records if r["kernel"].startswith("_sampler") and r["ok"]]
    assert sampler
    for r in sampler:
        assert r["ptx_fma"] == 0, f"{r['kernel']} {r['config']}: fused multiply-add in PTX"
        assert r["ptx_div_approx"] == 0, f"{r['kernel']} {r['config']}: approximate division in PTX"
    racing = [r for r in sampler if not r["config"].startswith("greedy")]
    assert all(r["ptx_div_rn"] > 0 for r in racing), "the exponential race must divide with div.rn"
