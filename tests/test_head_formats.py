"""Published head layouts (specviz.heads.formats): each loader against a reference forward written from the
public code (tests/reference_drafters.py), on a tiny target whose RoPE base (50000) differs from every head's.

For each layout a tiny checkpoint is written in the exact published layout (random weights; a reduced draft
vocabulary where the format has one); every draft specviz makes with it equals the reference's draft from the
same context, and greedy output equals plain greedy. Planted mistakes (the loader monkeypatched to read taps in
the wrong convention, to miss a norm, to read d2t as ids) make the comparison fail."""

from __future__ import annotations

import pytest
import torch
from helpers import PROMPT, draft_mismatches, with_head

import reference_drafters as R
from specviz import SpecDecoder
from specviz.heads import formats
from specviz.methods.eagle import formats as eagle_formats
from specviz.heads.formats import load_head_dir

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: one intra-op thread
K, NEW = 3, 12


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("formats")


@pytest.fixture(scope="module")
def target_dir(root):
    return R.save_target(root / "target")


@pytest.fixture(scope="module")
def dec(target_dir):
    return SpecDecoder.from_pretrained(target_dir, device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def plain(dec):
    return dec.generate(PROMPT, method="none", max_new_tokens=NEW).output_token_ids


def mismatches(dec, method, reference, k=K):
    """(trace, [(step, specviz's drafts, the reference's)] where they differ): greedy, chain of k."""
    return draft_mismatches(dec, method, reference, k, NEW)


# ---- checkpoints in the published layouts ----------------------------------------------------------------
@pytest.fixture(scope="module")
def layouts(root, dec):
    """{name: (method, dir, tensors as written, reference)} for every published layout."""
    tm = dec.target_model
    out = {}
    W = R.eagle1_safeailab(root / "eagle1", tm)
    from specviz.heads.formats.convert import convert_dir

    convert_dir(root / "eagle1")  # the official EAGLE-1 heads ship only pytorch_model.bin
    out["eagle-safeailab"] = ("eagle", root / "eagle1", W, R.EagleReference(W, tm, eagle3=False, prefix="layers.0."))
    W = R.eagle3_safeailab(root / "e3-safeailab")
    out["eagle3-safeailab"] = ("eagle3", root / "e3-safeailab", W,
                               R.EagleReference(W, tm, eagle3=True, taps=[2, 4, 5], prefix="midlayer."))
    W = R.eagle3_specforge(root / "e3-specforge", tm)
    out["eagle3-specforge"] = ("eagle3", root / "e3-specforge", W,
                               R.EagleReference(W, tm, eagle3=True, taps=[1, 3, 5], tap_outputs=True,
                                                prefix="midlayer.", base=20000.0, fc_norm=True))
    W = R.eagle3_speculators(root / "e3-speculators", tm)
    out["eagle3-speculators"] = ("eagle3", root / "e3-speculators", W,
                                 R.EagleReference(W, tm, eagle3=True, taps=[1, 3, 6], prefix="layers.0.",
                                                  norm_before_residual=True))
    W = R.medusa1(root / "medusa1")
    convert_dir(root / "medusa1")  # Medusa-1 heads ship medusa_lm_head.pt
    out["medusa1-fasterdecoding"] = ("medusa", root / "medusa1", W, R.MedusaReference(W, tm, "per_head", 3, 1))
    W = R.medusa2(root / "medusa2")
    out["medusa2-fasterdecoding"] = ("medusa", root / "medusa2", W, R.MedusaReference(W, tm, "target", 3, 2))
    W = R.medusa_vllm(root / "medusa-vllm")
    out["medusa-vllm"] = ("medusa", root / "medusa-vllm", W, R.MedusaReference(W, tm, "vllm", 3, 1))
    W = R.dflash_zlab(root / "dflash")
    out["dflash-zlab"] = ("dflash", root / "dflash", W,
                          R.DFlashReference(W, tm, (1, 5), 2, 4, 2, base=1e6, eps=1e-6))
    return out


@pytest.mark.parametrize("layout", ["eagle-safeailab", "eagle3-safeailab", "eagle3-specforge", "eagle3-speculators",
                                    "medusa1-fasterdecoding", "medusa2-fasterdecoding", "medusa-vllm", "dflash-zlab"])
def test_every_draft_equals_the_reference_and_greedy_equals_plain(layouts, target_dir, plain, layout):
    """Loaded through the one API (from_pretrained(target, heads={method: DIR})), detected from the files,
    each head drafts exactly what the public code's forward drafts, at every step; output = plain greedy."""
    method, directory, _, reference = layouts[layout]
    dec = SpecDecoder.from_pretrained(target_dir, device="cpu", dtype="float32", heads={method: str(directory)})
    assert dec.heads[method].source["format"] == layout
    trace, bad = mismatches(dec, method, reference)
    assert not bad, bad
    assert trace.output_token_ids == plain
    head = trace.config["head"]
    assert head["format"] == layout and head["path"] == str(directory)


def test_reduced_vocabulary_and_norm_variants(root, dec):
    """speculators' ``norm_output`` (the normed h fed back) with ``norm_before_fc``; a SafeAILab EAGLE-3 head
    without t2d (vLLM and SGLang never read it): drafts equal the reference's; EAGLE-3 drafts are target ids
    from the draft vocabulary."""
    tm = dec.target_model
    W = R.eagle3_speculators(root / "e3-spec-v2", tm, seed=8, layer_ids=(6, 1, 3), norm_output=True,
                             norm_before_fc=True)
    ref = R.EagleReference(W, tm, eagle3=True, taps=[1, 3, 6], prefix="layers.0.", norm_before_residual=True,
                           norm_before_fc=True, feed_normed=True)
    head = load_head_dir(root / "e3-spec-v2", tm, "eagle3")
    assert head.config.aux_layer_ids == (1, 3, 6)  # engines concatenate the taps in layer order
    with with_head(dec, "eagle3", head):
        assert not mismatches(dec, "eagle3", ref)[1]
    W = R.eagle3_safeailab(root / "e3-no-t2d", seed=9, t2d=False)
    head = load_head_dir(root / "e3-no-t2d", tm, "eagle3")
    allowed = {i + int(W["d2t"][i]) for i in range(64)}
    with with_head(dec, "eagle3", head):
        trace, bad = mismatches(dec, "eagle3", R.EagleReference(W, tm, eagle3=True, taps=[2, 4, 5], prefix="midlayer."))
    assert not bad
    assert all(t in allowed for st in trace.steps for t in st.draft_token_ids)


def test_dflash_block_size_nested_and_num_speculative_tokens(root, dec):
    """block_size inside dflash_config (newer z-lab files) loads the same; a k above block_size - 1 drafts B - 1."""
    tm = dec.target_model
    W = R.dflash_zlab(root / "dflash-nested", seed=11, layer_ids=(0, 3, 6), block_size=5, nested=True, layers=1)
    head = load_head_dir(root / "dflash-nested", tm, "dflash")
    assert head.config.block_size == 5 and head.source["block_size_in"] == "dflash_config"
    ref = R.DFlashReference(W, tm, (0, 3, 6), 1, 5, 2, base=1e6, eps=1e-6)
    with with_head(dec, "dflash", head):
        assert not mismatches(dec, "dflash", ref, k=4)[1]
        over = dec.generate(PROMPT, method="dflash", num_speculative_tokens=5, max_new_tokens=12)
        assert max(len(s.draft_token_ids) for s in over.steps) == 4
        assert "at most 4 tokens per step (one block of B = 5" in over.config["draft_note"]
    R.dflash_zlab(root / "dflash-b1", seed=11, layer_ids=(0, 3, 6), block_size=1, layers=1)
    with pytest.raises(ValueError, match=r"dflash-b1.*block_size must be an integer >= 2 \(a root and at least one"):
        load_head_dir(root / "dflash-b1", tm, "dflash")  # the error names the directory


# ---- planted mistakes: each makes the comparison fail -----------------------------------------------------
def test_planted_wrong_taps_fail(layouts, dec, monkeypatch):
    """Taps read one layer off (the SpecForge +1 applied to SafeAILab's default) draft differently."""
    _, directory, _, reference = layouts["eagle3-safeailab"]
    real = eagle_formats.default_taps
    monkeypatch.setattr(eagle_formats, "default_taps", lambda n: [t + 1 for t in real(n)])
    head = load_head_dir(directory, dec.target_model, "eagle3")
    assert head.config.aux_layer_ids == (3, 5, 6)
    with with_head(dec, "eagle3", head):
        assert mismatches(dec, "eagle3", reference)[1]


def test_planted_missed_norm_fails(layouts, dec, monkeypatch):
    """speculators' norm_before_residual dropped (vLLM's and SGLang's defaults disagree on it) drafts differently."""
    _, directory, _, reference = layouts["eagle3-speculators"]
    real = eagle_formats.norm_flags
    monkeypatch.setattr(eagle_formats, "norm_flags", lambda layout, cfg: {**real(layout, cfg),
                                                                          "norm_before_residual": False})
    head = load_head_dir(directory, dec.target_model, "eagle3")
    with with_head(dec, "eagle3", head):
        assert mismatches(dec, "eagle3", reference)[1]


def test_planted_d2t_read_as_ids_fails(root, dec, monkeypatch):
    """d2t read as target ids instead of offsets: without t2d the drafts differ from the reference's; with
    t2d the loader refuses it (t2d marks other ids)."""
    monkeypatch.setattr(eagle_formats, "draft_to_target_ids", lambda d2t: d2t.long())
    W = R.eagle3_safeailab(root / "e3-planted", seed=12, t2d=False)
    head = load_head_dir(root / "e3-planted", dec.target_model, "eagle3")
    with with_head(dec, "eagle3", head):
        assert mismatches(dec, "eagle3", R.EagleReference(W, dec.target_model, eagle3=True, taps=[2, 4, 5],
                                                          prefix="midlayer."))[1]
    R.eagle3_safeailab(root / "e3-planted-t2d", seed=12)
    with pytest.raises(ValueError, match="t2d"):
        load_head_dir(root / "e3-planted-t2d", dec.target_model, "eagle3")


def test_planted_inherited_rope_fails(layouts, dec, monkeypatch):
    """A head run at the target's RoPE base (50000) instead of its own (10000, no rope_theta) drafts differently."""
    _, directory, _, reference = layouts["eagle3-safeailab"]
    from specviz.heads.formats import common

    real = common.rope_parameters
    inherited = lambda cfg, default_theta=10000.0: real(cfg, R.TARGET_ROPE)  # noqa: E731
    monkeypatch.setattr(eagle_formats, "rope_parameters", inherited)
    monkeypatch.setattr(common, "rope_parameters", inherited)  # what safeailab_rope reads
    head = load_head_dir(directory, dec.target_model, "eagle3")
    with with_head(dec, "eagle3", head):
        assert mismatches(dec, "eagle3", reference)[1]


def test_safeailab_scaled_rope_runs_at_base_10000_and_head_dim_is_read(root, dec, monkeypatch):
    """SafeAILab's ``_init_rope`` builds its linear / dynamic scaled RoPE without ``base=``: a head whose config says
    rope_theta 500000 with linear scaling x2 runs at base 10000 with positions / 2; the EAGLE-3 ``cnets.py`` reads
    ``head_dim`` (here 4, not H / heads = 8). Drafts equal the reference's; reading rope_theta there (the planted
    mistake) drafts differently."""
    from specviz.heads.formats import common

    tm = dec.target_model
    fields = {"rope_theta": 500000.0, "rope_scaling": {"type": "linear", "factor": 2.0}}
    W = R.eagle3_safeailab(root / "e3-sa-linear", seed=13, hd=4, **fields)
    head = load_head_dir(root / "e3-sa-linear", tm, "eagle3")
    rope = head.config.rope_parameters
    assert (rope["rope_type"], rope["rope_theta"], rope["factor"], head.config.head_dim) == ("linear", 10000.0, 2.0, 4)
    reference = R.EagleReference(W, tm, eagle3=True, taps=[2, 4, 5], prefix="midlayer.", linear_rope=2.0)
    with with_head(dec, "eagle3", head):
        assert not mismatches(dec, "eagle3", reference)[1]
    monkeypatch.setattr(eagle_formats, "safeailab_rope", lambda cfg, where: common.rope_parameters(cfg))
    planted = load_head_dir(root / "e3-sa-linear", tm, "eagle3")
    assert planted.config.rope_parameters["rope_theta"] == 500000.0
    with with_head(dec, "eagle3", planted):
        assert mismatches(dec, "eagle3", reference)[1]


# ---- what each layout is normalised to -------------------------------------------------------------------
def test_normalisation_recorded(layouts, dec):
    """Taps in one convention (the input of layer l), norm flags with their source's default, the draft
    vocabulary as target ids, head counts from the keys, z-lab ids kept as layer outputs."""
    tm = dec.target_model
    heads = {name: load_head_dir(d, tm, m) for name, (m, d, _, _) in layouts.items()}
    e1 = heads["eagle-safeailab"]
    assert e1.config.fc_bias and not e1.config.own_embedding and e1.source["rope_theta"] == 10000.0
    sf = heads["eagle3-specforge"]
    assert sf.config.aux_layer_ids == (2, 4, 6) and sf.source["taps_in_file"] == [1, 3, 5]
    assert sf.config.fc_norm and sf.config.norm_logits and sf.config.rope_parameters["rope_theta"] == 20000.0
    sp = heads["eagle3-speculators"]
    assert sp.config.aux_layer_ids == (1, 3, 6) and sp.config.norm_before_residual and not sp.config.feed_normed
    sa = heads["eagle3-safeailab"]
    W = layouts["eagle3-safeailab"][2]
    assert sa.config.draft_vocab_size == 64 and sa.source["draft_vocab_size"] == 64
    assert torch.equal(sa.draft_to_target, torch.arange(64) + W["d2t"])
    assert heads["medusa1-fasterdecoding"].config.num_heads == 3  # keys say 3; config.json says 2
    assert heads["medusa1-fasterdecoding"].source["config_num_heads"] == 2
    assert heads["medusa2-fasterdecoding"].config.lm_heads == "target"
    mv = heads["medusa-vllm"]
    assert mv.config.head_vocab_size == 100 and not mv.config.fc_bias
    assert torch.equal(mv.token_map, layouts["medusa-vllm"][2]["token_map"])
    df = heads["dflash-zlab"]
    assert df.config.target_layer_ids == (1, 5) and df.config.mask_token_id == 2 and df.config.block_size == 4


# ---- errors ------------------------------------------------------------------------------------------------
def test_unknown_layout_names_what_was_found(root, dec):
    R.write(root / "unknown", {"model_type": "mystery"}, {"foo.weight": torch.zeros(2, 2)})
    with pytest.raises(ValueError, match=r"unknown head layout .*foo\.weight.*Known layouts: .*eagle3-safeailab"):
        load_head_dir(root / "unknown", dec.target_model)


def test_pickles_are_never_read_by_the_loader(root, dec, monkeypatch):
    """A .bin-only head gets an error naming ``specviz convert``; the loader never calls torch.load."""
    R.eagle1_safeailab(root / "bin-only", dec.target_model)
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("the loader unpickled"))
    with pytest.raises(ValueError, match="specviz convert"):
        load_head_dir(root / "bin-only", dec.target_model, "eagle")


