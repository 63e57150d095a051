"""Our top-level ``kernels`` package must not confuse transformers.

transformers probes for the PyPI package ``kernels`` (hub kernels) with importlib; with the repo
root on sys.path it finds ours, imports it to read a version and, finding none, must report it
unavailable. Checked in a fresh interpreter, so no earlier import in this pytest process hides
the probe.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from kernels.testing import REPO_ROOT

_PROBE = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import kernels
triton_after_our_import = "triton" in sys.modules
import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.utils import is_kernels_available
cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
torch.manual_seed(0)
model = LlamaForCausalLM(cfg).eval()
with torch.no_grad():
    logits = model(torch.tensor([[1, 5, 9, 3]])).logits
print(json.dumps({
    "kernels_file": kernels.__file__,
    "has_version": hasattr(kernels, "__version__"),
    "triton_imported": triton_after_our_import,
    "is_kernels_available": is_kernels_available(),
    "logits_shape": list(logits.shape),
    "logits_finite": bool(torch.isfinite(logits).all()),
}))
"""


def test_transformers_ignores_our_kernels_package():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["HF_HUB_OFFLINE"] = "1"
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, str(REPO_ROOT)], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert os.path.realpath(out["kernels_file"]) == os.path.realpath(REPO_ROOT / "kernels" / "__init__.py")
    assert out["has_version"] is False
    assert out["is_kernels_available"] is False
    assert out["triton_imported"] is False, "importing our kernels package must not import triton"
    assert out["logits_shape"] == [1, 4, 64] and out["logits_finite"]
