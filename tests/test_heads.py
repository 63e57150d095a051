"""EAGLE-1 / EAGLE-3 heads: shapes, the transformers hidden_states semantics they rely on, the
training-time test against chain inference, the draft cache, save/load and mismatch errors."""

from __future__ import annotations

import json

import pytest
import torch
from tiny_models import build_model
from transformers import DynamicCache

from specviz.methods.eagle.head import build_head, crop_cache, position_mask
from specviz.methods.eagle.config import head_config_from_target
from specviz.heads import load_head, save_head
from specviz.methods.eagle.features import target_features
from specviz.methods.eagle.chain import chain_logits
from specviz.methods.eagle.ttt import ttt_mask, unroll
from specviz.models import DEFAULT_TARGET, load_model

KINDS = ("eagle", "eagle3")


@pytest.fixture(scope="module")
def target():
    """A tiny random Llama target with 8 layers (EAGLE-3 taps (2, 4, 5)), fp32, GQA 4/2 heads."""
    return build_model("llama", seed=0, layers=8, hidden=64).float()


def _head(target, kind, seed=0):
    torch.manual_seed(seed)
    return build_head(head_config_from_target(target.config, kind), target).eval()


def test_hidden_states_semantics(target):
    """Q8 (docs/design/methods.md 13): in transformers 5.17, hidden_states has L + 1 entries; [0] is the embedding
    output, [l] the input of layer l, and [L] IS the final-norm output (== last_hidden_state), not
    the last layer's pre-norm output."""
    ids = torch.randint(0, target.config.vocab_size, (2, 9))
    out = target.model(input_ids=ids, output_hidden_states=True)
    L = target.config.num_hidden_layers
    assert len(out.hidden_states) == L + 1
    assert torch.equal(out.hidden_states[0], target.model.embed_tokens(ids))
    assert torch.equal(out.hidden_states[L], out.last_hidden_state)
    seen = {}

    def grab_input(module, args, kwargs):
        seen["in"] = args[0] if args else kwargs["hidden_states"]

    def grab_output(module, args, output):
        seen["out"] = output

    hook = target.model.layers[3].register_forward_pre_hook(grab_input, with_kwargs=True)
    hook2 = target.model.layers[L - 1].register_forward_hook(grab_output)
    try:
        target.model(input_ids=ids)
    finally:
        hook.remove()
        hook2.remove()
    assert torch.equal(seen["in"], out.hidden_states[3])  # entry l = the INPUT of layer l
    assert torch.allclose(target.model.norm(seen["out"]), out.last_hidden_state)
    assert not torch.allclose(seen["out"], out.hidden_states[L])  # the pre-norm output is not in the tuple


@pytest.mark.parametrize("kind", KINDS)
def test_forward_shapes_and_features(target, kind):
    head = _head(target, kind)
    cfg, d, V = head.config, target.config.hidden_size, target.config.vocab_size
    B, T = 2, 7
    ids = torch.randint(0, V, (B, T))
    tf = target_features(target, ids, cfg, with_logits=True)
    assert tf.features.shape == (B, T, cfg.feature_size)
    assert cfg.feature_size == (3 * d if kind == "eagle3" else d)
    assert cfg.taps == ((2, 4, 5) if kind == "eagle3" else ("final",))
    assert torch.allclose(tf.logits, target(input_ids=ids).logits, atol=1e-5)
    hidden, logits = head(tf.features, ids, torch.arange(T).expand(B, T), None, from_target=True)
    assert hidden.shape == (B, T, d) and logits.shape == (B, T, V) and logits.dtype == torch.float32
    h1, l1 = head(tf.features[0], ids[0], torch.arange(T), None, from_target=True)  # 2-D inputs
    assert h1.shape == (T, d) and torch.allclose(l1, logits[0], atol=1e-5)
    # no cache: causal over the rows whatever the positions (a later row never changes an earlier one)
    pos = torch.arange(5, 5 + T).expand(B, T)
    _, a = head(tf.features, ids, pos, None, from_target=True)
    ids2 = ids.clone()
    ids2[:, -1] = (ids2[:, -1] + 1) % V
    _, b = head(tf.features, ids2, pos, None, from_target=True)
    assert torch.equal(a[:, :-1], b[:, :-1]) and not torch.equal(a[:, -1], b[:, -1])
    h2, l2 = head(hidden, ids, torch.arange(T).expand(B, T), None, from_target=False)  # fed back
    assert h2.shape == (B, T, d) and l2.shape == (B, T, V)
    # no target weights in the head's parameters or state_dict (shared, frozen)
    names = set(head.state_dict())
    assert not any("embed" in n or "lm_head" in n for n in names)
    assert head.embed_tokens is target.get_input_embeddings() and head.lm_head is target.get_output_embeddings()
    assert all(not p.requires_grad for p in head.lm_head.parameters())