def test_convert_command(root, dec, capsys):
    """``specviz convert DIR`` writes safetensors beside the .bin (weights_only load), then the head loads;
    a second run refuses to overwrite; a pickle holding a non-tensor object is refused."""
    from specviz.cli import main

    R.eagle1_safeailab(root / "to-convert", dec.target_model)
    assert main(["convert", str(root / "to-convert")]) == 0
    assert (root / "to-convert" / "pytorch_model.safetensors").is_file()
    assert load_head_dir(root / "to-convert", dec.target_model, "eagle").source["format"] == "eagle-safeailab"
    assert main(["convert", str(root / "to-convert")]) == 2
    assert "exists already" in capsys.readouterr().err
    bad = root / "bad-pickle"
    bad.mkdir()
    torch.save({"w": torch.zeros(1), "note": "not a tensor"}, bad / "pytorch_model.bin")
    assert main(["convert", str(bad)]) == 2
    assert "state dict" in capsys.readouterr().err
    # a .bin shipped beside safetensors (as some official EAGLE heads are): nothing to convert, the head loads as is
    both = root / "both"
    R.eagle1_safeailab(both, dec.target_model)
    from safetensors.torch import save_file

    weights = torch.load(both / "pytorch_model.bin", weights_only=True)
    save_file(weights, str(both / "model.safetensors"))
    assert main(["convert", str(both)]) == 2
    assert "already holds safetensors weights (model.safetensors)" in capsys.readouterr().err
    assert load_head_dir(both, dec.target_model, "eagle").source["format"] == "eagle-safeailab"
    save_file(weights, str(both / "pytorch_model.safetensors"))  # a copy from an older convert
    with pytest.raises(ValueError, match="are in both model.safetensors and pytorch_model.safetensors.*delete one"):
        load_head_dir(both, dec.target_model, "eagle")


