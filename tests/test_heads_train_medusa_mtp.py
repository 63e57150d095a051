"""Trainers of the medusa and mtp heads: the label alignment of the MTP unroll (constant
position, data tokens, labels at t+1+s), and a smoke run of ``specviz train heads --kinds
medusa,mtp`` on a tiny target that trains, saves, loads, and measures held-out acceptance through
the engine next to the other methods."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from tiny_models import save_model

from specviz.heads import load_head
from specviz.methods.mtp.head import mtp_agreement, mtp_loss
from specviz.train import heads as train_heads_mod
from specviz.train import heads_cli

B, T, D, V = 2, 10, 4, 64
TOK0, LAB0 = 3, 30  # x_i = TOK0 + i; the target's argmax at position p is LAB0 + p + 1


class RecordingMtp(torch.nn.Module):
    """Records each call; h_out = h_in + 1; logits peaked at LAB0 + position + 2 + step (what step s of a
    row at position t must predict: the target's argmax at t+1+s), so top-1 agreement is 1 iff the
    trainer pairs step s of row t with the label at t+1+s."""

    def __init__(self, shift: int = 0):
        super().__init__()
        self.shift, self.calls = shift, []
        self.w = torch.nn.Parameter(torch.zeros(()))

    def forward(self, h_in, token_ids, position_ids, keys, values, key_mask=None):
        s = len(self.calls)
        self.calls.append(dict(h=h_in.detach().clone(), ids=token_ids.clone(), pos=position_ids.clone(),
                               keys=keys, mask=key_mask))
        logits = torch.nn.functional.one_hot(LAB0 + position_ids + 2 + s + self.shift, V).float() * 30 + self.w
        return h_in + 1 + self.w, logits


def test_mtp_unroll_constant_position_and_labels():
    """Step s: every row t stays at position t, reads x_{t+1+s} and (s > 0) the previous step's output,
    attends to keys <= t of the target's K/V, and is scored against the target at t+1+s."""
    ids = (TOK0 + torch.arange(T + 1)).expand(B, T + 1)
    final = torch.arange(T, dtype=torch.float32).view(1, T, 1).expand(B, T, D).clone()
    z = torch.nn.functional.one_hot(LAB0 + torch.arange(T) + 1, V).float().expand(B, T, V) * 30
    keys = torch.randn(B, 1, T, 8)
    head = RecordingMtp()
    loss, stats = mtp_loss(head, final, z, keys, keys, ids, steps=4)
    rows = torch.arange(T)
    for s, call in enumerate(head.calls):
        assert torch.equal(call["pos"][0], rows)  # constant position
        valid = T - 1 - s
        assert torch.equal(call["ids"][0, :valid], TOK0 + rows[:valid] + 1 + s)
        assert torch.equal(call["h"][0, :, 0], rows.float() + s)  # f_t, then the fed-back output
        assert call["keys"] is keys
        assert torch.equal(call["mask"][0, 0], rows[None, :] <= rows[:, None])  # keys <= t only
    assert torch.equal(stats["top1"], torch.ones(4))
    assert torch.allclose(loss, (torch.tensor([0.8**s for s in range(4)]) * stats["ce"]).sum())
    off = mtp_agreement(RecordingMtp(shift=1), final, z, keys, keys, ids, steps=4)
    assert torch.equal(off["top1"], torch.zeros(4))
    with pytest.raises(ValueError, match="MTP steps"):
        mtp_loss(RecordingMtp(), final, z, keys, keys, ids, steps=T)


def test_smoke_cli_trains_medusa_and_mtp(tmp_path, one_thread_per_test):
    """``--kinds medusa,mtp --smoke`` on a tiny 8-layer target: both losses fall, held-out agreement is
    logged per head / step, the saved heads load (safetensors) and run through the engine, and the
    held-out acceptance run reports every method with the outputs of method none."""
    target_dir = save_model("llama", tmp_path / "target", seed=0, layers=8, hidden=64)
    out = tmp_path / "out"
    logs = heads_cli.main(["--target", str(target_dir), "--out", str(out), "--smoke", "--device", "cpu",
                                 "--kinds", "medusa,mtp"])
    from specviz import SpecDecoder
    from specviz.models import load_model

    target = load_model(target_dir, torch.device("cpu"), torch.float32)
    for name, n_terms in (("medusa", 4), ("mtp", train_heads_mod.default_config("mtp", smoke=True).ttt_steps)):
        log = logs[name]
        assert log["steps"] == train_heads_mod.default_config(name, smoke=True).steps and not log["stopped_early"]
        first, last = log["train"][0]["loss"], log["train"][-1]["loss"]
        assert last < 0.97 * first, (name, first, last)
        assert len(log["heldout"][-1]["top1"]) == n_terms
        assert json.loads((out / f"specviz-{name}" / "train_log.json").read_text())["steps"] == log["steps"]
        head = load_head(out / f"specviz-{name}", target)
        assert head.config.kind == name
        from safetensors.torch import load_file

        saved = load_file(str(out / f"specviz-{name}" / "model.safetensors"))
        assert not any("lm_head" in k or "embed" in k for k in saved)  # the target's are shared, not stored
        assert sum(v.numel() for v in saved.values()) == sum(p.numel() for p in head.parameters())
    acc = json.loads((out / "heads_acceptance.json").read_text())
    assert set(acc["methods"]) >= {"medusa", "mtp"} and acc["outputs_differ"] == 0
    assert all(m["mean_acceptance_length"] >= 1.0 and m["num_drafts"] > 0 for m in acc["methods"].values())
    dec = SpecDecoder.from_pretrained(target_dir, device="cpu", dtype="float32",
                                      heads={k: str(out / f"specviz-{k}") for k in ("medusa", "mtp")})
    want = dec.generate("def f(x):", method="none", max_new_tokens=8).output_token_ids
    for kind in ("medusa", "mtp"):
        assert dec.generate("def f(x):", method=kind, num_speculative_tokens=3, max_new_tokens=8).output_token_ids == want


def test_schedule_fits_the_time_budget():
    """fit_to_budget: the cosine runs over max(step / steps, elapsed / budget), so a run that the budget ends is at
    the schedule's floor then, whatever its pace (a fit of the step count at step 20 counted the warm-up in the pace
    and ended a 460 s run after 187 s); without a budget the schedule is the step cosine."""
    import dataclasses

    from specviz.train.loop import lr_scale

    cfg = dataclasses.replace(train_heads_mod.default_config("medusa"), steps=6000, warmup_steps=100)
    floor = cfg.min_lr_ratio
    assert lr_scale(cfg, 0) == 1 / 100 and lr_scale(cfg, 99) == 1.0
    assert lr_scale(cfg, 200, 180.0, 180.0) == pytest.approx(floor)  # budget spent: the floor, at step 200 of 6000
    assert lr_scale(cfg, 200, 90.0, 180.0) == pytest.approx(floor + (1 - floor) * 0.5)  # half the budget: halfway
    assert lr_scale(cfg, 3050, 1.0, 180.0) == lr_scale(cfg, 3050) == pytest.approx(floor + (1 - floor) * 0.5)
    assert lr_scale(cfg, 6000, 0.0, None) == pytest.approx(floor)


def test_budget_ended_run_anneals_to_the_floor(one_thread_per_test):
    from tiny_models import build_model
    import dataclasses

    target = build_model("llama", seed=0, layers=2, hidden=32).float()
    for p in target.parameters():
        p.requires_grad_(False)
    w = torch.randint(0, target.config.vocab_size, (16, 17))
    cfg = dataclasses.replace(train_heads_mod.default_config("medusa", smoke=True), steps=100_000, eval_windows=2,
                              eval_every=10**6, fit_to_budget=True, min_seconds_left=0.0, log_every=5)
    head, log = train_heads_mod.fit_head("medusa", target, w, w[:2], "cpu", cfg, time_budget_s=4.0)
    assert log["stopped_early"] and 20 < log["steps"] < cfg.steps
    lrs = [r["lr"] for r in log["train"] if r["step"] > cfg.warmup_steps]
    assert all(a >= b for a, b in zip(lrs, lrs[1:])), lrs  # the cosine only falls after warm-up
    assert lrs[-1] < cfg.lr * (cfg.min_lr_ratio + 0.05)  # the last step ran at (about) the floor


def test_medusa_head_layers_override_builds_deeper_heads_that_save_and_load(tmp_path, one_thread_per_test):
    """``--set medusa.head_layers=2``: every Medusa head has two ResBlocks, and the saved head loads with them."""
    from tiny_models import build_model
    import dataclasses

    from specviz.heads.io import load_head

    target = build_model("llama", seed=0, layers=2, hidden=32).float()
    for p in target.parameters():
        p.requires_grad_(False)
    w = torch.randint(0, target.config.vocab_size, (8, 17))
    cfg = dataclasses.replace(train_heads_mod.default_config("medusa", smoke=True), steps=3, eval_windows=2, head_layers=2)
    log = __import__('specviz.methods.medusa.train', fromlist=['x']).train_medusa(target, w, w[:2], "cpu", tmp_path, config=cfg)
    head = load_head(log["saved"]["dir"], target)
    assert head.config.num_layers == 2 and all(len(b) == 2 for b in head.blocks)


def test_init_from_continues_a_saved_head_and_refuses_another_shape(tmp_path, one_thread_per_test):
    """``init_from``: a run starts from the saved head's weights (at lr 0 it ends on them, bit for bit); a saved head
    of another shape is refused before any step, naming the field that differs."""
    from tiny_models import build_model
    import dataclasses

    from specviz.heads.io import save_head

    target = build_model("llama", seed=0, layers=2, hidden=32).float()
    for p in target.parameters():
        p.requires_grad_(False)
    w = torch.randint(0, target.config.vocab_size, (16, 17), generator=torch.Generator().manual_seed(0))
    cfg = dataclasses.replace(train_heads_mod.default_config("medusa", smoke=True), steps=30, eval_every=10**6,
                              eval_windows=4)
    trained, _ = train_heads_mod.fit_head("medusa", target, w, w[:4], "cpu", cfg)
    save_head(trained, tmp_path / "first", dtype=torch.float32)
    kind = train_heads_mod.head_kind("medusa")
    head_cfg, fresh = kind.new_head(target, cfg)
    warm = train_heads_mod.warm_start(fresh, head_cfg, str(tmp_path / "first"), target)
    assert all(torch.equal(a, b) for a, b in zip(warm.state_dict().values(), trained.state_dict().values()))
    one = dataclasses.replace(cfg, steps=1, init_from=str(tmp_path / "first"), lr=0.0)  # lr 0: the saved weights
    cont, _ = train_heads_mod.fit_head("medusa", target, w, w[:4], "cpu", one)
    assert all(torch.equal(a, b) for a, b in zip(cont.state_dict().values(), trained.state_dict().values()))
    deeper = dataclasses.replace(cfg, head_layers=2, init_from=str(tmp_path / "first"))
    with pytest.raises(ValueError, match=r"'num_layers': \(1, 2\)"):  # (saved, training)
        train_heads_mod.fit_head("medusa", target, w, w[:4], "cpu", deeper)
