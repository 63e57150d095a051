"""Engine correctness on tiny random Llama / Qwen2 models in float32 (CPU)."""

from __future__ import annotations

import pytest
import torch

from specviz import SpecDecoder, Trace

ARCHS = ("llama", "qwen2")
SPEC_METHODS = ("none", "ngram", "ngram_gpu", "suffix", "draft_model")
PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a"
MAX_NEW = 40


def hf_greedy(dec: SpecDecoder, prompt_ids: list[int], max_new: int) -> list[int]:
    ids = torch.tensor([prompt_ids])
    out = dec.target_model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new,
                                    eos_token_id=sorted(dec.eos_token_ids), pad_token_id=1)
    return out[0, len(prompt_ids):].tolist()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("method", SPEC_METHODS)
@pytest.mark.parametrize("k", (1, 2, 4, 7))
def test_greedy_equals_hf_generate(decoders, arch, method, k):
    dec = decoders[arch]
    prompt_ids = dec.encode(PROMPT)
    expected = hf_greedy(dec, prompt_ids, MAX_NEW)
    lookup = {"prompt_lookup_min": 1, "prompt_lookup_max": 3} if method in ("ngram", "ngram_gpu") else {}
    trace = dec.generate(PROMPT, method=method, num_speculative_tokens=k, max_new_tokens=MAX_NEW, **lookup)
    assert trace.output_token_ids == expected
    if method != "none":  # the speculative path really ran
        assert trace.metrics["num_drafts"] > 0
    assert trace.metrics["num_generated_tokens"] == len(expected)
    assert sum(len(s.committed_token_ids) for s in trace.steps) == len(expected)
    # every step does one target forward, plus the prefill
    assert trace.target_forward_passes == len(trace.steps) + 1


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("k", (1, 2, 4, 7))
def test_identical_draft_accepts_everything(self_decoders, arch, k):
    dec = self_decoders[arch]
    trace = dec.generate(PROMPT, method="draft_model", num_speculative_tokens=k, max_new_tokens=MAX_NEW)
    m = trace.metrics
    assert m["num_draft_tokens"] > 0
    assert m["draft_acceptance_rate"] == 1.0
    assert trace.output_token_ids == hf_greedy(dec, dec.encode(PROMPT), MAX_NEW)
    # full accepts emit bonus tokens; tokens per forward is k+1 except near the end
    assert all(s.emitted.kind == "bonus" for s in trace.steps if s.draft_token_ids)


@pytest.mark.parametrize("arch", ARCHS)
def test_eos_inside_accepted_draft_stops(self_decoders, arch):
    dec = self_decoders[arch]
    plain = dec.generate(PROMPT, method="none", max_new_tokens=20).output_token_ids
    # pick as "EOS" a token first produced at index >= 2 and not earlier
    idx = next(i for i in range(2, len(plain)) if plain[i] not in plain[:i])
    saved = dec.eos_token_ids
    dec.eos_token_ids = {plain[idx]}
    try:
        trace = dec.generate(PROMPT, method="draft_model", num_speculative_tokens=7, max_new_tokens=20)
    finally:
        dec.eos_token_ids = saved
    assert trace.output_token_ids == plain[: idx + 1]
    assert trace.stop_reason == "eos"
    last = trace.steps[-1]
    # the last step committed a prefix of what the sampler output (accepted drafts + its own
    # token), cut just after the EOS; the metrics count only that prefix
    start = len(trace.output_token_ids) - len(last.committed_token_ids)
    sampler_out = last.draft_token_ids[: last.num_accepted] + [last.emitted.token_id]
    assert last.num_accepted > 0 and last.committed_token_ids == sampler_out[: idx + 1 - start]
    # vLLM's count over committed tokens (specviz.trace.metrics.counted): each drafting step's tokens - 1, so the cut
    # step's EOS is its own token, not an accepted draft
    assert trace.metrics["num_accepted_tokens"] == sum(len(s.committed_token_ids) - 1 for s in trace.steps
                                                       if s.draft_token_ids)
    assert trace.metrics["num_accepted_tokens"] == sum(s.num_accepted_committed for s in trace.steps) - 1


@pytest.mark.parametrize("max_new", (1, 2, 3, 5, 9, 13))
def test_max_new_tokens_exact(self_decoders, max_new):
    dec = self_decoders["llama"]
    saved = dec.eos_token_ids
    dec.eos_token_ids = set()  # no EOS: only max_new_tokens stops
    try:
        trace = dec.generate(PROMPT, method="draft_model", num_speculative_tokens=4, max_new_tokens=max_new)
    finally:
        dec.eos_token_ids = saved
    assert len(trace.output_token_ids) == max_new
    assert trace.stop_reason == "max_new_tokens"
    generated = 0
    for s in trace.steps:  # never drafts more than the tokens still needed minus one
        assert len(s.draft_token_ids) <= max(0, max_new - generated - 1)
        generated += len(s.committed_token_ids)


@pytest.mark.parametrize("method", ("ngram", "draft_model"))
@pytest.mark.parametrize("verify", ("standard", "block"))
def test_seeded_sampling_reproducible(decoders, method, verify):
    dec = decoders["qwen2"]
    kw = dict(method=method, verify=verify, temperature=0.8, top_k=50, top_p=0.95, num_speculative_tokens=3,
              max_new_tokens=24)
    a = dec.generate(PROMPT, seed=7, **kw)
    b = dec.generate(PROMPT, seed=7, **kw)
    c = dec.generate(PROMPT, seed=8, **kw)
    assert a.output_token_ids == b.output_token_ids
    assert [p.u for s in a.steps for p in s.positions] == [p.u for s in b.steps for p in s.positions]
    assert a.output_token_ids != c.output_token_ids