def test_copies_of_the_targets_embedding_and_lm_head_are_shared_and_others_refused(layouts, dec, root):
    """EAGLE-1 and DFlash draft with the target's embedding / LM head: a file that also carries a copy of them
    (as some exports do) loads and drafts as the reference; a copy that differs is refused, naming the tensor."""
    import json

    tm = dec.target_model
    lm, emb = tm.get_output_embeddings().weight.detach().clone(), tm.get_input_embeddings().weight.detach().clone()
    for layout, extra in (("eagle-safeailab", {"lm_head.weight": lm}),
                          ("dflash-zlab", {"embed_tokens.weight": emb, "lm_head.weight": lm})):
        method, directory, W, reference = layouts[layout]
        config = json.loads((directory / "config.json").read_text())
        R.write(root / f"{layout}-copies", config, {**W, **extra})
        head = load_head_dir(root / f"{layout}-copies", tm, method)
        with with_head(dec, method, head):
            assert not mismatches(dec, method, reference)[1]
        assert head.source["format"] == layout and head.source["lm_head.weight"].startswith("the target's")
        R.write(root / f"{layout}-other", config, {**W, "lm_head.weight": lm + 1})
        with pytest.raises(ValueError, match="lm_head.weight .* is not a copy of the target's lm_head"):
            load_head_dir(root / f"{layout}-other", tm, method)


def test_wrong_method_and_mismatched_target(layouts, dec, root):
    _, directory, _, _ = layouts["eagle3-safeailab"]
    with pytest.raises(ValueError, match="method 'eagle3' .*not of 'eagle'"):
        load_head_dir(directory, dec.target_model, "eagle")
    cfg = dict(R._llama_fields(draft_vocab_size=64))
    W = R._eagle3_core("midlayer.", 0, 64)
    W["d2t"], W["t2d"] = R.reduced_vocab(0)
    W["fc.weight"] = torch.zeros(R.HIDDEN, 2 * R.HIDDEN)  # two taps' worth: not SafeAILab's three
    R.write(root / "e3-two-taps", cfg, W)
    with pytest.raises(ValueError, match="fc reads 64 features"):
        load_head_dir(root / "e3-two-taps", dec.target_model, "eagle3")
    W = R._eagle3_core("midlayer.", 0, 64)
    W["d2t"], W["t2d"] = R.reduced_vocab(0)
    W["d2t"] = W["d2t"] + torch.arange(64)  # absolute target ids where offsets belong: they run past the vocabulary
    R.write(root / "e3-absolute-d2t", cfg, W)
    with pytest.raises(ValueError, match="d2t holds offsets .*looks like absolute target ids"):
        load_head_dir(root / "e3-absolute-d2t", dec.target_model, "eagle3")
    R.dflash_zlab(root / "dflash-last", layer_ids=(1, 7))  # output of the last layer: post-norm in transformers
    with pytest.raises(ValueError, match="out of range"):
        load_head_dir(root / "dflash-last", dec.target_model, "dflash")


