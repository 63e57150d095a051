"""Hidden-state dumps (vLLM extract_hidden_states counterpart): layout, taps, windows, the CLI, and
that a dump gives exactly the features a head's first pass reads."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from tiny_models import save_model

from specviz.methods.eagle.config import head_config_from_target
from specviz.methods.eagle.features import target_features
from specviz.methods.eagle.extract import (
    extract_hidden_states,
    features_from_dump,
    load_hidden_states,
    main,
    parse_layers,
    save_hidden_states,
)
from specviz.models import load_model
from specviz.trace import Trace


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    return save_model("llama", tmp_path_factory.mktemp("x") / "t8", seed=0, layers=8, hidden=64)


@pytest.fixture(scope="module")
def target(target_dir):
    return load_model(target_dir, torch.device("cpu"), torch.float32)


def test_taps_layout_and_round_trip(target, tmp_path):
    ids = torch.randint(0, target.config.vocab_size, (20,))
    layers = parse_layers("final,2,4,5", target.config.num_hidden_layers)
    hs = extract_hidden_states(target, ids, layers)
    assert hs.shape == (20, 4, target.config.hidden_size)  # [token, tap, hidden]
    with torch.no_grad():
        out = target.model(input_ids=ids[None], output_hidden_states=True)
    assert torch.equal(hs[:, 0], out.last_hidden_state[0])
    for j, l in enumerate((2, 4, 5), start=1):
        assert torch.equal(hs[:, j], out.hidden_states[l][0])
    f = tmp_path / "d.safetensors"
    save_hidden_states(f, ids, hs, layers, target_name="t8")
    ids2, hs2, layers2 = load_hidden_states(f)
    assert torch.equal(ids2, ids) and torch.equal(hs2, hs) and layers2 == layers
    with safe_open(str(f), "pt") as fh:
        assert fh.metadata()["dim_order"] == "token,tap,hidden"


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_dump_gives_the_heads_features(target, kind):
    cfg = head_config_from_target(target.config, kind)
    ids = torch.randint(0, target.config.vocab_size, (15,))
    layers = ["final", 5, 2, 4]  # any order: features_from_dump reorders to aux_layer_ids
    hs = extract_hidden_states(target, ids, layers)
    with torch.no_grad():
        want = target_features(target, ids[None], cfg).features[0]
    assert torch.equal(features_from_dump(hs, layers, cfg), want)
    with pytest.raises(ValueError, match="missing"):
        features_from_dump(hs[:, :1], ["final"], head_config_from_target(target.config, "eagle3"))


def test_long_text_is_cut_into_context_windows(target):
    ctx = target.config.max_position_embeddings
    ids = torch.randint(0, target.config.vocab_size, (ctx + 7,))
    hs = extract_hidden_states(target, ids, ["final"])
    assert hs.shape[0] == ctx + 7
    tail = extract_hidden_states(target, ids[ctx:], ["final"])
    assert torch.equal(hs[ctx:], tail)  # the second window starts a fresh context


def test_bad_layers():
    with pytest.raises(ValueError, match="out of range"):
        parse_layers("final,8", 8)
    with pytest.raises(ValueError, match="'final'"):
        parse_layers("last", 8)
    with pytest.raises(ValueError, match="out of range"):
        parse_layers([-1], 8)


def test_cli_text_file_and_trace(target_dir, target, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("def add(a, b):\n    return a + b\n")
    out = tmp_path / "a.safetensors"
    s = main(["--target", str(target_dir), "--text-file", str(text), "--layers", "final,2,4", "--out", str(out)])
    ids, hs, layers = load_hidden_states(out)
    from specviz.models import load_tokenizer

    want = load_tokenizer(target_dir)(text.read_text(), add_special_tokens=True)["input_ids"]  # as the engine encodes
    assert ids.tolist() == want and layers == ["final", 2, 4] and hs.shape == (len(want), 3, 64)
    tr = Trace(config={}, prompt_token_ids=[0, 5, 6, 7], output_token_ids=[8, 9])
    (tmp_path / "run.json").write_text(tr.to_json())
    main(["--target", str(target_dir), "--trace", str(tmp_path / "run.json"), "--layers", "3", "--out", str(out)])
    ids, hs, _ = load_hidden_states(out)
    assert ids.tolist() == [0, 5, 6, 7, 8, 9] and hs.shape == (6, 1, 64)
    assert torch.equal(hs[:, 0], extract_hidden_states(target, ids, [3])[:, 0])