def _fresh_keys(runner_factory_model, ids: list[int]) -> list[torch.Tensor]:
    from specviz.runner import EagerRunner

    fresh = EagerRunner(runner_factory_model)
    fresh.reset()
    fresh.forward(torch.tensor(ids))
    return fresh.cached_keys()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("temperature", (0.0, 0.9))
def test_caches_match_recompute_after_every_step(decoders, arch, temperature):
    dec = decoders[arch]
    prompt_ids = dec.encode(PROMPT)
    steps = 0
    kw = dict(method="draft_model", num_speculative_tokens=3, max_new_tokens=30, temperature=temperature, seed=3)
    for trace in dec.iter_generate(PROMPT, **kw):
        ids = prompt_ids + [t for s in trace.steps for t in s.committed_token_ids]
        assert dec.target_runner.seq_len == len(ids) - 1
        for got, want in zip(dec.target_runner.cached_keys(), _fresh_keys(dec.target_model, ids[:-1])):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        proposer = dec.current_proposer
        cached = proposer.cached_ids
        assert proposer.runner.seq_len == len(cached)
        for got, want in zip(proposer.runner.cached_keys(), _fresh_keys(dec.draft_model, cached)):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        steps += 1
    assert steps == len(trace.steps)  # one yield per step (the last one is the finished trace)


def test_trace_round_trips_json(decoders):
    dec = decoders["llama"]
    for method, kw in (("ngram", {}), ("draft_model", {"temperature": 0.7, "verify": "block"})):
        trace = dec.generate(PROMPT, method=method, num_speculative_tokens=3, max_new_tokens=16, **kw)
        again = Trace.from_json(trace.to_json())
        assert again.to_dict() == trace.to_dict()
        assert trace.text == dec.tokenizer.decode(trace.output_token_ids, skip_special_tokens=True)
        for s in trace.steps:
            assert len(s.positions) == len(s.draft_token_ids)
            assert s.emitted.kind in ("recovered", "bonus", "target")
            assert s.committed_token_ids[: s.num_accepted] == s.draft_token_ids[: s.num_accepted][: len(s.committed_token_ids)]


def test_event_bus_subscriber_sees_every_step(decoders):
    from specviz.events import EventBus, StepVerified

    bus, seen = EventBus(), []
    bus.subscribe(StepVerified, lambda e: seen.append(e.step))
    trace = decoders["llama"].generate(PROMPT, method="ngram", max_new_tokens=12, bus=bus)
    assert seen == list(range(len(trace.steps)))


def test_two_threads_share_one_decoder(decoders):
    """Each request owns its caches: concurrent requests give the sequential results."""
    from concurrent.futures import ThreadPoolExecutor

    dec = decoders["llama"]
    jobs = [dict(method="draft_model", num_speculative_tokens=3, max_new_tokens=20),
            dict(method="ngram", num_speculative_tokens=2, max_new_tokens=20, prompt_lookup_min=1)]
    sequential = [dec.generate(PROMPT, **kw).output_token_ids for kw in jobs]
    with ThreadPoolExecutor(2) as pool:
        parallel = list(pool.map(lambda kw: dec.generate(PROMPT, **kw).output_token_ids, jobs))
    assert parallel == sequential


def test_partial_traces_are_readable(decoders):
    """Every streamed (partial) trace already has the prompt text, the output text so far and a
    text for every token id it mentions."""
    dec = decoders["llama"]
    for trace in dec.iter_generate(PROMPT, method="draft_model", num_speculative_tokens=3, max_new_tokens=12):
        assert trace.prompt_text == dec.tokenizer.decode(trace.prompt_token_ids, skip_special_tokens=True)
        generated = [t for s in trace.steps for t in s.committed_token_ids]
        assert trace.text == dec.tokenizer.decode(generated, skip_special_tokens=True)
        mentioned = set(generated) | {t for s in trace.steps for t in s.draft_token_ids}
        mentioned |= {int(t) for s in trace.steps for p in s.positions for t, _ in p.p_top + p.q_top + p.residual_top}
        assert mentioned <= {int(k) for k in trace.token_texts}


def test_observe_time_is_counted_as_drafting(decoders, monkeypatch):
    """The proposer's observe (after verification) is drafting work: a step's draft_ms includes it, so a
    speedup over method none (which observes nothing) is not measured on a time that leaves it out."""
    import time as _time

    from specviz.methods.ngram.proposer import NgramProposer

    dec = decoders["llama"]
    base = dec.generate(PROMPT, method="ngram", num_speculative_tokens=3, max_new_tokens=8)

    def slow_observe(self, outcome):
        _time.sleep(0.03)

    monkeypatch.setattr(NgramProposer, "observe", slow_observe)
    slow = dec.generate(PROMPT, method="ngram", num_speculative_tokens=3, max_new_tokens=8)
    assert slow.output_token_ids == base.output_token_ids
    for step in slow.steps[1:]:  # the prefill's observe runs before the first step: not a step's time
        assert step.timings_ms["draft"] >= 30.0, step.timings_ms
    assert slow.metrics["time_ms"]["draft"] >= 30.0 * (len(slow.steps) - 1)