def test_a_users_mistakes_get_one_clear_error(layouts, dec, root):
    """What a user gets wrong with a head directory: each is one ValueError that says what to do."""
    from specviz.heads.formats.convert import convert_dir

    e3 = layouts["eagle3-safeailab"][1]
    with pytest.raises(ValueError, match=f"is a file; give the head's directory .*{e3}"):
        load_head_dir(e3 / "model.safetensors", dec.target_model, "eagle3")
    broken = root / "truncated"
    broken.mkdir()
    (broken / "config.json").write_text((e3 / "config.json").read_text())
    (broken / "model.safetensors").write_bytes((e3 / "model.safetensors").read_bytes()[:50])
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        load_head_dir(broken, dec.target_model, "eagle3")
    config_only = root / "config-only"
    config_only.mkdir()
    (config_only / "config.json").write_text('{"format": "specviz-head-v1", "kind": "eagle3"}')
    with pytest.raises(ValueError, match="holds no weights .*only config.json"):
        load_head_dir(config_only, dec.target_model, "eagle3")
    (config_only / "model.safetensors").write_bytes((e3 / "model.safetensors").read_bytes())
    with pytest.raises(ValueError, match="config.json lacks .*hidden_size"):  # not a constructor's TypeError
        load_head_dir(config_only, dec.target_model, "eagle3")
    for heads, message in (("some/dir", "heads= takes {method: directory}"), ({"eagle3": None}, "must be a directory")):
        with pytest.raises(ValueError, match=message):
            SpecDecoder.from_pretrained(device="cpu", heads=heads)
    with pytest.raises(ValueError, match="does not exist"):
        convert_dir(root / "no-such-dir")


def test_a_broken_checkpoint_is_named_in_the_files_own_terms(layouts, dec, root):
    """A missing tensor is named as the file would name it; a missing shard, a Medusa head without ResBlocks and a
    DFlash tap on the last layer each get their own reason."""
    import json

    from safetensors.torch import save_file

    _, e3, W, _ = layouts["eagle3-safeailab"]
    config = json.loads((e3 / "config.json").read_text())
    R.write(root / "e3-missing", config, {k: v for k, v in W.items() if k != "midlayer.mlp.up_proj.weight"})
    with pytest.raises(ValueError, match=r"missing \['midlayer\.mlp\.up_proj\.weight'\]"):
        load_head_dir(root / "e3-missing", dec.target_model, "eagle3")
    shards = root / "e3-sharded"
    names = sorted(W)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    R.write(shards, config, {n: W[n] for n in halves["model-00001-of-00002.safetensors"]},
            name="model-00001-of-00002.safetensors")
    index = {"weight_map": {n: f for f, ns in halves.items() for n in ns}}
    (shards / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match=r"shard files \['model-00002-of-00002.safetensors'\] .* are missing"):
        load_head_dir(shards, dec.target_model, "eagle3")
    save_file({n: W[n].contiguous() for n in halves["model-00002-of-00002.safetensors"]},
              str(shards / "model-00002-of-00002.safetensors"))
    assert load_head_dir(shards, dec.target_model, "eagle3") is not None  # whole again: it loads
    V, H = dec.target_model.config.vocab_size, dec.target_model.config.hidden_size
    R.write(root / "medusa0", {"medusa_num_heads": 2, "medusa_num_layers": 0},
            {f"{h}.0.weight": torch.zeros(V, H) for h in range(2)})
    with pytest.raises(ValueError, match="medusa_num_layers 0 .* not supported"):
        load_head_dir(root / "medusa0", dec.target_model, "medusa")
    _, dflash, W, _ = layouts["dflash-zlab"]
    config = json.loads((dflash / "config.json").read_text())
    last = dec.target_model.config.num_hidden_layers - 1
    config["dflash_config"]["target_layer_ids"][-1] = last
    R.write(root / "dflash-last", config, W)
    with pytest.raises(ValueError, match=f"id {last}, the last layer, would read hidden_states.*final norm"):
        load_head_dir(root / "dflash-last", dec.target_model, "dflash")
    # a DFlash file without hidden_norm is still DFlash (its dflash_config), missing a tensor, not an EAGLE-1 head
    R.write(root / "dflash-no-norm", json.loads((dflash / "config.json").read_text()),
            {k: v for k, v in W.items() if k != "hidden_norm.weight"})
    with pytest.raises(ValueError, match=r"missing \['hidden_norm\.weight'\]"):
        load_head_dir(root / "dflash-no-norm", dec.target_model, "dflash")
    # vLLM Medusa LM heads cut to token_map, config.json without truncated_vocab_size: named as the file names them
    _, medusa, W, _ = layouts["medusa-vllm"]
    config = json.loads((medusa / "config.json").read_text())
    R.write(root / "medusa-no-tvs", {k: v for k, v in config.items() if k != "truncated_vocab_size"}, W)
    with pytest.raises(ValueError, match="lm_heads.0.weight has 100 rows.*lacks truncated_vocab_size = 100"):
        load_head_dir(root / "medusa-no-tvs", dec.target_model, "medusa")
    # speculators without the draft layer's config, or without its model_type
    _, spec, W, _ = layouts["eagle3-speculators"]
    config = json.loads((spec / "config.json").read_text())
    R.write(root / "spec-no-tlc", {k: v for k, v in config.items() if k != "transformer_layer_config"}, W)
    with pytest.raises(ValueError, match="config.json has no transformer_layer_config"):
        load_head_dir(root / "spec-no-tlc", dec.target_model, "eagle3")
    tl = {k: v for k, v in config["transformer_layer_config"].items() if k != "model_type"}
    R.write(root / "spec-no-type", {**config, "transformer_layer_config": tl}, W)
    with pytest.raises(ValueError, match="transformer_layer_config has no model_type"):
        load_head_dir(root / "spec-no-type", dec.target_model, "eagle3")


