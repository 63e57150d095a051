"""Head trainers: the (feature index, token, position, label position) pairing of docs/design/methods.md 1.1 /
2.3 / 4.3 proven with a recording stub head, and a smoke training run through the CLI."""

from __future__ import annotations

import json

import pytest
import torch
from tiny_models import save_model

from specviz.heads import load_head
from specviz.methods.eagle.features import TargetFeatures
from specviz.methods.eagle.losses import agreement, eagle1_loss, eagle3_loss
from specviz.train import heads as train_heads_mod
from specviz.train import heads_cli

B, T, D, V = 2, 12, 4, 160
TOK0, LAB0 = 10, 100  # x_i = TOK0 + i; the target's argmax at position p is LAB0 + p + 1 (predicts x_{p+1})


class _Cfg:
    def __init__(self, kind):
        self.kind, self.hidden_size = kind, D
        self.feature_size = 3 * D if kind == "eagle3" else D


class RecordingHead(torch.nn.Module):
    """Records every call; returns hidden = features + 1 (first D dims) and logits peaked at
    LAB0 + position + 2 + shift = the target's argmax at the next position (position + 1) when
    shift = 0: what a row at position p must predict (x_{p+2})."""

    def __init__(self, kind, shift=0):
        super().__init__()
        self.config, self.shift, self.calls = _Cfg(kind), shift, []
        self.w = torch.nn.Parameter(torch.zeros(()))

    def forward(self, features, input_ids, position_ids, cache=None, *, from_target, attention_mask=None):
        self.calls.append(dict(features=features.detach().clone(), ids=input_ids.clone(), pos=position_ids.clone(),
                               from_target=from_target))
        hidden = features[..., :D] + 1 + self.w
        logits = torch.nn.functional.one_hot(LAB0 + position_ids + 2 + self.shift, V).float() * 30 + self.w
        return hidden, logits


def _batch(kind):
    ids = (TOK0 + torch.arange(T + 1)).expand(B, T + 1)  # x_0..x_T
    t = torch.arange(T, dtype=torch.float32)
    final = t.view(1, T, 1).expand(B, T, D).clone()  # f_t = t
    feats = final.repeat(1, 1, 3) if kind == "eagle3" else final
    logits = torch.nn.functional.one_hot(LAB0 + torch.arange(T) + 1, V).float().expand(B, T, V) * 30
    return ids, TargetFeatures(final=final, features=feats, logits=logits)


def test_eagle1_pairing_and_labels():
    """Row t reads (f_t, x_{t+1}) at position t; it is regressed onto f_{t+1} and scored against the
    target's distribution at position t+1."""
    ids, tf = _batch("eagle")
    head = RecordingHead("eagle")
    loss, stats = eagle1_loss(head, tf, ids, noise=0.0)
    (call,) = head.calls
    rows = torch.arange(T - 1)
    assert call["from_target"]
    assert torch.equal(call["features"][0, :, 0], rows.float())  # feature index t
    assert torch.equal(call["ids"][0], TOK0 + rows + 1)  # token x_{t+1}
    assert torch.equal(call["pos"][0], rows)  # position t
    assert stats["reg"] == 0  # hidden = f_t + 1 = f_{t+1}: the regression target is f_{t+1}
    assert stats["top1"] == 1
    _, off = eagle1_loss(RecordingHead("eagle", shift=1), tf, ids, noise=0.0)
    assert off["top1"] == 0


def test_eagle1_noise_scaled_to_feature_rms():
    ids, tf = _batch("eagle")
    head = RecordingHead("eagle")
    eagle1_loss(head, tf, ids, noise=0.1, generator=torch.Generator().manual_seed(0))
    delta = head.calls[0]["features"] - tf.final[:, :-1]
    rms = tf.final[:, :-1].pow(2).mean().sqrt()
    assert 0 < delta.abs().max() <= 0.1 * rms + 1e-6
    assert delta.abs().max() > 0.05 * rms  # uniform over (-a, a), not a constant


@pytest.mark.parametrize("steps", [3, 5])
def test_eagle3_ttt_pairing_and_label_positions(steps):
    """Step s, row t reads x_{t+1+s} at position t+s (step 0: target features g_t through fc; later
    steps: the previous step's output) and is scored at the LABEL position t+1+s; rows whose label
    lies past the window are dropped."""
    ids, tf = _batch("eagle3")
    head = RecordingHead("eagle3")
    loss, stats = eagle3_loss(head, tf, ids, steps)
    assert len(head.calls) == steps
    rows = torch.arange(T)
    for s, call in enumerate(head.calls):
        assert call["from_target"] == (s == 0)
        assert torch.equal(call["pos"][0], rows + s)
        valid = T - 1 - s
        assert torch.equal(call["ids"][0, :valid], TOK0 + rows[:valid] + 1 + s)
        want = rows.float() + s  # f_t at step 0, then +1 per step (the stub's fed-back hidden)
        assert torch.equal(call["features"][0, :, 0], want)
    assert torch.equal(stats["top1"], torch.ones(steps))
    agr = agreement(head, tf, ids, steps)
    assert torch.equal(agr["chain"], torch.ones(steps))
    off = agreement(RecordingHead("eagle3", shift=1), tf, ids, steps)
    assert torch.equal(off["top1"], torch.zeros(steps))
    weights = torch.tensor([0.8**s for s in range(steps)])
    assert torch.allclose(loss, (weights * stats["ce"]).sum())


