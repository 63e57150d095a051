"""Async scheduling of method none: step i + 1's target forward, fed step i's token on the device, is queued before
step i's wait. It must decode exactly what the synchronous loop decodes (greedy and seeded sampling), stop where it
stops (EOS, max_new_tokens, a closed stream) and leave the runner right for the next request, whose forward the
discarded look-ahead must not disturb."""

from __future__ import annotations

import pytest
import torch

from specviz import SpecDecoder
from specviz.config import GenerationConfig

PROMPT = "def fib(n):\n    if n < 2:\n        return n\n"
RUNNERS = ("static", "eager")


@pytest.fixture(scope="module")
def decs(tiny_dirs):
    target, _ = tiny_dirs["llama"]
    return {r: SpecDecoder.from_pretrained(target, device="cpu", dtype="float32", runner=r) for r in RUNNERS}


def _run(dec, on: bool, **kw):
    return dec.generate(PROMPT, method="none", async_scheduling=on, **kw)


@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.parametrize("sampling", [dict(temperature=0.0), dict(temperature=1.0, seed=7, top_k=40)])
def test_same_tokens_steps_and_forwards(decs, runner, sampling):
    sync, ahead = _run(decs[runner], False, max_new_tokens=24, **sampling), _run(decs[runner], True, max_new_tokens=24,
                                                                                 **sampling)
    assert ahead.config["async_scheduling"] is True and sync.config["async_scheduling"] is False
    assert ahead.output_token_ids == sync.output_token_ids and len(ahead.output_token_ids) == 24
    assert [s.committed_token_ids for s in ahead.steps] == [s.committed_token_ids for s in sync.steps]
    assert ahead.target_forward_passes == sync.target_forward_passes == 25  # prefill + 24; no look-ahead past the end
    assert ahead.stop_reason == sync.stop_reason == "max_new_tokens"
    if sampling["temperature"] > 0:  # the negative control: another seed decodes something else
        other = _run(decs[runner], True, max_new_tokens=24, **{**sampling, "seed": 8})
        assert other.output_token_ids != sync.output_token_ids


@pytest.mark.parametrize("runner", RUNNERS)
def test_eos_stops_at_the_same_token_and_the_next_request_is_clean(decs, runner):
    dec = decs[runner]
    plain = _run(dec, False, max_new_tokens=20).output_token_ids
    i = next(j for j in range(3, len(plain)) if plain[j] not in plain[:j])  # a token whose first use is position i
    saved = dec.eos_token_ids
    dec.eos_token_ids = {plain[i]}
    try:
        stopped = _run(dec, True, max_new_tokens=20)  # its step queued one more forward, never used
    finally:
        dec.eos_token_ids = saved
    assert stopped.stop_reason == "eos" and stopped.output_token_ids == plain[: i + 1]
    assert stopped.target_forward_passes == i + 2  # the unused look-ahead is not counted
    runner = dec.pool.free(id(dec.target_model))[0]  # the look-ahead ran: one position past what was committed
    assert runner.seq_len == len(dec.encode(PROMPT)) + i + 1
    # the pooled runner comes back one position ahead of what was committed: the next request starts clean
    assert _run(dec, True, max_new_tokens=20).output_token_ids == plain


def test_no_look_ahead_past_the_static_cache(tiny_dirs):
    """EOS in the cache's last slot: the synchronous loop fits; the look-ahead must not ask for one slot more."""
    target, _ = tiny_dirs["llama"]
    prompt = list(range(3, 23))
    plain = SpecDecoder.from_pretrained(target, device="cpu", dtype="float32", runner="static").generate(
        prompt, method="none", max_new_tokens=30).output_token_ids
    i = next(j for j in range(8, len(plain)) if plain[j] not in plain[:j])
    dec = SpecDecoder.from_pretrained(target, device="cpu", dtype="float32", runner="static",
                                      max_cache_len=len(prompt) + i)
    dec.eos_token_ids = {plain[i]}
    for on in (False, True):
        out = dec.generate(prompt, method="none", max_new_tokens=30, async_scheduling=on)
        assert out.stop_reason == "eos" and out.output_token_ids == plain[: i + 1]