def test_the_app_refuses_a_head_that_would_fail_every_run(layouts, root, target_dir, capsys, monkeypatch):
    """The app checks each --head before serving: its layout and method at parse time, its fit to the target by
    loading the models (main returns 2 before the server starts); a good head passes both."""
    from types import SimpleNamespace

    from specviz.ui import launch, layout

    with pytest.raises(SystemExit):
        launch.parse_args(["--head", f"eagle={layouts['eagle3-safeailab'][1]}"])
    assert "holds the head of method 'eagle3'" in capsys.readouterr().err
    R.write(root / "not-a-head", {"model_type": "mystery"}, {"foo.weight": torch.zeros(2, 2)})
    with pytest.raises(SystemExit):
        launch.parse_args(["--head", f"eagle3={root / 'not-a-head'}"])
    assert "unknown head layout" in capsys.readouterr().err
    misfit = root / "e3-misfit"  # a SafeAILab layout whose fc reads two taps: detected, then refused at load
    W = R._eagle3_core("midlayer.", 0, 64)
    W["d2t"], W["t2d"] = R.reduced_vocab(0)
    W["fc.weight"] = torch.zeros(R.HIDDEN, 2 * R.HIDDEN)
    R.write(misfit, dict(R._llama_fields(draft_vocab_size=64)), W)
    launched, caches = [], []
    monkeypatch.setattr(layout, "build_app", lambda *a, cache, **k: caches.append(cache) or SimpleNamespace(
        launch=lambda **kw: launched.append(kw)))
    assert launch.main(["--target", str(target_dir), "--device", "cpu", "--head", f"eagle3={misfit}"]) == 2
    assert "fc reads 64 features" in capsys.readouterr().err and not launched
    assert launch.main(["--target", str(target_dir), "--device", "cpu", "--no-warm-up",
                        "--head", f"eagle3={layouts['eagle3-specforge'][1]}"]) == 0
    assert len(launched) == 1 and launched[0]["server_name"] == "127.0.0.1"
    # loaded to check the head's fit, but --no-warm-up still means no warm-up before the first run
    assert caches[-1].loaded() and not caches[-1].warmed.is_set()


def test_layout_shown_in_the_views(layouts, target_dir):
    """The trace's head record names the layout; the eagle3 view shows the source and the draft vocabulary
    mapping, the medusa and dflash views the source and layout."""
    from specviz.methods.dflash.view import dflash_html
    from specviz.methods.eagle.view import eagle_html
    from specviz.methods.medusa.view import medusa_html

    heads = {m: str(layouts[name][1]) for name, m in (("eagle3-safeailab", "eagle3"), ("medusa-vllm", "medusa"),
                                                       ("dflash-zlab", "dflash"))}
    dec = SpecDecoder.from_pretrained(target_dir, device="cpu", dtype="float32", heads=heads)
    for method, view, words in (("eagle3", eagle_html, ("eagle3-safeailab", "64 of 320", "d2t")),
                                ("medusa", medusa_html, ("medusa-vllm", "token_map")),
                                ("dflash", dflash_html, ("dflash-zlab", "z-lab"))):
        trace = dec.generate(PROMPT, method=method, num_speculative_tokens=3, max_new_tokens=6)
        step = next(i for i, st in enumerate(trace.steps) if st.draft_token_ids)
        html = view(trace.to_dict(), step)
        for word in words:
            assert word in html, (method, word)


def test_planted_dflash_ids_without_the_plus_one_fail(layouts, dec, monkeypatch):
    """z-lab's ids read as layer inputs (hidden_states[i], no + 1: the vLLM PR 40727 bug) draft differently."""
    from specviz.methods.dflash import formats as dflash_formats

    _, directory, _, reference = layouts["dflash-zlab"]
    real = dflash_formats.target_layer_ids
    monkeypatch.setattr(dflash_formats, "target_layer_ids",
                        lambda raw, n_draft, n_target: ([i - 1 for i in real(raw, n_draft, n_target)[0]], None))
    head = load_head_dir(directory, dec.target_model, "dflash")
    with with_head(dec, "dflash", head):
        assert mismatches(dec, "dflash", reference)[1]


def test_planted_medusa_token_map_ignored_fails(layouts, dec, monkeypatch):
    """vLLM's truncated LM heads read as the first V_trunc target ids (token_map ignored) draft differently."""
    from specviz.methods.medusa import formats as medusa_formats

    _, directory, _, reference = layouts["medusa-vllm"]
    monkeypatch.setattr(medusa_formats, "token_map_ids", lambda token_map, truncated: torch.arange(truncated))
    head = load_head_dir(directory, dec.target_model, "medusa")
    with with_head(dec, "medusa", head):
        assert mismatches(dec, "medusa", reference)[1]


def test_cli_and_app_take_head_method_dir(layouts, target_dir, capsys):
    """``--head METHOD=DIR`` (repeatable) in ``specviz generate`` and the app's options; a bad value is refused."""
    from helpers import cli_args

    from specviz.cli import main
    from specviz.cli_args import head_specs
    from specviz.ui.launch import parse_args

    e3, med = str(layouts["eagle3-specforge"][1]), str(layouts["medusa-vllm"][1])
    assert main(cli_args(target_dir, 3, "--method", "eagle3", "--head", f"eagle3={e3}", "--head", f"medusa={med}")) == 0
    assert "mean acceptance length" in capsys.readouterr().out
    assert parse_args(["--head", f"eagle3={e3}"]).heads == {"eagle3": e3}
    for bad in (["eagle3"], ["=x"], ["eagle3=a", "eagle3=b"]):
        with pytest.raises(ValueError, match="--head"):
            head_specs(bad)
    assert main(cli_args(target_dir, 3, "--method", "eagle3", "--head", "eagle3")) == 2
    assert "METHOD=DIR" in capsys.readouterr().err
    # both spellings for one method with two directories: refused, not one of them silently dropped
    assert main(cli_args(target_dir, 3, "--method", "eagle3", "--head", f"eagle3={e3}", "--eagle3-head", med)) == 2
    assert "gives method 'eagle3' twice" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--head", f"eagle3={e3}", "--eagle3-head", med])
    assert "twice" in capsys.readouterr().err
    assert parse_args(["--head", f"eagle3={e3}", "--eagle3-head", e3]).heads == {"eagle3": e3}  # the same twice: fine


# ---- specviz's own heads written in the published layouts ---------------------------------------------------
def _random_specviz_head(kind, target, seed, **kw):
    """A specviz head of ``kind`` on ``target`` with every parameter perturbed (norm weights away from 1,
    Medusa's zero-initialised ResBlocks non-zero), so that a dropped or misplaced tensor changes the drafts."""
    from specviz.methods.eagle.head import build_head
    from specviz.methods.eagle.config import head_config_from_target
    from specviz.methods.dflash.head import DFlashHead, dflash_config_from_target
    from specviz.methods.medusa.head import MedusaHead, medusa_config_from_target

    torch.manual_seed(seed)
    if kind == "medusa":
        head = MedusaHead(medusa_config_from_target(target.config, num_heads=3, **kw))
    elif kind == "dflash":
        head = DFlashHead(dflash_config_from_target(target.config, num_layers=2, block_size=4, **kw))
    else:
        head = build_head(head_config_from_target(target.config, kind, **kw))
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return head.attach(target).eval()


