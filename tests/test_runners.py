"""The static-cache runner (and, on CUDA, its CUDA graphs) gives the eager runner's greedy tokens."""

from __future__ import annotations

from dataclasses import asdict

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
    for method, k in (("none", 1), ("ngram", 3), ("ngram_gpu", 3), ("suffix", 4), ("draft_model", 2), ("draft_model", 5)):
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


needs_cuda = pytest.mark.gpu


@needs_cuda
@pytest.mark.parametrize("verify", ("greedy", "standard", "block", "synthetic"))
def test_step_verifier_graph_equals_eager(verify):
    """The captured verification step (probs, Triton sampler, record, next input) returns exactly the
    eager unit's record, also on later replays with new inputs and noise."""
    from specviz.verify import StepVerifier, VerifySpec

    dev, V = torch.device("cuda"), 1000
    graphed, eager = StepVerifier(dev), StepVerifier(dev, cuda_graphs=False)
    temperature = 0.0 if verify == "greedy" else 0.9
    rates = (0.9, 0.7, 0.5, 0.3) if verify == "synthetic" else None
    gen_a, gen_b = torch.Generator(dev).manual_seed(3), torch.Generator(dev).manual_seed(3)
    data = torch.Generator(dev).manual_seed(11)
    for k in (0, 1, 4):
        for full_q in ((False,) if verify == "greedy" else (False, True)):
            for detailed in (True, False):
                spec = VerifySpec(k=k, vocab=V, verify=verify, temperature=temperature, top_k=None, top_p=None,
                                  full_q=full_q, detailed=detailed, synthetic_rates=rates, backend="triton")
                for _ in range(3):
                    logits = torch.randn(k + 1, V, device=dev, generator=data) * 3
                    x = torch.randint(0, V, (k,), device=dev, generator=data)
                    if k:  # make some drafts agree with the target's argmax
                        x[: k // 2 + 1] = logits[: k // 2 + 1].argmax(-1)
                    q = torch.softmax(torch.randn(k, V, device=dev, generator=data) * 3, -1) if full_q else None
                    got = graphed.run(spec, logits, q, x, gen_a)
                    want = eager.run(spec, logits, q, x, gen_b)
                    assert got[0] == want[0], (spec, "record")
                    assert got[1].tolist() == want[1].tolist(), (spec, "next input")
    assert len(graphed.graphs) > 0 and not eager.graphs


@needs_cuda
def test_engine_sampling_with_verifier_graphs_equals_eager_verifier(tiny_dirs):
    """Seeded sampling runs give identical traces with and without the captured verification step."""
    from specviz.verify import StepVerifier

    target, draft = tiny_dirs["llama"]
    dec = SpecDecoder.from_pretrained(target, draft, device="cuda", dtype="float32", runner="static")
    for kw in (dict(method="draft_model", verify="standard", temperature=0.8),
               dict(method="draft_model", verify="block", temperature=0.8, top_k=50),
               dict(method="ngram", verify="synthetic", synthetic_rates=[0.9, 0.7, 0.5], temperature=1.0,
                    prompt_lookup_min=1),
               dict(method="ngram", verify="greedy", prompt_lookup_min=1),
               # async scheduling: each step's detail record is read two steps later, from its own pinned buffer
               dict(method="none", temperature=0.8), dict(method="none")):
        run = lambda: dec.generate(PROMPT, num_speculative_tokens=3, max_new_tokens=30, seed=7, **kw)  # noqa: E731
        graphed = run()
        assert dec.step_verifier.cuda_graphs and dec.step_verifier.graphs
        dec.pool.replace("verifier", [StepVerifier(dec.device, cuda_graphs=False)])
        plain = run()
        assert not dec.step_verifier.cuda_graphs
        dec.pool.replace("verifier", [])
        assert graphed.output_token_ids == plain.output_token_ids, kw
        strip = lambda t: [{**asdict(s), "timings_ms": None} for s in t.steps]  # noqa: E731
        assert strip(graphed) == strip(plain), kw


@pytest.mark.parametrize("device", DEVICES)
def test_static_runner_first_request_equals_later_ones(tiny_dirs, device):
    """A fresh static runner (first request: the cache is allocated during its prefill) computes
    exactly what a pooled, reused one computes: seeded sampling traces are identical."""
    target, draft = tiny_dirs["llama"]
    dec = SpecDecoder.from_pretrained(target, draft, device=device, dtype="float32", runner="static")
    kw = dict(method="draft_model", verify="standard", temperature=0.8, num_speculative_tokens=3, max_new_tokens=20,
              seed=7)
    strip = lambda t: [{**asdict(s), "timings_ms": None} for s in t.steps]  # noqa: E731
    first, second = strip(dec.generate(PROMPT, **kw)), strip(dec.generate(PROMPT, **kw))
    assert first == second
