"""DFlash training (docs/design/methods.md 6.2): anchors, the strict < anchor context mask, the label alignment and
weights, training forward == inference forward per block, and a smoke run through the CLI."""

from __future__ import annotations

import json
import math

import pytest
import torch
from tiny_models import build_model, save_model

from specviz.methods.dflash.head import DFlashCache, DFlashHead, dflash_config_from_target, load_dflash
from specviz.methods.dflash import train as tdf
from specviz.train import heads as train_heads_mod
from specviz.train import heads_cli

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: one intra-op thread


def test_anchors_are_distinct_sorted_and_leave_room_for_a_block():
    gen = torch.Generator().manual_seed(0)
    T, B = 40, 8
    a = tdf.sample_anchors(64, T, 20, B, gen, "cpu")
    assert a.shape == (64, 20)
    assert bool((a[:, 1:] > a[:, :-1]).all())  # sorted and distinct
    assert int(a.min()) >= 1 and int(a.max()) <= T - B + 1  # context non-empty; labels a+k <= T exist
    assert int(a.min()) == 1 and int(a.max()) == T - B + 1  # both ends are reachable
    with pytest.raises(ValueError, match="anchors need windows"):
        tdf.sample_anchors(1, 10, 5, 8, gen, "cpu")


def test_block_inputs_and_mask():
    """Block b = [x_a, MASK x (B-1)] at positions a..a+B-1; it sees context keys j < a (strict) and
    only its own block's keys."""
    ids = (100 + torch.arange(21))[None]  # x_i = 100 + i, T = 20
    anchors = torch.tensor([[3, 9]])
    B, mask_id = 4, 1
    blk, pos = tdf.block_inputs(ids, anchors, B, mask_id)
    assert blk.tolist() == [[103, 1, 1, 1, 109, 1, 1, 1]]
    assert pos.tolist() == [[3, 4, 5, 6, 9, 10, 11, 12]]
    m = tdf.block_mask(anchors, 20, B)[0, 0]  # [8, 28]
    assert m.shape == (8, 28)
    assert m[:4, :20].sum(1).tolist() == [3] * 4 and bool(m[:4, :3].all())  # j < 3 only (not j = 3)
    assert m[4:, :20].sum(1).tolist() == [9] * 4 and not bool(m[4:, 9:20].any())
    assert bool(m[:4, 20:24].all()) and not bool(m[:4, 24:].any())  # own block, bidirectional
    assert bool(m[4:, 24:].all()) and not bool(m[4:, 20:24].any())


def test_labels_are_the_targets_distribution_at_the_previous_position():
    """Slot k of anchor a is scored against z_{a+k-1} (the target's distribution of x_{a+k}), with
    MASK's probability removed; the loss weights are exp(-(k-1)/gamma), normalised."""
    torch.manual_seed(0)
    target = build_model("llama", seed=0, layers=2, hidden=32).float()
    final = torch.randn(1, 20, 32)
    anchors = torch.tensor([[2, 7]])
    z = tdf.label_logits(target, final, anchors, 4, mask_id=1)  # [1, 2, 3, V]
    want = target.lm_head(final[0, [2, 3, 4, 7, 8, 9]]).view(2, 3, -1)
    assert torch.isinf(z[..., 1]).all()
    keep = torch.arange(z.shape[-1]) != 1
    torch.testing.assert_close(z[0][..., keep], want[..., keep])


class SlotHead(torch.nn.Module):
    """A stub with the head's call signature: logits = one-hot(label of slot) * scale, so the
    per-slot loss is known. Slot k of a block at positions a.. predicts the label of position a+k-1."""

    def __init__(self, config, labels, wrong_slot=None):
        super().__init__()
        self.config, self.labels, self.wrong_slot = config, labels, wrong_slot
        self.w = torch.nn.Parameter(torch.zeros(()))
        self.calls = []

    def forward(self, features, ctx_pos, blk, pos, cache=None, attention_mask=None):
        self.calls.append(dict(features=features, blk=blk, pos=pos, mask=attention_mask))
        V = self.config.vocab_size
        slot = torch.arange(blk.shape[1]) % 8
        lab = self.labels[0, (pos[0] - 1).clamp(min=0)]  # [Q]
        if self.wrong_slot is not None:
            lab = torch.where(slot == self.wrong_slot, (lab + 1) % V, lab)
        return torch.nn.functional.one_hot(lab, V).float()[None] * 30 + self.w