def test_padded_prefill_through_replayed_graphs(tiny_dirs, monkeypatch):
    """The CUDA-graph path of a padded prefill on the CPU: a fake graph that reruns the captured forward into its
    static buffers on every replay. The first prefill (eager once, then replayed) and a later one give the prompt
    rows' logits and features of the eager runner, and the position ends at the prompt."""
    from specviz.runner import EagerRunner
    from specviz.static_runner import StaticRunner

    class Replayed:
        def __init__(self, run):
            self.replay = run

    def capture_once(self, n, ids, taps):
        static_ids = ids.clone()
        logits, feats = self._eager(static_ids, taps)
        logits, feats = logits.clone(), {k: v.clone() for k, v in feats.items()}
        self._set_position(self.seq_len)

        def run():
            out_logits, out_feats = self._eager(static_ids, taps)
            logits.copy_(out_logits)
            for k in feats:
                feats[k].copy_(out_feats[k])

        self._graphs[(n, taps)] = (Replayed(run), static_ids, logits, feats)
        self._note_capture((n, taps), False)
        return self._graphs[(n, taps)]

    monkeypatch.setattr(StaticRunner, "_capture_once", capture_once)
    target, _ = tiny_dirs["llama"]
    model = SpecDecoder.from_pretrained(target, device="cpu", dtype="float32", runner="eager").target_model
    runner = StaticRunner(model, max_cache_len=64, cuda_graphs=True)
    assert runner.prefill_buckets == (8, 16, 33)
    for n in (5, 9, 16, 17, 33):
        ids = torch.arange(3, 3 + n)
        ref = EagerRunner(model).forward_features(ids, ("layer_input:1",))
        before = runner.replays[1]
        runner.reset()
        out = runner.forward_features(ids, ("layer_input:1",))
        assert runner.replays[1] == before + 1 and runner.seq_len == n and int(runner._position()) == n
        assert out.logits.shape == (n, ref.logits.shape[-1])
        torch.testing.assert_close(out.logits, ref.logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out.features["layer_input:1"], ref.features["layer_input:1"], rtol=1e-5, atol=1e-5)
        eager = EagerRunner(model)
        eager.forward(ids)
        torch.testing.assert_close(runner.forward(torch.tensor([7])), eager.forward(torch.tensor([7])), rtol=1e-5,
                                   atol=1e-5)


def test_a_closed_stream_then_a_new_request(decs):
    dec = decs["static"]
    plain = _run(dec, False, max_new_tokens=16).output_token_ids
    it = dec.iter_generate(PROMPT, method="none", async_scheduling=True, max_new_tokens=16)
    for n, partial in enumerate(it):
        if n == 4:
            assert partial.output_token_ids == plain[: len(partial.output_token_ids)]
            break
    it.close()
    assert _run(dec, True, max_new_tokens=16).output_token_ids == plain


def test_one_and_two_tokens(decs):
    dec = decs["static"]
    for n in (1, 2):
        sync, ahead = _run(dec, False, max_new_tokens=n), _run(dec, True, max_new_tokens=n)
        assert ahead.output_token_ids == sync.output_token_ids and len(ahead.output_token_ids) == n
        assert ahead.target_forward_passes == n + 1


def test_defaults_and_refusals():
    cfg = GenerationConfig.from_settings
    assert cfg(method="none").async_scheduling is False  # the CPU: nothing to overlap
    assert cfg(cuda=True, method="none").async_scheduling is True
    assert cfg(cuda=True, method="ngram").async_scheduling is False
    assert cfg(cuda=True, method="none", async_scheduling=False).async_scheduling is False
    with pytest.raises(ValueError, match="method 'none' only"):
        cfg(method="draft_model", async_scheduling=True)
    with pytest.raises(ValueError, match="True, False or None"):
        cfg(method="none", async_scheduling="yes")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cuda_graphs_same_tokens(tiny_dirs, dtype):
    """Through the static runner's CUDA graphs the look-ahead replays the same 1-token graph: equal bit for bit,
    in bf16 too (the same kernels see the same inputs)."""
    target, _ = tiny_dirs["llama"]
    dec = SpecDecoder.from_pretrained(target, device="cuda", dtype=dtype, runner="static")
    for sampling in (dict(temperature=0.0), dict(temperature=1.0, seed=3)):
        sync = dec.generate(PROMPT, method="none", async_scheduling=False, max_new_tokens=48, **sampling)
        ahead = dec.generate(PROMPT, method="none", max_new_tokens=48, **sampling)
        assert ahead.config["async_scheduling"] is True
        assert ahead.output_token_ids == sync.output_token_ids


