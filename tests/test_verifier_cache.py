"""The verifier's graph cache: one captured graph pair serves every temperature / top-p / top-k
(the values are device tensors the graph reads), the cache is bounded (least recently used
dropped), and the tensor-valued logits processing computes what logits_to_probs computes."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from specviz.sampling import logits_to_probs
from specviz.verify import SamplingTensors, StepVerifier, VerifySpec, graph_key, probs_from_tensors

SPEC = VerifySpec(k=4, vocab=1000, verify="standard", temperature=0.8, top_k=None, top_p=None, full_q=True,
                  detailed=True, synthetic_rates=None, backend="triton")
TEMPERATURES = [0.5 + 0.1 * i for i in range(10)]  # the T = 0.5 ... 1.4


class _Fake:
    """Stands in for a captured graph pair (no CUDA): counts captures."""

    def __init__(self, key):
        self.key = key


def _capture_counter():
    captured = []

    def capture(key):
        captured.append(key)
        return _Fake(key)

    return captured, capture


def test_one_graph_serves_every_temperature_top_p_and_top_k():
    ver, (captured, capture) = StepVerifier(torch.device("cpu"), cuda_graphs=True), _capture_counter()
    for T in TEMPERATURES:
        for top_p in (None, 1.0, 0.9, 0.5):
            for top_k in (None, 0, 5, 50):
                ver._lookup(replace(SPEC, temperature=T, top_p=top_p, top_k=top_k), capture)
    # processors on/off: top_p in {off, on} x top_k in {off, on}
    assert len(captured) == len(ver.graphs) == 4
    assert {(c.top_k, c.top_p) for c in captured} == {(None, None), (1, None), (None, 0.5), (1, 0.5)}
    ver._lookup(replace(SPEC, temperature=0.0, verify="greedy"), capture)  # argmax: another computation
    ver._lookup(replace(SPEC, k=2), capture)  # another draft length: another graph
    assert len(captured) == 6


def test_cache_is_bounded_least_recently_used_dropped():
    ver, (captured, capture) = StepVerifier(torch.device("cpu"), cuda_graphs=True, max_graphs=3), _capture_counter()
    specs = [replace(SPEC, k=k) for k in range(5)]
    for s in specs[:3]:
        ver._lookup(s, capture)
    ver._lookup(specs[0], capture)  # k=0 is now the most recent
    ver._lookup(specs[3], capture)  # evicts k=1, the least recently used
    assert [key.k for key in ver.graphs] == [2, 0, 3]
    ver._lookup(specs[1], capture)  # captured again
    assert len(captured) == 5 and len(ver.graphs) == 3


def test_graph_key_keeps_what_fixes_the_computation():
    key = graph_key(replace(SPEC, temperature=1.3, top_p=0.95, top_k=7, synthetic_rates=(0.9, 0.8)))
    assert (key.temperature, key.top_k, key.top_p) == (1.0, 1, 0.5)
    assert key.synthetic_rates == (0.9, 0.8) and key.k == SPEC.k and key.full_q
    assert graph_key(replace(SPEC, temperature=0.0)).temperature == 0.0


@pytest.mark.parametrize("T, top_k, top_p", [(0.0, None, None), (0.7, None, None), (1.3, 20, None),
                                             (0.9, None, 0.8), (1.1, 40, 0.6), (0.5, 5000, 0.99), (1.0, 1, None)])
def test_probs_from_tensors_equals_logits_to_probs(T, top_k, top_p):
    """Same support (which tokens top-k / top-p keep) and the same probabilities up to the last bit
    of the temperature scaling (x * float32(1/T) here, x / T on the CPU's reference)."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 1000, generator=gen) * 4
    logits[0, :3] = logits[0, 0]  # ties at the top
    spec = replace(SPEC, vocab=1000, temperature=T, top_k=top_k, top_p=top_p)
    s = SamplingTensors.empty(torch.device("cpu"))
    s.write(spec)
    got, want = probs_from_tensors(logits, graph_key(spec), s), logits_to_probs(logits, T, top_k, top_p)
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert torch.equal(got > 0, want > 0)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    if T in (0.0, 1.0):  # no rounding difference possible: bit-equal
        assert torch.equal(got, want)


def test_sampling_tensors_skip_unchanged_writes():
    s = SamplingTensors.empty(torch.device("cpu"))
    s.write(replace(SPEC, temperature=0.5, top_p=0.9, top_k=3))
    assert s.values == (2.0, pytest.approx(0.1), 2)
    assert s.inv_temperature.item() == 2.0 and s.top_k_index.item() == 2
    s.inv_temperature.fill_(-1.0)  # an unchanged spec writes nothing
    s.write(replace(SPEC, temperature=0.5, top_p=0.9, top_k=3))
    assert s.inv_temperature.item() == -1.0


needs_cuda = pytest.mark.gpu


@needs_cuda
def test_engine_ten_temperatures_capture_no_new_verifier_graphs(tiny_dirs):
    """The issue's case: ten requests at T = 0.5 ... 1.4 grew the cache from 11 to 28 graphs. Now the
    cache holds one graph pair per draft length k', and each later trace equals the one a
    verifier without graphs (same processing, eagerly) records."""
    from dataclasses import asdict

    from specviz import SpecDecoder

    target, draft = tiny_dirs["llama"]
    dec = SpecDecoder.from_pretrained(target, draft, device="cuda", dtype="float32", runner="static")
    prompt = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a"
    kw = dict(method="draft_model", verify="standard", num_speculative_tokens=3, max_new_tokens=24, seed=3,
              top_p=0.9)
    dec.generate(prompt, temperature=TEMPERATURES[0], **kw)
    verifier = dec.step_verifier
    before = len(verifier.graphs)  # captured by the first request
    strip = lambda t: [{**asdict(s), "timings_ms": None} for s in t.steps]  # noqa: E731
    for T in TEMPERATURES[1:]:
        graphed = dec.generate(prompt, temperature=T, **kw)
        assert dec.step_verifier is verifier
        dec.pool.replace("verifier", [StepVerifier(dec.device, cuda_graphs=False)])
        plain = dec.generate(prompt, temperature=T, **kw)
        dec.pool.replace("verifier", [verifier])
        assert strip(graphed) == strip(plain), T
    # k' in 0..3 (the last steps draft fewer), never one per temperature
    assert before > 0 and len(verifier.graphs) <= 4
    assert len({key.k for key in verifier.graphs}) == len(verifier.graphs)
    assert {(key.temperature, key.top_p) for key in verifier.graphs} == {(1.0, 0.5)}