def test_eagle1_structure(target):
    """EAGLE-1: no input_layernorm on its layer, no final norm, logits = W_lm(un-normed output)."""
    head = _head(target, "eagle")
    assert isinstance(head.layer.input_layernorm, torch.nn.Identity)
    assert head.fc.in_features == 2 * head.config.hidden_size and head.fc.bias is not None
    f = torch.randn(5, head.config.hidden_size)
    ids = torch.randint(0, head.config.vocab_size, (5,))
    hidden, logits = head(f, ids, torch.arange(5), None, from_target=True)
    assert torch.allclose(logits, target.lm_head(hidden), atol=1e-5)


def test_eagle3_fc_only_on_target_features(target):
    """EAGLE-3: fc (3d -> d) only on the first pass; a [.., 3d] input on a later step is an error."""
    head = _head(target, "eagle3")
    d = head.config.hidden_size
    assert head.fc.in_features == 3 * d and head.fc.bias is None
    assert head.layer.self_attn.q_proj.in_features == 2 * d
    g = torch.randn(4, 3 * d)
    ids = torch.randint(0, head.config.vocab_size, (4,))
    hidden, logits = head(g, ids, torch.arange(4), None, from_target=True)
    h_same, l_same = head(head.fc(g), ids, torch.arange(4), None, from_target=False)
    assert torch.allclose(logits, l_same, atol=1e-5)
    assert torch.allclose(logits, target.lm_head(head.norm(hidden)), atol=1e-5)
    with pytest.raises(ValueError, match="fed-back"):
        head(g, ids, torch.arange(4), None, from_target=False)
    with pytest.raises(ValueError, match="target features"):
        head(torch.randn(4, d), ids, torch.arange(4), None, from_target=True)


@pytest.mark.parametrize("kind", KINDS)
def test_cache_incremental_and_rollback(target, kind):
    """A first pass in two chunks through a DynamicCache equals one pass; after drafting and
    crop_cache back to the committed length, recomputing from target features gives the same K/V
    as a fresh first pass (docs/design/methods.md 1.2 / 11.3)."""
    head = _head(target, kind)
    T = 10
    ids = torch.randint(0, head.config.vocab_size, (1, T + 1))
    feats = target_features(target, ids[:, :T], head.config).features
    full_h, full_l = head(feats, ids[:, 1:], torch.arange(T)[None], None, from_target=True)
    cache = DynamicCache()
    _, l_a = head(feats[:, :6], ids[:, 1:7], torch.arange(6)[None], cache, from_target=True)
    h_b, l_b = head(feats[:, 6:], ids[:, 7:], torch.arange(6, T)[None], cache, from_target=True)
    assert torch.allclose(torch.cat([l_a, l_b], 1), full_l, atol=1e-4)
    # draft 3 provisional steps, then roll back to 7 committed and recompute slots 7..9
    h, lg = h_b[:, -1:], l_b[:, -1:]
    for m in range(3):  # greedy chain: draft token m+1 at position T+m
        h, lg = head(h, lg.argmax(-1), torch.tensor([[T + m]]), cache, from_target=False)
    assert cache.get_seq_length() == T + 3
    crop_cache(cache, 7)
    assert cache.get_seq_length() == 7
    _, l_re = head(feats[:, 7:], ids[:, 8:], torch.arange(7, T)[None], cache, from_target=True)
    fresh = DynamicCache()
    head(feats, ids[:, 1:], torch.arange(T)[None], fresh, from_target=True)
    assert torch.allclose(cache.layers[0].keys, fresh.layers[0].keys, atol=1e-5)
    assert torch.allclose(cache.layers[0].values, fresh.layers[0].values, atol=1e-5)
    assert torch.allclose(l_re, full_l[:, 7:], atol=1e-4)