@pytest.mark.parametrize("prompt", [PROMPT, "x = 1"])
def test_padded_prefill_matches_the_unpadded_one(tiny_dirs, prompt):
    """A prefill padded to a bucket (what the static runner replays from a CUDA graph on CUDA; here eagerly, on the
    CPU) gives the prompt's rows the logits and features of the unpadded prefill, leaves the position at the prompt's
    length, and decodes the same tokens; the negative control pads without moving the position back."""
    target, _ = tiny_dirs["llama"]
    dec = SpecDecoder.from_pretrained(target, device="cpu", dtype="float32", runner="static")
    ids = dec.encode(prompt)
    n = len(ids) - 1
    plain = dec.generate(prompt, method="none", max_new_tokens=16)
    runner = dec.pool.free(id(dec.target_model))[0]
    runner.reset()
    ref = runner.forward_features(torch.tensor(ids[:-1]), ("layer_input:1",))
    runner.prefill_buckets = (8, 16, 33)
    runner.reset()
    out = runner.forward_features(torch.tensor(ids[:-1]), ("layer_input:1",))
    assert out.logits.shape == ref.logits.shape == (n, dec.vocab_size) and runner.seq_len == n
    torch.testing.assert_close(out.logits, ref.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.features["layer_input:1"], ref.features["layer_input:1"], rtol=1e-5, atol=1e-5)
    assert int(runner._position()) == n
    assert dec.generate(prompt, method="none", max_new_tokens=16).output_token_ids == plain.output_token_ids
    runner.reset()
    runner.forward_features(torch.tensor(ids[:-1]))
    runner._set_position(max(b for b in runner.prefill_buckets if b >= n) if n < 33 else n)  # the padding kept
    step = runner.forward_features(torch.tensor(ids[-1:]))
    runner.reset()
    runner.forward_features(torch.tensor(ids[:-1]))
    good = runner.forward_features(torch.tensor(ids[-1:]))
    assert not torch.allclose(step.logits, good.logits)


def test_padding_that_would_not_fit_the_cache_is_not_used(tiny_dirs):
    from specviz.static_runner import StaticRunner

    target, _ = tiny_dirs["llama"]
    model = SpecDecoder.from_pretrained(target, device="cpu", dtype="float32", runner="eager").target_model
    runner = StaticRunner(model, max_cache_len=20)
    runner.prefill_buckets = (8, 16, 33)
    assert runner._prefill_width(10) == 16 and runner._prefill_width(17) is None and runner._prefill_width(34) is None
    out = runner.forward_features(torch.arange(3, 20))  # 17 tokens: eager, unpadded (33 rows would not fit)
    assert out.logits.shape[0] == 17 and runner.seq_len == 17 and int(runner._position()) == 17


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_graph_prefill_same_tokens(tiny_dirs, dtype):
    """On CUDA a prefill of up to 33 tokens is padded to a bucket and replayed from a graph, the runner's first one
    too (after an eager forward that allocates the cache): the first request, a later one and a runner with eager
    prefills decode the same tokens; the first and later ones give the same target probabilities bit for bit."""
    target, _ = tiny_dirs["llama"]
    dec = SpecDecoder.from_pretrained(target, device="cuda", dtype=dtype, runner="static")
    assert len(dec.encode(PROMPT)) - 1 <= 33  # a prompt short enough for a graph
    first = dec.generate(PROMPT, method="none", max_new_tokens=32)
    runner = dec.pool.free(id(dec.target_model))[0]
    before = runner.replays[1]
    again = dec.generate(PROMPT, method="none", max_new_tokens=32)

    def looked_past_eos(t):  # after an EOS before the last token the look-ahead ran and was discarded (not counted)
        return t.stop_reason == "eos" and len(t.output_token_ids) < 32

    assert runner.replays[1] - before == again.target_forward_passes + looked_past_eos(again)  # prefill + steps
    runner.prefill_buckets = None
    before = runner.replays[1]
    eager = dec.generate(PROMPT, method="none", max_new_tokens=32)
    assert runner.replays[1] - before == eager.target_forward_passes - 1 + looked_past_eos(eager)
    assert first.output_token_ids == again.output_token_ids
    if dtype == "float32":
        assert eager.output_token_ids == first.output_token_ids
    ps = [[s.emitted.top for s in t.steps] for t in (first, again)]
    assert ps[0] == ps[1] and ps[0][0]


def test_a_bucket_whose_capture_failed_is_not_padded_again(tiny_dirs, monkeypatch):
    """A prefill bucket whose CUDA-graph capture failed runs eagerly: that prefill padded, later ones unpadded (an
    eager forward gains nothing from padding), with the eager runner's logits either way."""
    from specviz.runner import EagerRunner
    from specviz.static_runner import StaticRunner

    def capture_once(self, n, ids, taps):
        raise RuntimeError("no capture here")

    monkeypatch.setattr(StaticRunner, "_capture_once", capture_once)
    target, _ = tiny_dirs["llama"]
    model = SpecDecoder.from_pretrained(target, device="cpu", dtype="float32", runner="eager").target_model
    runner = StaticRunner(model, max_cache_len=64, cuda_graphs=True)
    widths = []
    eager = runner._eager
    monkeypatch.setattr(runner, "_eager", lambda ids, *a, **k: (widths.append(ids.shape[1]), eager(ids, *a, **k))[1])
    ids = torch.arange(3, 12)  # 9 tokens: bucket 16
    ref = EagerRunner(model).forward(ids)
    for expected in ([9, 16], [9]):  # the first: the cache-allocating forward, then padded; later: unpadded
        widths.clear()
        runner.reset()
        torch.testing.assert_close(runner.forward(ids), ref, rtol=1e-5, atol=1e-5)
        assert widths == expected and runner.seq_len == 9
    assert runner.capture_failures