def test_loss_weights_slots_and_agreement():
    target = build_model("llama", seed=0, layers=4, hidden=32).float()
    hc = dflash_config_from_target(target.config, num_layers=1, block_size=8)
    ids = torch.randint(2, 300, (1, 41))
    cfg = tdf.DFlashTrainConfig(num_anchors=4, block_size=8, gamma=4.0)
    taps = tdf.target_taps(target, ids[:, :40], hc.target_layer_ids)
    z = target.lm_head(taps[1])
    z[..., hc.mask_token_id] = float("-inf")
    labels = z.argmax(-1)  # [1, 40]: the target's argmax (MASK removed) at each position
    head = SlotHead(hc, labels, wrong_slot=3)
    loss, st = tdf.dflash_loss(head, target, ids, cfg, torch.Generator().manual_seed(0), taps=taps)
    assert st["top1"].tolist() == [1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0]  # slot 3 (index 2) is wrong
    assert st["chain"].tolist() == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    w = torch.tensor([math.exp(-k / 4.0) for k in range(7)])
    torch.testing.assert_close(loss, (w * st["ce"]).sum() / w.sum())
    anchors = tdf.sample_anchors(1, 40, 4, 8, torch.Generator().manual_seed(0), "cpu")[0]  # the same draw
    from specviz.heads.common import soft_cross_entropy

    for j in range(7):  # slot j+1 of anchor a: the stub's logits against z_{a+j}
        lab = labels[0, anchors + j]
        if j == 2:
            lab = (lab + 1) % hc.vocab_size
        want = soft_cross_entropy(torch.nn.functional.one_hot(lab, hc.vocab_size).float() * 30, z[0, anchors + j])
        torch.testing.assert_close(st["ce"][j], want.mean())
    (call,) = head.calls
    assert call["features"].shape == (1, 40, hc.feature_size)


def test_training_forward_equals_inference_per_block():
    """Several blocks in one masked training forward give, per block, exactly the logits of the
    inference path: a cache filled with the context positions < a, then the block at a..a+B-1."""
    target = build_model("llama", seed=1, layers=4, hidden=32).float()
    torch.manual_seed(2)
    hc = dflash_config_from_target(target.config, num_layers=2, block_size=8)
    head = DFlashHead(hc, target).eval()
    ids = torch.randint(2, 300, (2, 41))
    feats, _ = tdf.target_taps(target, ids[:, :40], hc.target_layer_ids)
    anchors = torch.tensor([[1, 12, 33], [5, 6, 20]])
    blk, pos = tdf.block_inputs(ids, anchors, 8, hc.mask_token_id)
    with torch.no_grad():
        lg = head(feats, torch.arange(40).expand(2, 40), blk, pos, None,
                  attention_mask=tdf.block_mask(anchors, 40, 8)).view(2, 3, 8, -1)
        for w in range(2):
            for b, a in enumerate(anchors[w].tolist()):
                cache = DFlashCache()
                half = a // 2  # the context arrives in two parts, as across engine steps
                head(feats[w, :half], torch.arange(half), blk[w, :8], pos[w, :8], cache) if half else None
                ref = head(feats[w, half:a], torch.arange(half, a), blk[w, b * 8:(b + 1) * 8],
                           pos[w, b * 8:(b + 1) * 8], cache)
                assert cache.length == a
                torch.testing.assert_close(ref, lg[w, b], rtol=1e-4, atol=1e-5)


def test_smoke_cli_trains_saves_and_reports_heldout_acceptance(tmp_path):
    """``specviz train heads --kinds dflash --smoke``: the loss falls, per-slot held-out
    agreement is logged, the saved head loads and drafts, and the held-out greedy mean acceptance
    length is computed by real decoding (outputs equal method none's)."""
    target_dir = save_model("llama", tmp_path / "target", seed=0, layers=8, hidden=64)
    logs = heads_cli.main(["--target", str(target_dir), "--out", str(tmp_path / "out"), "--smoke",
                                 "--device", "cpu", "--kinds", "dflash", "--mal-prompts", "2",
                                 "--mal-new-tokens", "12"])
    log = logs["dflash"]
    cfg = train_heads_mod.default_config("dflash", smoke=True)
    assert log["steps"] == cfg.steps and not log["stopped_early"]
    assert log["train"][-1]["loss"] < 0.97 * log["train"][0]["loss"]
    assert len(log["heldout"][-1]["top1"]) == cfg.block_size - 1
    saved = json.loads((tmp_path / "out" / "specviz-dflash" / "train_log.json").read_text())
    acc = saved["heldout_acceptance"]
    run = acc["methods"]["dflash"]
    assert acc["settings"]["k"] == 7 and acc["outputs_differ"] == 0
    assert run["num_drafts"] > 0 and run["mean_acceptance_length"] >= 1.0
    assert log["saved"]["bytes"] < 4e6
    from specviz.models import load_model

    head = load_dflash(tmp_path / "out" / "specviz-dflash", load_model(target_dir, torch.device("cpu"), torch.float32))
    assert head.config.block_size == 8 and head.config.mask_token_id == 1


