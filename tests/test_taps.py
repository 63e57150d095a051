"""Feature taps: which transformers 5.17 ``hidden_states`` entry is which, and both runners return the
same taps as a plain forward (static + CUDA graphs checked on the GPU only)."""

from __future__ import annotations

import pytest
import torch

from specviz.models import load_model
from specviz.runner import FINAL_NORM, EagerRunner, hidden_state_index, layer_input, layer_output
from specviz.static_runner import StaticRunner

TAPS = (FINAL_NORM, layer_input(0), layer_input(1), layer_output(0))


@pytest.fixture(scope="module")
def model(tiny_dirs):
    return load_model(tiny_dirs["llama"][0], torch.device("cpu"), torch.float32)


def test_hidden_states_entries_are_layer_inputs_and_the_final_norm(model):
    """Q8 of docs/design/methods.md: entry l < L is the input of decoder layer l (0 = embeddings) and the last entry
    is the final norm's output (what the LM head multiplies), not the last layer's un-normed output."""
    ids = torch.arange(3, 15)[None]  # [1, 12]
    inputs, outputs = {}, {}
    def keep_input(module, args, kwargs, i):
        inputs[i] = args[0] if args else kwargs["hidden_states"]

    def keep_output(module, args, out, i):
        outputs[i] = out[0] if isinstance(out, tuple) else out

    layers = list(enumerate(model.model.layers))
    hooks = [layer.register_forward_pre_hook(lambda m, a, kw, i=i: keep_input(m, a, kw, i), with_kwargs=True)
             for i, layer in layers]
    hooks += [layer.register_forward_hook(lambda m, a, o, i=i: keep_output(m, a, o, i)) for i, layer in layers]
    try:
        with torch.no_grad():
            out = model(input_ids=ids, output_hidden_states=True)
    finally:
        for h in hooks:
            h.remove()
    L = model.config.num_hidden_layers
    hs = out.hidden_states
    assert len(hs) == L + 1
    torch.testing.assert_close(hs[0], model.model.embed_tokens(ids))
    for layer in range(L):
        torch.testing.assert_close(hs[layer], inputs[layer])
    normed = model.model.norm(outputs[L - 1])
    torch.testing.assert_close(hs[L], normed)
    assert not torch.allclose(hs[L], outputs[L - 1])  # the last entry is post-norm
    torch.testing.assert_close(out.logits, model.lm_head(hs[L]))
    assert hidden_state_index(FINAL_NORM, L) == L
    assert hidden_state_index(layer_input(1), L) == 1 and hidden_state_index(layer_output(0), L) == 1


@pytest.mark.parametrize("bad", ("layer_input:2", "layer_output:1", "layer_input:-1", "final", "layer_input:x"))
def test_bad_taps_raise(model, bad):
    with pytest.raises(ValueError, match="tap"):
        EagerRunner(model).forward_features(torch.arange(3), (bad,))


def _plain_taps(model, ids):
    with torch.no_grad():
        out = model(input_ids=ids[None], output_hidden_states=True)
    L = model.config.num_hidden_layers
    return out.logits[0], {t: out.hidden_states[hidden_state_index(t, L)][0] for t in TAPS}


@pytest.mark.parametrize("runner", ("eager", "static"))
def test_runner_taps_equal_a_plain_forward_across_steps_and_rollback(model, runner):
    """Prefill, a verify-width forward, a rollback and another forward: every tap row equals the row of
    one uncached forward over the same committed tokens."""
    ids = torch.arange(5, 30)
    r = EagerRunner(model) if runner == "eager" else StaticRunner(model, max_cache_len=64)
    r.reset()
    got = [r.forward_features(ids[:10], TAPS), r.forward_features(ids[10:15], TAPS)]
    r.truncate(12)  # two of the five "drafts" kept
    got.append(r.forward_features(ids[12:16], TAPS))
    assert r.forward_features(ids[16:17]).features == {}  # no taps asked: none returned
    logits, want = _plain_taps(model, ids[:17])
    rows = [range(0, 10), range(10, 15), range(12, 16)]
    for out, span in zip(got, rows):
        torch.testing.assert_close(out.logits, logits[span.start:span.stop], rtol=1e-4, atol=1e-4)
        assert set(out.features) == set(TAPS)
        for tap in TAPS:
            assert out.features[tap].shape == (len(span), model.config.hidden_size)
            assert out.features[tap].dtype == torch.float32
            torch.testing.assert_close(out.features[tap], want[tap][span.start:span.stop], rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
def test_static_graph_taps_equal_eager_taps_on_gpu(tiny_dirs):
    """Under CUDA graphs the taps are static buffers captured in the graph; replays (also for a second
    set of taps, another graph) return the eager runner's features, and a later replay does not
    overwrite the features an earlier call returned."""
    model = load_model(tiny_dirs["llama"][0], torch.device("cuda"), torch.float32)
    ids = torch.arange(5, 40)
    eager, graphed = EagerRunner(model), StaticRunner(model, max_cache_len=64, cuda_graphs=True)
    for r in (eager, graphed):
        r.reset()
        r.forward_features(ids[:10], TAPS)
    kept = []
    for start, n, taps in ((10, 4, TAPS), (14, 4, TAPS), (18, 1, TAPS[:1]), (19, 4, TAPS[1:])):
        a = eager.forward_features(ids[start:start + n], taps)
        b = graphed.forward_features(ids[start:start + n], taps)
        kept.append((a, b))
        torch.testing.assert_close(b.logits, a.logits, rtol=1e-4, atol=1e-4)
        for tap in taps:
            torch.testing.assert_close(b.features[tap], a.features[tap], rtol=1e-4, atol=1e-4)
    assert graphed.graphs and all(key[1] for key in graphed.graphs)
    a, b = kept[0]  # the first replay's features survived three later replays
    for tap in TAPS:
        torch.testing.assert_close(b.features[tap], a.features[tap], rtol=1e-4, atol=1e-4)