@pytest.mark.parametrize("kind,layout", [("eagle", "eagle-safeailab"), ("eagle3", "eagle3-speculators"),
                                         ("medusa", "medusa2-fasterdecoding"), ("dflash", "dflash-zlab")])
def test_specviz_heads_written_in_published_layouts_draft_the_same(dec, root, kind, layout):
    """save_published writes the field's layout (detected as such on reading), and the head read back drafts
    exactly what the original drafts at every step."""
    from specviz.heads.formats.export import save_published

    head = _random_specviz_head(kind, dec.target_model, seed=20)
    out = save_published(head, root / f"export-{kind}", dtype=torch.float32)
    assert out["layout"] == layout and formats.layout_of(root / f"export-{kind}") == layout
    back = load_head_dir(root / f"export-{kind}", dec.target_model, kind)
    runs = []
    for h in (head, back):
        with with_head(dec, kind, h):
            runs.append(dec.generate(PROMPT, method=kind, num_speculative_tokens=3, max_new_tokens=NEW))
    assert [s.draft_token_ids for s in runs[0].steps] == [s.draft_token_ids for s in runs[1].steps]
    assert sum(len(s.draft_token_ids) for s in runs[0].steps) >= 8


def test_exported_eagle3_matches_the_reference_and_merges_taps(dec, root):
    """An EAGLE-3 head with taps out of layer order and repeated is written with sorted, distinct taps (fc's
    blocks permuted and summed: exact); the file drafts what the public code's forward drafts."""
    from safetensors.torch import load_file

    from specviz.heads.formats.export import save_published

    head = _random_specviz_head("eagle3", dec.target_model, seed=21, aux_layer_ids=(5, 2, 5))
    save_published(head, root / "export-e3-taps", dtype=torch.float32)
    W = load_file(str(root / "export-e3-taps" / "model.safetensors"))
    assert W["fc.weight"].shape == (R.HIDDEN, 2 * R.HIDDEN)
    ref = R.EagleReference(W, dec.target_model, eagle3=True, taps=[2, 5], prefix="layers.0.", eps=1e-6,
                           base=R.TARGET_ROPE)  # specviz builds its heads with the target's RoPE
    with with_head(dec, "eagle3", head):
        assert not mismatches(dec, "eagle3", ref)[1]


def test_eagle1_export_refuses_a_rope_safeailab_would_read_differently(dec, root):
    """SafeAILab runs a linear / dynamic RoPE scaling at base 10000: a head scaled at another base cannot be written
    in that layout (it would read back at 10000 and draft differently); scaled at 10000 it round-trips."""
    import dataclasses

    from specviz.heads.formats.export import save_published
    from specviz.methods.eagle.config import head_config_from_target
    from specviz.methods.eagle.head import build_head

    tm = dec.target_model
    for theta, ok in ((500000.0, False), (10000.0, True)):
        rope = {"rope_type": "linear", "factor": 2.0, "rope_theta": theta}
        cfg = dataclasses.replace(head_config_from_target(tm.config, "eagle"), rope_parameters=rope)
        head = build_head(cfg).attach(tm).eval()
        if not ok:
            with pytest.raises(ValueError, match="at base 10000"):
                save_published(head, root / "export-e1-rope-bad", dtype=torch.float32)
            continue
        save_published(head, root / "export-e1-rope", dtype=torch.float32)
        back = load_head_dir(root / "export-e1-rope", tm, "eagle")
        assert back.config.rope_parameters == rope


def test_heads_faster_decoding_cannot_hold_are_written_in_vllms_layout(dec, root):
    """FasterDecoding repeats one ResBlock per head ([ResBlock(H)] * L): a head whose two ResBlocks differ goes to
    vLLM's layout (each layer its own weights, the target's LM head copied), which drafts the same when read back;
    with equal ResBlocks it stays FasterDecoding's."""
    from specviz.heads.formats.export import save_published

    medusa = _random_specviz_head("medusa", dec.target_model, seed=22, num_layers=2)
    assert save_published(medusa, root / "export-medusa-l2", dtype=torch.float32)["layout"] == "medusa-vllm"
    assert formats.layout_of(root / "export-medusa-l2") == "medusa-vllm"
    back = load_head_dir(root / "export-medusa-l2", dec.target_model, "medusa")
    runs = []
    for h in (medusa, back):
        with with_head(dec, "medusa", h):
            runs.append(dec.generate(PROMPT, method="medusa", num_speculative_tokens=3, max_new_tokens=NEW))
    assert [s.draft_token_ids for s in runs[0].steps] == [s.draft_token_ids for s in runs[1].steps]
    with torch.no_grad():
        for block in medusa.blocks:
            block[1].linear.load_state_dict(block[0].linear.state_dict())
    assert save_published(medusa, root / "export-medusa2")["layout"] == "medusa2-fasterdecoding"


def test_recipe_writes_the_published_layout_beside(tmp_path, dec):
    """The heads recipe saves specviz's format and, at OUT/published/NAME, the field's layout, which loads."""
    import dataclasses

    import specviz.train.heads as train_heads_mod

    target = dec.target_model
    w = torch.randint(0, target.config.vocab_size, (8, 17))
    cfg = dataclasses.replace(train_heads_mod.default_config("eagle3", smoke=True), steps=2, eval_windows=2)
    log = __import__('specviz.methods.eagle.train', fromlist=['x']).train_eagle3(target, w, w[:2], "cpu", tmp_path, config=cfg)
    pub = log["saved"]["published"]
    assert pub["layout"] == "eagle3-speculators" and pub["dir"] == str(tmp_path / "published" / "specviz-eagle3")
    assert load_head_dir(pub["dir"], target, "eagle3").source["format"] == "eagle3-speculators"


def test_reduced_vocabulary_head_in_trees_and_sampling(layouts, dec, plain):
    """An EAGLE-3 head with 64 draft tokens drives EAGLE-2 trees (greedy = plain greedy; every node a draft-vocabulary
    id) and sampled chains (q is zero off the draft vocabulary, so every drafted token is in it)."""
    _, directory, W, _ = layouts["eagle3-safeailab"]
    allowed = {i + int(W["d2t"][i]) for i in range(64)}
    head = load_head_dir(directory, dec.target_model, "eagle3")
    with with_head(dec, "eagle3", head):
        tree = dec.generate(PROMPT, method="eagle3", eagle_tree_top_k=3, eagle_tree_depth=2, eagle_tree_total_tokens=8,
                            max_new_tokens=NEW)
        sampled = dec.generate(PROMPT, method="eagle3", num_speculative_tokens=3, temperature=0.8, seed=1,
                               verify="standard", max_new_tokens=NEW)
    assert tree.output_token_ids == plain
    assert all(n.token_id in allowed for st in tree.steps for n in st.nodes)
    assert any(st.nodes for st in tree.steps)
    assert all(t in allowed for st in sampled.steps for t in st.draft_token_ids)
    assert len(sampled.output_token_ids) == NEW


