"""transformers probes for the PyPI package ``kernels`` (hub kernels) with importlib. specviz's Triton kernels live
inside the package (``specviz.kernels``), so nothing in the checkout answers that probe: with the repository root on
sys.path, a fresh interpreter finds no top-level ``kernels``, transformers reports hub kernels unavailable, a model
runs, and importing ``specviz.kernels`` imports no triton."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from kernel_testing import REPO_ROOT

_PROBE = r"""
import importlib.util, json, sys
sys.path.insert(0, sys.argv[1])
import specviz.kernels
triton_after_our_import = "triton" in sys.modules
spec = importlib.util.find_spec("kernels")
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.utils import is_kernels_available
cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
torch.manual_seed(0)
model = LlamaForCausalLM(cfg).eval()
with torch.no_grad():
    logits = model(torch.tensor([[1, 5, 9, 3]])).logits
print(json.dumps({
    "kernels_origin": None if spec is None else str(spec.origin),
    "triton_imported": triton_after_our_import,
    "is_kernels_available": is_kernels_available(),
    "logits_shape": list(logits.shape),
    "logits_finite": bool(torch.isfinite(logits).all()),
}))
"""


def test_transformers_finds_no_kernels_package_of_ours():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["HF_HUB_OFFLINE"] = "1"
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, str(REPO_ROOT)], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    origin = out["kernels_origin"] or ""
    assert not origin.startswith(str(REPO_ROOT)), f"a top-level 'kernels' in the checkout: {origin}"
    if out["kernels_origin"] is None:  # PyPI's package is not installed here either
        assert out["is_kernels_available"] is False
    assert out["triton_imported"] is False, "importing specviz.kernels must not import triton"
    assert out["logits_shape"] == [1, 4, 64] and out["logits_finite"]