def test_ttt_mask_equals_chain_pattern():
    """TTT step s, row t sees step-0 keys <= t plus the step-1..s keys of row t. Build the same set
    from chain inference (cache slots 0..t hold the committed rows, slot t+i the i-th draft key;
    the inference mask is ``position_mask``) and compare."""
    T, S = 6, 4
    for s in range(S):
        chain = torch.zeros(T, (s + 1) * T, dtype=torch.bool)
        for t in range(T):
            visible = position_mask(torch.tensor([[t + s]]), t + s + 1)[0, 0, 0]  # slots 0..t+s
            for slot in torch.nonzero(visible).flatten().tolist():
                step, row = (0, slot) if slot <= t else (slot - t, t)  # slot t+i = draft step i of row t
                chain[t, step * T + row] = True
        assert torch.equal(ttt_mask(T, s)[0, 0], chain), s


@pytest.mark.parametrize("kind", KINDS)
def test_ttt_logits_equal_chain_inference(target, kind):
    """Every TTT step-s logit at row t equals running the head as a chain (first pass over
    features 0..t, then s teacher-forced draft steps) in fp32."""
    head = _head(target, kind, seed=1)
    T, S = 9, 4
    x = torch.randint(0, head.config.vocab_size, (1, T + S + 1))
    feats = target_features(target, x[:, :T], head.config).features
    steps = unroll(head, feats, x[:, 1 : T + S + 1], torch.arange(T)[None], S)
    for t in range(T):
        _, chain = chain_logits(head, feats[0, : t + 1], x[0, : t + 2], S, forced=x[0, t + 2 : t + 1 + S])
        for s in range(S):
            ttt = steps[s][1][0, t]
            assert torch.allclose(ttt, chain[s], atol=1e-4, rtol=1e-4), (t, s, (ttt - chain[s]).abs().max())


@pytest.mark.parametrize("kind", KINDS)
def test_save_load_round_trip(target, kind, tmp_path):
    head = _head(target, kind)
    files = save_head(head, tmp_path / kind)
    assert sorted(files) == ["config.json", "model.safetensors"]
    loaded = load_head(tmp_path / kind, target)
    assert loaded.config == head.config
    ref = build_head(head.config, target)
    ref.load_state_dict({k: v.to(torch.bfloat16).float() for k, v in head.state_dict().items()})
    ids = torch.randint(0, head.config.vocab_size, (1, 6))
    feats = target_features(target, ids, head.config).features
    pos = torch.arange(6)[None]
    assert torch.equal(loaded(feats, ids, pos, from_target=True)[1], ref.eval()(feats, ids, pos, from_target=True)[1])
    from safetensors import safe_open

    with safe_open(str(tmp_path / kind / "model.safetensors"), "pt") as f:
        keys = list(f.keys())
        assert all(f.get_tensor(k).dtype == torch.bfloat16 for k in keys)
    assert not any("embed" in k or "lm_head" in k for k in keys)


def test_mismatched_head_raises(target, tmp_path):
    head = _head(target, "eagle3")
    save_head(head, tmp_path / "h")
    other = build_model("llama", seed=0, layers=8, hidden=32).float()
    with pytest.raises(ValueError, match="hidden size 64 != target's 32"):
        load_head(tmp_path / "h", other)
    fewer = build_model("llama", seed=0, layers=4, hidden=64).float()
    with pytest.raises(ValueError, match="out of range"):
        load_head(tmp_path / "h", fewer)
    cfg = json.loads((tmp_path / "h" / "config.json").read_text())
    cfg["vocab_size"] = 999
    (tmp_path / "h" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="vocab size 999"):
        load_head(tmp_path / "h", target)
    with pytest.raises(ValueError, match="no head config"):
        load_head(tmp_path / "missing", target)
    with pytest.raises(ValueError, match="kind"):
        head_config_from_target(target.config, "medusa")