def test_static_runner_drafts_as_the_eager_one(layouts, target_dir, dec, plain):
    """The static runner's head runners (slot cache, padded first passes) draft exactly as the eager ones with
    published heads (an EAGLE-3 with a reduced vocabulary, DFlash, vLLM Medusa)."""
    heads = {m: str(layouts[name][1]) for name, m in (("eagle3-speculators", "eagle3"), ("dflash-zlab", "dflash"),
                                                       ("medusa-vllm", "medusa"))}
    static = SpecDecoder.from_pretrained(target_dir, device="cpu", dtype="float32", runner="static", heads=heads)
    for method in heads:
        got = static.generate(PROMPT, method=method, num_speculative_tokens=3, max_new_tokens=NEW)
        assert got.output_token_ids == plain, method
        with with_head(dec, method, load_head_dir(heads[method], dec.target_model, method)):
            want = dec.generate(PROMPT, method=method, num_speculative_tokens=3, max_new_tokens=NEW)
        assert [s.draft_token_ids for s in got.steps] == [s.draft_token_ids for s in want.steps], method


def test_eagle1_without_fc_bias(root, dec):
    """A LLaMA-3-style SafeAILab head ("bias": false, no fc.bias) drafts as the reference; a config that says
    bias=true over a file without fc.bias is refused (SafeAILab would leave a random bias)."""
    tm = dec.target_model
    W = R.eagle1_safeailab(root / "e1-nobias", tm, seed=13, bias=False, pickle=False)
    head = load_head_dir(root / "e1-nobias", tm, "eagle")
    assert not head.config.fc_bias and head.fc.bias is None
    with with_head(dec, "eagle", head):
        assert not mismatches(dec, "eagle", R.EagleReference(W, tm, eagle3=False, prefix="layers.0."))[1]
    cfg = R._llama_fields(bias=True)
    R.write(root / "e1-bad-bias", cfg, W)
    with pytest.raises(ValueError, match="bias=True but the file has no fc.bias"):
        load_head_dir(root / "e1-bad-bias", tm, "eagle")


def test_a_copy_in_another_precision_is_recognised_and_a_changed_one_is_not():
    """same_weights: a file's copy of the target's weight in any of fp32 / bf16 / fp16 against a target in another
    (fp16 against bf16 included: both roundings of one fp32 weight, neither holding the other) is the target's; a
    copy that moved by a little is not."""
    from specviz.heads.formats.common import same_weights

    torch.manual_seed(0)
    w = torch.randn(256, 64)
    kinds = (torch.float32, torch.bfloat16, torch.float16)
    for file_dtype in kinds:
        for target_dtype in kinds:
            assert same_weights(w.to(file_dtype), w.to(target_dtype)), (file_dtype, target_dtype)
            assert not same_weights((w * 1.02).to(file_dtype), w.to(target_dtype)), (file_dtype, target_dtype)


def test_medusa_heads_inside_a_full_models_shards(layouts, root, target_dir, dec, plain, monkeypatch):
    """FasterDecoding's full-model checkpoints (``MedusaModelABC`` subclasses the base model) keep the Medusa-1 keys
    under ``medusa_head.`` among the model's sharded weights: the heads load without the model's tensors being read,
    draft as the reference does, and greedy output equals plain greedy."""
    import json

    from safetensors.torch import save_file

    from specviz.heads.formats import common

    _, _, W, reference = layouts["medusa1-fasterdecoding"]
    full = root / "medusa-full-model"
    full.mkdir()
    shards = {"model-00001-of-00002.safetensors": {k: v.detach().clone().contiguous()
                                                   for k, v in dec.target_model.state_dict().items()},
              "model-00002-of-00002.safetensors": {f"medusa_head.{k}": v for k, v in W.items()}}
    for name, tensors in shards.items():
        save_file(tensors, str(full / name))
    index = {"weight_map": {k: name for name, tensors in shards.items() for k in tensors}}
    (full / "model.safetensors.index.json").write_text(json.dumps(index))
    config = json.loads((target_dir / "config.json").read_text())
    (full / "config.json").write_text(json.dumps({**config, "medusa_num_heads": 3, "medusa_num_layers": 1}))
    monkeypatch.setattr(common, "load_file", lambda *a, **k: pytest.fail("read a whole shard of the model"))
    with_model = SpecDecoder.from_pretrained(target_dir, device="cpu", dtype="float32", heads={"medusa": str(full)})
    head = with_model.heads["medusa"]
    assert head.source["format"] == "medusa1-fasterdecoding" and "medusa_head." in head.source["embedded"]
    assert head.config.num_heads == 3 and head.config.lm_heads == "per_head"
    trace, bad = mismatches(with_model, "medusa", reference)
    assert not bad, bad
    assert trace.output_token_ids == plain