def test_eagle3_rejects_windows_too_short():
    ids, tf = _batch("eagle3")
    with pytest.raises(ValueError, match="unrolled steps"):
        eagle3_loss(RecordingHead("eagle3"), tf, ids, steps=T)


def test_unknown_head_name():
    with pytest.raises(ValueError, match="unknown heads"):
        train_heads_mod.train_heads(torch.nn.Linear(2, 2), None, None, "cpu", "/tmp", heads=["nonesuch"])


def test_smoke_cli_trains_reduces_loss_and_saves(tmp_path, one_thread_per_test):
    """``python -m specviz.train.heads --smoke`` on a tiny 8-layer target: both heads' training loss
    falls, held-out agreement is logged per unrolled step, and the saved heads load and run."""
    target_dir = save_model("llama", tmp_path / "target", seed=0, layers=8, hidden=64)
    logs = heads_cli.main(["--target", str(target_dir), "--out", str(tmp_path / "out"), "--smoke",
                                 "--device", "cpu"])
    from specviz.models import load_model

    target = load_model(target_dir, torch.device("cpu"), torch.float32)
    for name, sub in (("eagle", "specviz-eagle"), ("eagle3", "specviz-eagle3")):
        log = logs[name]
        cfg = train_heads_mod.default_config(name, smoke=True)
        assert log["steps"] == cfg.steps and not log["stopped_early"]
        first, last = log["train"][0]["loss"], log["train"][-1]["loss"]
        assert last < 0.97 * first, (name, first, last)
        assert len(log["heldout"][-1]["top1"]) == cfg.ttt_steps
        saved = json.loads((tmp_path / "out" / sub / "train_log.json").read_text())
        assert saved["steps"] == log["steps"]
        head = load_head(tmp_path / "out" / sub, target)
        ids = torch.randint(0, target.config.vocab_size, (1, 5))
        from specviz.methods.eagle.features import target_features

        feats = target_features(target, ids, head.config).features
        _, logits = head(feats, ids, torch.arange(5)[None], from_target=True)
        assert torch.isfinite(logits).all()


def test_time_budget_stops_early(tmp_path, one_thread_per_test):
    from tiny_models import build_model

    target = build_model("llama", seed=0, layers=8, hidden=64).float()
    w = torch.randint(0, target.config.vocab_size, (16, 17))
    import dataclasses

    cfg = dataclasses.replace(train_heads_mod.default_config("eagle", smoke=True), steps=10_000, eval_windows=2)
    head, log = train_heads_mod.fit_head("eagle", target, w, w[:2], "cpu", cfg, time_budget_s=1.0)
    assert log["stopped_early"] and log["steps"] < cfg.steps and log["heldout"]


def test_batch_indices_follow_the_lm_batch_order():
    import dataclasses

    from specviz.train.data import BatchOrder

    cfg = dataclasses.replace(train_heads_mod.default_config("eagle"), steps=50, batch_size=7, seed=3)
    idx = train_heads_mod._batch_indices(23, cfg)  # 23 windows: batches straddle epochs
    order = BatchOrder(23, 7, 3)
    assert torch.equal(idx, torch.stack([order.indices(s) for s in range(50)]))


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_cuda_training_steps_and_ttt_equals_chain(kind):
    """On CUDA: a few bf16-autocast training steps run (fused AdamW, device generator, masked SDPA)
    and reduce nothing to NaN; in fp32 the TTT logits still equal the chain's."""
    import dataclasses

    from tiny_models import build_model

    from specviz.methods.eagle.head import build_head
    from specviz.methods.eagle.config import head_config_from_target
    from specviz.methods.eagle.features import target_features
    from specviz.methods.eagle.chain import chain_logits
    from specviz.methods.eagle.ttt import unroll

    dev = torch.device("cuda")
    target = build_model("llama", seed=0, layers=8, hidden=64).float().to(dev)
    for p in target.parameters():
        p.requires_grad_(False)
    w = torch.randint(0, target.config.vocab_size, (32, 65), device=dev)
    cfg = dataclasses.replace(train_heads_mod.default_config(kind, smoke=True), steps=6, eval_every=3, log_every=3)
    head, log = train_heads_mod.fit_head(kind, target, w, w[:8], dev, cfg)
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in log["train"])
    head = build_head(head_config_from_target(target.config, kind), target).to(dev).eval()
    T, S = 16, 4
    x = torch.randint(0, target.config.vocab_size, (1, T + S + 1), device=dev)
    with torch.no_grad():
        feats = target_features(target, x[:, :T], head.config).features
        steps = unroll(head, feats, x[:, 1 : T + S + 1], torch.arange(T, device=dev)[None], S)
    for t in (0, T // 2, T - 1):
        _, chain = chain_logits(head, feats[0, : t + 1], x[0, : t + 2], S, forced=x[0, t + 2 : t + 1 + S])
        for s in range(S):
            assert torch.allclose(steps[s][1][0, t], chain[s], atol=1e-3, rtol=1e-3), (t, s)


def test_python_m_specviz_train_heads_reaches_the_heads_cli(monkeypatch, capsys):
    """`python -m specviz.train heads ...` (sys.argv, no argv passed) reaches the heads CLI, not the recipe's parser."""
    from specviz.train.__main__ import main

    monkeypatch.setattr("sys.argv", ["python -m specviz.train", "heads", "--help"])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 0
    assert "specviz train heads" in capsys.readouterr().out