def test_init_from_target_copies_the_chosen_layers_and_the_final_norm():
    """``init_from_target``: "last" copies the target's last L_d decoder layers, "first" its first; the
    drafter's q/k norms stay at 1; the copy is a real copy (training the head leaves the target alone)."""
    target = build_model("llama", seed=1, layers=4, hidden=32).float()
    hc = dflash_config_from_target(target.config, num_layers=2, block_size=8)
    for which, want in (("last", [2, 3]), ("first", [0, 1])):
        head = DFlashHead(hc)
        assert tdf.init_from_target(head, target, which) == want
        for mine, i in zip(head.layers, want):
            src = target.model.layers[i]
            assert torch.equal(mine.q_proj.weight, src.self_attn.q_proj.weight)
            assert torch.equal(mine.mlp.down_proj.weight, src.mlp.down_proj.weight)
            assert torch.equal(mine.post_attention_layernorm.weight, src.post_attention_layernorm.weight)
            assert torch.equal(mine.k_norm.weight, torch.ones_like(mine.k_norm.weight))
        assert torch.equal(head.norm.weight, target.model.norm.weight)
        with torch.no_grad():
            head.layers[0].q_proj.weight.add_(1.0)
        assert not torch.equal(head.layers[0].q_proj.weight, target.model.layers[want[0]].self_attn.q_proj.weight)
    with pytest.raises(ValueError, match="'last' or 'first'"):
        tdf.init_from_target(DFlashHead(hc), target, "middle")


def test_cli_set_overrides_replace_config_fields_and_refuse_unknown_ones():
    got = train_heads_mod.parse_overrides(["dflash.num_layers=3", "dflash.init_from_target=last",
                                           "medusa.head_layers=2", "dflash.target_layer_ids=[1, 9, 17]"])
    assert got == {"dflash": {"num_layers": 3, "init_from_target": "last", "target_layer_ids": (1, 9, 17)},
                   "medusa": {"head_layers": 2}}
    cfg = train_heads_mod._with_overrides(tdf.DFLASH_DEFAULT, got["dflash"])
    assert (cfg.num_layers, cfg.init_from_target, cfg.batch_size) == (3, "last", tdf.DFLASH_DEFAULT.batch_size)
    with pytest.raises(ValueError, match="KIND.FIELD=VALUE"):
        train_heads_mod.parse_overrides(["num_layers=3"])
    with pytest.raises(ValueError, match="unknown config fields"):
        train_heads_mod._with_overrides(tdf.DFLASH_DEFAULT, {"layers": 3})
    target = build_model("llama", seed=0, layers=4, hidden=32).float()
    w = torch.randint(0, target.config.vocab_size, (4, 33))
    with pytest.raises(ValueError, match="not being trained"):
        train_heads_mod.train_heads(target, w, w, "cpu", "/nonexistent", heads=["dflash"], smoke=True,
                                    overrides={"medusa": {"head_layers": 2}})


class _Clock:
    """A fake ``time`` module: every ``time()`` call advances 10 ms, so a time budget ends a run after the same
    steps on a quiet or a loaded machine (with the real clock, one slow step under load left the last lr above
    the annealed bound)."""

    def __init__(self):
        self.now = 0.0

    def time(self) -> float:
        self.now += 0.01
        return self.now


def test_time_budget_stops_early(monkeypatch):
    target = build_model("llama", seed=0, layers=4, hidden=32).float()
    w = torch.randint(0, target.config.vocab_size, (16, 33))
    import dataclasses

    cfg = dataclasses.replace(tdf.DFLASH_SMOKE, steps=10_000, eval_windows=2, num_anchors=4)
    monkeypatch.setattr(tdf, "time", _Clock())
    _, log = tdf.fit_dflash(target, w, w[:2], "cpu", cfg, time_budget_s=1.0)
    assert log["stopped_early"] and log["steps"] < cfg.steps and log["heldout"]
    assert log["train"][-1]["lr"] < 0.2 * cfg.lr  # the time-aware cosine annealed anyway


@pytest.mark.gpu
def test_cuda_training_steps():
    """bf16 autocast on CUDA: a few steps (fused AdamW, device generator, masked SDPA) stay finite."""
    import dataclasses

    dev = torch.device("cuda")
    target = build_model("llama", seed=0, layers=8, hidden=64).float().to(dev)
    for p in target.parameters():
        p.requires_grad_(False)
    w = torch.randint(0, target.config.vocab_size, (32, 65), device=dev)
    cfg = dataclasses.replace(tdf.DFLASH_SMOKE, steps=6, eval_every=3, log_every=3)
    _, log = tdf.fit_dflash(target, w, w[:8], dev, cfg)
    assert all(math.isfinite(r["loss"]) for r in log["train"]) and log["heldout"]