def test_dflash_fields_are_read_as_zlab_reads_them(root, dec):
    """z-lab's ``_draft_value`` reads ``dflash_config`` first, then the top level: ids and MASK id given at the top
    level are used (not the default ids); ``input_embedding_scale`` scales the block embeddings and
    ``output_multiplier`` / ``final_logit_softcapping`` transform the logits, as ``compute_logits`` does. Drafts and
    the block's logits equal the reference's."""
    tm = dec.target_model
    W = R.dflash_zlab(root / "dflash-top", seed=17, layer_ids=(0, 2, 6), layers=1, top_level=True)
    head = load_head_dir(root / "dflash-top", tm, "dflash")
    assert head.config.target_layer_ids == (0, 2, 6) and head.source["target_layer_ids_in_file"] == [0, 2, 6]
    with with_head(dec, "dflash", head):
        assert not mismatches(dec, "dflash", R.DFlashReference(W, tm, (0, 2, 6), 1, 4, 2, base=1e6, eps=1e-6))[1]
    fields = dict(input_embedding_scale=8.0, output_multiplier=0.5, final_logit_softcapping=3.0)
    W = R.dflash_zlab(root / "dflash-scaled", seed=18, layers=1, **fields)
    head = load_head_dir(root / "dflash-scaled", tm, "dflash")
    assert {k: head.source[k] for k in fields} == fields
    ref = R.DFlashReference(W, tm, (1, 5), 1, 4, 2, base=1e6, eps=1e-6, scale=8.0, multiplier=0.5, softcap=3.0)
    unscaled = R.DFlashReference(W, tm, (1, 5), 1, 4, 2, base=1e6, eps=1e-6)
    with with_head(dec, "dflash", head):
        trace, bad = mismatches(dec, "dflash", ref)
        assert not bad, bad
        assert mismatches(dec, "dflash", unscaled)[1], "the scale changed no draft: the test cannot tell"
    context = list(trace.prompt_token_ids)
    n = len(context) - 1
    hidden = tm.model(input_ids=torch.tensor([context[:n]]), output_hidden_states=True).hidden_states
    features = torch.cat([hidden[i + 1][0] for i in (1, 5)], dim=-1)
    with torch.no_grad():
        got = head(features, torch.arange(n), torch.tensor([context[n]] + [2] * 3), torch.arange(n, n + 4))[1:]
    torch.testing.assert_close(got, ref.logits(context), rtol=1e-4, atol=1e-4)
    assert float(got.abs().max()) <= 3.0
    embedding = tm.get_input_embeddings()
    scaled = type(embedding).forward  # a target whose embedding module scales its rows (Gemma's sqrt(H))
    with pytest.MonkeyPatch.context() as mp, torch.no_grad():
        mp.setattr(type(embedding), "forward", lambda self, ids: scaled(self, ids) * 8.0)
        again = head(features, torch.arange(n), torch.tensor([context[n]] + [2] * 3), torch.arange(n, n + 4))[1:]
    torch.testing.assert_close(again, got, rtol=0, atol=0)  # z-lab reads the raw rows, not the module's output
    from specviz.heads.formats.export import save_published

    save_published(head, root / "dflash-scaled-back", dtype=torch.float32)
    back = load_head_dir(root / "dflash-scaled-back", tm, "dflash")
    assert {k: getattr(back.config, k) for k in fields} == fields


def test_dflash_block_size_as_zlab_reads_it(root, dec):
    """block_size in dflash_config wins over the top level (``_draft_value``); absent from both, z-lab's 16."""
    import json

    W = R.dflash_zlab(root / "dflash-both", seed=21, block_size=6, layers=1)
    config = json.loads((root / "dflash-both" / "config.json").read_text())
    config["dflash_config"]["block_size"] = 5
    R.write(root / "dflash-both", config, W)
    head = load_head_dir(root / "dflash-both", dec.target_model, "dflash")
    assert head.config.block_size == 5 and head.source["block_size_in"] == "dflash_config"
    del config["dflash_config"]["block_size"], config["block_size"]
    R.write(root / "dflash-neither", config, W)
    head = load_head_dir(root / "dflash-neither", dec.target_model, "dflash")
    assert head.config.block_size == 16 and head.source["block_size_in"] == "default (z-lab's 16)"


def test_dflash2_is_refused_by_name(root, dec):
    """z-lab's DFlash2 (DFlashDraftModel's layers plus dynamic convolutions and a candidate selector) is not read as
    a DFlash drafter with extra tensors: the error names DFlash2, before any tensor is read."""
    import json

    from specviz.heads.formats import common

    W = R.dflash_zlab(root / "dflash2", seed=19, layers=1)
    config = json.loads((root / "dflash2" / "config.json").read_text())
    config["dflash_config"].update(selector_rank=4, selector_top_k=2, conv_kernel_size=2, conv_group_size=8)
    config.update(architectures=["DFlash2DraftModel"], layer_types=["sliding_attention"], use_sliding_window=True,
                  sliding_window=16)  # as z-lab's DFlash2 fixture: its layers are windowed too
    extra = {"candidate_selector.hidden_projection.weight": torch.zeros(4, R.HIDDEN),
             "layers.0.attention_conv.base_kernel": torch.zeros(2, 2, R.HIDDEN)}
    R.write(root / "dflash2-full", config, {**W, **extra})
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(common, "load_file", lambda *a, **k: pytest.fail("read the tensors of a drafter it refuses"))
        with pytest.raises(ValueError, match="DFlash2 drafter .* is not supported"):
            load_head_dir(root / "dflash2-full", dec.target_model, "dflash")


def test_a_head_for_another_tokenizer_says_so(layouts, dec, root):
    """A Medusa-1 head whose LM heads score another vocabulary, or an EAGLE-3 head whose config names one, is refused
    with the reason (another tokenizer) and what to do, not a list of tensor shapes."""
    import json

    _, _, W, _ = layouts["medusa1-fasterdecoding"]
    R.write(root / "medusa1-other-vocab", {"medusa_num_heads": 3, "medusa_num_layers": 1},
            {k: v[:-8] if k.endswith(".1.weight") else v for k, v in W.items()})
    with pytest.raises(ValueError, match=f"score {R.VOCAB - 8} tokens.*has {R.VOCAB}.*another tokenizer.*trained for"):
        load_head_dir(root / "medusa1-other-vocab", dec.target_model, "medusa")
    _, directory, W, _ = layouts["eagle3-safeailab"]
    config = json.loads((directory / "config.json").read_text())
    R.write(root / "e3-other-vocab", {**config, "vocab_size": R.VOCAB + 8}, W)
    with pytest.raises(ValueError, match="vocab_size .* != the target's .*another tokenizer.*trained for"):
        load_head_dir(root / "e3-other-vocab", dec.target_model, "eagle3")


def test_layout_errors_name_the_cause(root, dec):
    """Files that disagree with their config get errors that name the cause: a norm tensor without its flag, a tap
    named twice, no draft_vocab_size where the lm_head has another row count."""
    import json

    tm = dec.target_model
    R.eagle3_speculators(root / "e3-flag", tm, seed=14, norm_before_fc=True)
    cfg = json.loads((root / "e3-flag" / "config.json").read_text())
    cfg.pop("norm_before_fc")
    (root / "e3-flag" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match='has input_norm.weight but norm_before_fc is False: set "norm_before_fc"'):
        load_head_dir(root / "e3-flag", tm, "eagle3")
    R.eagle3_speculators(root / "e3-twice", tm, seed=15, layer_ids=(2, 2, 5))
    with pytest.raises(ValueError, match=r"the taps \[2, 2, 5\] name one target layer twice"):
        load_head_dir(root / "e3-twice", tm, "eagle3")
    R.eagle3_speculators(root / "e3-vocab", tm, seed=16)
    cfg = json.loads((root / "e3-vocab" / "config.json").read_text())
    cfg.pop("draft_vocab_size", None)
    (root / "e3-vocab" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="no draft_vocab_size in config.json"):
        load_head_dir(root / "e3-vocab", tm, "eagle3")
