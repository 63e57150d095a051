"""The static-cache runner (and, on CUDA, its CUDA graphs) gives the eager runner's greedy tokens."""

from __future__ import annotations

import pytest
import torch

from specviz import SpecDecoder
from specviz.runner import EagerRunner
from specviz.static_runner import StaticRunner

PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a"
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("arch", ("llama", "qwen2"))
def test_static_runner_matches_eager_greedy(tiny_dirs, arch, device):
    target, draft = tiny_dirs[arch]
    eager = SpecDecoder.from_pretrained(target, draft, device=device, dtype="float32")
    static = SpecDecoder.from_pretrained(target, draft, device=device, dtype="float32", runner="static")
    for method, k in (("none", 1), ("ngram", 3), ("suffix", 4), ("draft_model", 2), ("draft_model", 5)):
        kw = dict(method=method, num_speculative_tokens=k, max_new_tokens=40, prompt_lookup_min=1)
        want = eager.generate(PROMPT, **kw).output_token_ids
        for _ in range(2):  # the second request reuses the pooled runner (and its graphs)
            assert static.generate(PROMPT, **kw).output_token_ids == want, (method, k)
    assert isinstance(static.target_runner, StaticRunner)


@pytest.mark.parametrize("attn", ("sdpa", "eager"))
def test_static_rollback_hides_stale_entries(tiny_dirs, attn):
    from specviz.models import load_model

    model = load_model(tiny_dirs["llama"][0], torch.device("cpu"), torch.float32)
    model.config._attn_implementation = attn
    ids = torch.arange(5, 25)
    eager, static = EagerRunner(model), StaticRunner(model, max_cache_len=64)
    for r in (eager, static):
        r.reset()
        r.forward(ids[:10])
        r.forward(ids[10:16])  # a "draft" that gets rejected
        r.truncate(12)
    torch.testing.assert_close(static.forward(ids[12:16]), eager.forward(ids[12:16]), rtol=1e-4, atol=1e-4)
    for r in (eager, static):  # a second rollback, now over entries the explicit mask must hide
        r.truncate(12)
    torch.testing.assert_close(static.forward(ids[16:20]), eager.forward(ids[16:20]), rtol=1e-4, atol=1e-4)
    assert static.seq_len == eager.seq_len == 16
    with pytest.raises(ValueError, match="static KV cache holds 64"):
        static.forward(torch.arange(60))


TRITON_ENGINE_SCRIPT = r"""
import sys
sys.path[:0] = [{root!r}, {tests!r}]
from specviz import SpecDecoder
dec = SpecDecoder.from_pretrained({target!r}, {draft!r}, device="cpu", dtype="float32")
prompt = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a"
for kw in (dict(method="ngram", verify="greedy", prompt_lookup_min=1),
           dict(method="draft_model", verify="standard", temperature=0.8),
           dict(method="draft_model", verify="block", temperature=0.8),
           dict(method="ngram", verify="synthetic", synthetic_rates=[0.9, 0.7, 0.5], temperature=1.0, prompt_lookup_min=1)):
    a = dec.generate(prompt, num_speculative_tokens=3, max_new_tokens=12, seed=5, sampler_backend="reference", **kw)
    b = dec.generate(prompt, num_speculative_tokens=3, max_new_tokens=12, seed=5, sampler_backend="triton", **kw)
    assert a.output_token_ids == b.output_token_ids, kw
    assert {{s.sampler_backend for s in b.steps}} == {{"triton"}}, kw
    assert [s.num_accepted for s in a.steps] == [s.num_accepted for s in b.steps], kw
print("ENGINE-TRITON-OK")
"""


def test_engine_with_triton_backend_equals_reference(tiny_dirs):
    """The same seeded run gives the same tokens with the Triton sampler (interpreter, CPU) and the
    reference; the trace records which backend ran. Runs in a child process: TRITON_INTERPRET must be
    set before triton is first imported."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    target, draft = tiny_dirs["llama"]
    script = TRITON_ENGINE_SCRIPT.format(root=str(root), tests=str(root / "tests"), target=str(target), draft=str(draft))
    env = dict(os.environ, TRITON_INTERPRET="1", HF_HUB_OFFLINE="1")
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert "ENGINE-TRITON-OK" in res.stdout, res.stdout[-2000:] + res.stderr[-4000:]
