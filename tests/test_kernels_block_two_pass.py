"""Block verification's two-pass Triton kernel (sums, then the race on row tau only) returns the
one-pass kernel's result bit for bit, and the reference's (tests/test_kernels_sampler.py's rules),
on odd shapes with -1 padding, invalid ids, non-finite q rows, ties and small vocabulary blocks.

"cpu" runs under the Triton interpreter in a child pytest (tests/kernel_testing.py); "cuda" in-process."""

from __future__ import annotations

import pytest
import torch
from test_kernels_sampler import EXACT, _assert_same, _make, _to

from kernel_testing import DEVICES, interpreter_subprocess
from specviz.sampling import rejection_sample



def test_interpreter_subprocess():
    """Run this file's "cpu" cases under the interpreter in a child process."""
    interpreter_subprocess(__file__)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("scenario, shape, block_v", [
    ("plain", (3, 4, 300), None), ("invalid", (5, 4, 999), 128), ("nonfinite", (4, 4, 517), 64),
    ("ties", (3, 3, 300), 64), ("plain", (6, 8, 401), 128),
], ids=str)
def test_two_pass_equals_one_pass_and_reference(device, dtype, scenario, shape, block_v):
    """The interpreter (slow: about 10 s a case on a busy 2-core machine) runs fp32 and one seed."""
    from specviz.kernels.rejection_sampler import rejection_sample_triton

    if device == "cpu" and dtype != torch.float32:
        pytest.skip("the interpreter runs fp32 only (the dtype changes only the loads)")
    B, K, V = shape
    for seed in range(1 if device == "cpu" else 3):
        p, q, ids, noise = _make(B, K, V, True, dtype, "block", scenario, seed)
        p, q, ids = _to(device, p, q, ids)
        noise = type(noise)(u=noise.u.to(device), exp=noise.exp.to(device))
        one = rejection_sample_triton(p, q, ids, method="block", noise=noise, block_v=block_v, block_two_pass=False)
        two = rejection_sample_triton(p, q, ids, method="block", noise=noise, block_v=block_v, block_two_pass=True)
        for name in EXACT + ("residual_mass",):
            assert torch.equal(getattr(one, name), getattr(two, name)), (name, seed)
        for name in ("P", "rho", "h", "tau"):
            assert torch.equal(getattr(one.block, name), getattr(two.block, name)), (name, seed)
        _assert_same(rejection_sample(p, q, ids, method="block", noise=noise), two)