@pytest.fixture(scope="module")
def bundled():
    return load_model(DEFAULT_TARGET, torch.device("cpu"), torch.float32)


@pytest.mark.parametrize("kind", KINDS)
def test_bundled_target(bundled, kind):
    """The heads build on the bundled target (family v2: d=256, 20 layers, GQA) from its config alone."""
    t = bundled
    head = _head(t, kind)
    L = t.config.num_hidden_layers
    if kind == "eagle3":
        assert head.config.aux_layer_ids == (2, L // 2, L - 3)
    ids = torch.randint(0, t.config.vocab_size, (1, 12))
    feats = target_features(t, ids, head.config).features
    hidden, logits = head(feats, ids, torch.arange(12)[None], None, from_target=True)
    assert hidden.shape == (1, 12, t.config.hidden_size) and logits.shape == (1, 12, t.config.vocab_size)


def test_default_eagle3_taps():
    from specviz.methods.eagle.config import default_aux_layer_ids

    assert default_aux_layer_ids(20) == (2, 10, 17)  # model family v2
    assert default_aux_layer_ids(8) == (2, 4, 5)  # the old bundled target (docs/design/methods.md 4.1)
    assert default_aux_layer_ids(2) == (1, 1, 0)  # tiny targets: clamped into [0, L)
    with pytest.raises(ValueError):
        default_aux_layer_ids(0)


def test_bf16_eagle_heads_keep_fp32_rope_frequencies():
    """Cast to bf16 (as a bf16 target's heads are), an EAGLE head's RoPE inv_freq stays float32 and equal to the
    target's; a bf16 inv_freq would rotate position 1000 by up to ~4 rad off the trained angle."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from specviz.methods.eagle.head import build_head
    from specviz.methods.eagle.config import head_config_from_target

    torch.manual_seed(0)
    target = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128))
    for kind in ("eagle", "eagle3"):
        head = build_head(head_config_from_target(target.config, kind), target).to(torch.bfloat16)
        rot = head.rotary_emb
        assert rot.inv_freq.dtype == torch.float32
        torch.testing.assert_close(rot.inv_freq, target.model.rotary_emb.inv_freq.float())
    from specviz.methods.mtp.head import MtpHead, mtp_config_from_target  # the MTP head has its own RoPE too

    rot = MtpHead(mtp_config_from_target(target.config), target).to(torch.bfloat16).rotary_emb
    assert rot.inv_freq.dtype == torch.float32


def test_a_given_head_replaces_only_its_methods_bundled_head(tmp_path):
    """On the bundled target, heads={"eagle": DIR} loads DIR as eagle's head and keeps every other bundled head (it
    replaced them all: comparing one head of your own against the bundled rest failed with "eagle3 needs a head")."""
    from specviz.loading import bundled_heads, load_parts

    there = {m for m, d in bundled_heads().items() if (d / "config.json").exists()}
    if not {"eagle", "eagle3"} <= there:
        pytest.skip("the bundled EAGLE heads are not in this checkout")
    parts = load_parts(None, None, "cpu", "float32", "eager", 256, None, False)
    head = build_head(head_config_from_target(parts["target_model"].config, "eagle"))
    save_head(head, tmp_path / "eagle")
    got = load_parts(None, None, "cpu", "float32", "eager", 256, {"eagle": str(tmp_path / "eagle")}, False)
    assert set(got["heads"]) == set(parts["heads"]) == there
    assert got["names"]["eagle_head"] == str(tmp_path / "eagle") and got["names"]["eagle3_head"].endswith("eagle3")
    w = next(iter(head.state_dict().values()))
    saved = next(iter(got["heads"]["eagle"].state_dict().values())).cpu()
    assert torch.equal(saved, w.bfloat16().float())  # saved in bf16
