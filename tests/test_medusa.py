"""Method medusa: the heads read the final-norm feature (docs/design/methods.md Q8), the chain is the
heads' argmax from f at the last committed position (vLLM medusa.py), greedy output equals plain
greedy decoding (eager and static runners), T > 0 stays lossless (chi-square per position), typical
acceptance equals greedy at T = 0 and is detected as lossy at T > 0, the static tree's nodes, the view.
Heads have random weights (built from a config) on tiny random targets: no trained weights needed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from helpers import PROMPT, assert_greedy_equals_plain_greedy, assert_static_graphs_equal_eager, cli_args
from helpers import runner_decoders, tiny_head_dirs
from stats_helpers import SMALL_VOCAB, chi2_pvalue, exact_marginals, first_two, save_small_word_target

from specviz import SpecDecoder
from specviz.heads import load_head, save_head
from specviz.methods.medusa.head import MedusaHead, medusa_config_from_target, medusa_loss
from specviz.proposer import Outcome
from specviz.methods.medusa.proposer import DEFAULT_MEDUSA_TREE, MedusaProposer
from specviz.runner import FINAL_NORM, EagerRunner
from specviz.tree import parse_choices

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: one intra-op thread


def random_medusa(model, seed: int, scale: float = 0.5) -> MedusaHead:
    """Medusa heads with non-zero random ResBlocks (zero-init would copy the target's next-token head)."""
    torch.manual_seed(seed)
    head = MedusaHead(medusa_config_from_target(model.config), model)
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, scale)
    return head.eval()


@pytest.fixture(scope="module")
def medusa_dirs(tmp_path_factory):
    return tiny_head_dirs(tmp_path_factory, "medusa", lambda model: random_medusa(model, 11))


@pytest.fixture(scope="module")
def medusa_decoders(medusa_dirs):
    return runner_decoders(medusa_dirs[0], {"medusa": medusa_dirs[1]})


def _features(dec, ids: list[int]) -> torch.Tensor:
    """[len(ids), d]: the final-norm feature of an uncached target forward."""
    with torch.no_grad():
        return dec.target_model.model(input_ids=torch.tensor([ids])).last_hidden_state[0]


class OracleMedusa(torch.nn.Module):
    """Stub heads: find the feature's position t among ``feats`` (asserting it is exactly f_t) and put
    head i's mass on ``oracle[t + 2 + i]`` (the token Medusa head i predicts), except at the feature
    positions in ``wrong`` and on every ``every``-th call, where head 1 proposes another token (a
    rejection at draft position 2)."""

    def __init__(self, oracle: list[int], feats: torch.Tensor, vocab: int, heads: int = 4, wrong=frozenset(),
                 every: int = 0):
        super().__init__()
        self.every = every
        self.config = SimpleNamespace(kind="medusa", num_heads=heads, aux_layer_ids=())
        self.oracle, self.feats, self.vocab, self.wrong = oracle, feats, vocab, set(wrong)
        self.positions: list[int] = []

    def forward(self, f):
        dist = (self.feats - f[0]).abs().amax(-1)
        t = int(dist.argmin())
        assert float(dist.min()) < 1e-4, "medusa read something other than the target's final-norm feature"
        self.positions.append(t)
        logits = torch.zeros(self.config.num_heads, 1, self.vocab)
        for i in range(self.config.num_heads):
            tok = self.oracle[t + 2 + i] if t + 2 + i < len(self.oracle) else 5
            bad = t in self.wrong or (self.every and len(self.positions) % self.every == 0)
            logits[i, 0, (tok + 1) % self.vocab if (i == 1 and bad) else tok] = 10.0
        return logits


def test_heads_read_the_final_norm_feature(medusa_decoders):
    """docs/design/methods.md Q8: the runner's ``final_norm`` tap is the final RMSNorm's output (what the LM head
    multiplies), not the last decoder layer's un-normed output; zero-initialised ResBlocks are the
    identity, so every head then reproduces the target's own next-token logits from it."""
    dec = medusa_decoders["eager"]
    model = dec.target_model
    ids = dec.encode(PROMPT)
    seen = {}
    hook = model.model.layers[-1].register_forward_hook(lambda m, i, o: seen.update(out=o[0] if isinstance(o, tuple) else o))
    try:
        runner = EagerRunner(model)
        runner.reset()
        fwd = runner.forward_features(torch.tensor(ids), (FINAL_NORM,))
    finally:
        hook.remove()
    f = fwd.features[FINAL_NORM]  # [n, d]
    torch.testing.assert_close(model.lm_head(f).float(), fwd.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(f, model.model.norm(seen["out"][0]), rtol=1e-5, atol=1e-6)
    assert (f - seen["out"][0]).abs().max() > 1e-2  # the un-normed output is a different tensor
    fresh = MedusaHead(medusa_config_from_target(model.config), model).eval()  # zero-init ResBlocks
    with torch.no_grad():
        heads = fresh(f)  # [K, n, V]
    for i in range(fresh.config.num_heads):
        torch.testing.assert_close(heads[i], fwd.logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("runner", ("eager", "static"))
def test_greedy_equals_plain_greedy(medusa_decoders, runner):
    """fp32 CPU, k in {1, 2, 4, 6}: random heads and an oracle stub with an injected error give exactly
    method none's tokens; the oracle's drafts are mostly accepted (full and partial accepts)."""
    def at_most_four(k, got):  # a chain of min(k, number of heads) tokens
        assert all(len(s.draft_token_ids) <= min(k, 4) for s in got.steps)

    dec = medusa_decoders[runner]
    assert_greedy_equals_plain_greedy(
        dec, runner, ("medusa",), (1, 2, 4, 6),
        lambda kind, full, real: OracleMedusa(full, _features(dec, full), dec.vocab_size, every=2),
        min_accepted=16 * 2, rejection_from_k=2, noun="heads", check_random=at_most_four)


def test_chain_is_argmax_of_each_head_at_the_last_committed_feature(medusa_decoders):
    """vLLM medusa.py: after every step the next draft is [argmax head_0, ..., argmax head_{k-1}] of
    f at the last committed position n-1 (the position just before the root)."""
    dec = medusa_decoders["eager"]
    head = dec.heads["medusa"]
    trace = dec.generate(PROMPT, method="medusa", num_speculative_tokens=3, max_new_tokens=14)
    ids = trace.prompt_token_ids + trace.output_token_ids
    feats = _features(dec, ids)
    n = len(trace.prompt_token_ids) - 1
    for st in trace.steps:
        if not st.draft_token_ids:
            continue
        with torch.no_grad():
            want = head(feats[n - 1][None])[:, 0].argmax(-1)[: len(st.draft_token_ids)].tolist()
        assert st.draft_token_ids == want, st.index
        assert st.match["feature_position"] == n - 1 and st.match["root_position"] == n
        n += len(st.committed_token_ids)


def test_tree_nodes_are_top_candidates_of_each_head(medusa_decoders):
    """A static tree from Medusa choices: node (r_1..r_d) is the r_d-th top candidate of head d-1 (all
    from the same feature), parents follow the paths, q is one-hot (rule A, tree_rule "topk")."""
    dec = medusa_decoders["eager"]
    head = dec.heads["medusa"]
    ids = dec.encode(PROMPT)
    feats = _features(dec, ids[:-1])
    prop = MedusaProposer(head, 4, tree=DEFAULT_MEDUSA_TREE)
    prop.observe(Outcome(0, [], 0, ids[1:], {FINAL_NORM: feats}))
    draft = prop.propose(ids, 4)
    paths = parse_choices(DEFAULT_MEDUSA_TREE)
    with torch.no_grad():
        top = head(feats[-1][None])[:, 0].topk(10, dim=-1).indices  # [K, 10]
    assert draft.token_ids.tolist() == [int(top[len(p) - 1, p[-1]]) for p in paths]
    assert draft.parents == [paths.index(p[:-1]) if len(p) > 1 else -1 for p in paths]
    assert draft.probs is None and draft.tree_rule == "topk" and not draft.is_chain
    short = prop
    short.reset()
    short.observe(Outcome(0, [], 0, ids[1:], {FINAL_NORM: feats}))
    assert max(n["depth"] for n in short.propose(ids, 2).details["nodes"]) == 2  # near max_new_tokens: pruned
    with pytest.raises(ValueError, match="deeper than the 4"):
        MedusaProposer(head, 4, tree="[(0,), (0, 0), (0, 0, 0), (0, 0, 0, 0), (0, 0, 0, 0, 0)]")


@pytest.mark.parametrize("runner", ("eager", "static"))
def test_tree_greedy_equals_plain_greedy(medusa_decoders, runner):
    """Medusa's static tree through the engine: greedy output equals method none's (fp32)."""
    dec = medusa_decoders[runner]
    want = dec.generate(PROMPT, method="none", max_new_tokens=16).output_token_ids
    full = dec.encode(PROMPT) + want
    real = dict(dec.heads)
    try:
        for heads in (real, {"medusa": OracleMedusa(full, _features(dec, full), dec.vocab_size)}):
            dec.heads = dict(heads)
            got = dec.generate(PROMPT, method="medusa", num_speculative_tokens=4, max_new_tokens=16,
                               speculative_token_tree=DEFAULT_MEDUSA_TREE)
            assert got.output_token_ids == want
    finally:
        dec.heads = real


def test_save_load_and_loss(medusa_dirs, medusa_decoders):
    """The saved heads load back onto the target (safetensors, same logits); the soft-label loss is
    finite and pairs head i at row t with the target's distribution at t+1+i."""
    target, head_dir = medusa_dirs
    dec = medusa_decoders["eager"]
    head = load_head(head_dir, dec.target_model)
    ids = dec.encode(PROMPT)
    feats = _features(dec, ids)
    with torch.no_grad():
        torch.testing.assert_close(head(feats), dec.heads["medusa"](feats))
        z = dec.target_model.lm_head(feats)[None].float()  # [1, T, V]
        loss, stats = medusa_loss(head, feats[None], z)
    assert torch.isfinite(loss) and stats["ce"].shape == (4,)
    # labels shifted onto head i exactly: a head that outputs z_{t+1+i} scores the entropy of p only
    class Shift(torch.nn.Module):
        config = SimpleNamespace(num_heads=4)

        def head_logits(self, f, i):  # rows t = 0..: exactly z_{t+1+i}, the label of head i at row t
            return z[:, 1 + i : 1 + i + f.shape[1]]
    loss2, stats2 = medusa_loss(Shift(), feats[None], z)
    assert stats2["top1"].tolist() == [1.0] * 4
    p = torch.softmax(z, -1)
    H = -(p * torch.log_softmax(z, -1)).sum(-1)  # [1, T]
    for i in range(4):
        torch.testing.assert_close(stats2["ce"][i], H[:, 1 + i:].mean(), rtol=1e-4, atol=1e-5)


def test_missing_head_and_cli(medusa_dirs, capsys):
    from specviz.cli import main

    target, head_dir = medusa_dirs
    dec = SpecDecoder.from_pretrained(target, device="cpu", dtype="float32")
    with pytest.raises(ValueError, match="method 'medusa' needs a Medusa head.*heads="):
        dec.generate(PROMPT, method="medusa")
    common = cli_args(target)
    assert main([*common, "--method", "medusa", "--medusa-head", str(head_dir)]) == 0
    assert "mean acceptance length" in capsys.readouterr().out
    assert main([*common, "--method", "medusa"]) == 2
    assert "needs a Medusa head" in capsys.readouterr().err


# ---- T > 0: lossless rules, and typical acceptance's shift ----------------------------------------
V_SMALL = SMALL_VOCAB


@pytest.fixture(scope="module")
def small_decoder(tmp_path_factory):
    """A 4-layer random Llama over V = 8 word tokens (no EOS) with random medusa heads."""
    root = tmp_path_factory.mktemp("medusa-small")
    model = save_small_word_target(root)
    save_head(random_medusa(model, 5, scale=0.3), root / "medusa", dtype=torch.float32)
    return SpecDecoder.from_pretrained(root / "target", device="cpu", dtype="float32",
                                       heads={"medusa": str(root / "medusa")})


@pytest.mark.parametrize("verify,sampling", (("standard", dict(temperature=0.9)),
                                             ("block", dict(temperature=1.0, top_p=0.8))))
def test_sampling_is_lossless_per_position(small_decoder, verify, sampling):
    """T > 0, k = 2, one-hot q at the heads' argmax: the first and second generated tokens are
    distributed as the target's (chi-square over 400 seeded runs, p > 0.001)."""
    dec, prompt, trials = small_decoder, [1, 6, 2, 3], 400
    counts, accepted = first_two(dec, prompt, trials, "medusa", num_speculative_tokens=2, verify=verify, **sampling)
    assert 0.05 * trials < accepted < 1.95 * trials
    for i, p in enumerate(exact_marginals(dec, prompt, **sampling)):
        assert chi2_pvalue(counts[i], p, trials) > 1e-3, (verify, i, counts[i].tolist())


def test_typical_equals_greedy_at_temperature_zero(small_decoder, medusa_decoders):
    """At T = 0 p is one-hot, so typical acceptance accepts exactly the target's argmax: the output is
    plain greedy's, step by step like verify greedy. The trace says the rule is lossy."""
    for dec, prompt in ((small_decoder, [1, 6, 2, 3]), (medusa_decoders["eager"], PROMPT)):
        want = dec.generate(prompt, method="none", max_new_tokens=12).output_token_ids
        typ = dec.generate(prompt, method="medusa", num_speculative_tokens=3, max_new_tokens=12, verify="typical")
        greedy = dec.generate(prompt, method="medusa", num_speculative_tokens=3, max_new_tokens=12, verify="greedy")
        assert typ.output_token_ids == want
        assert [s.num_accepted for s in typ.steps] == [s.num_accepted for s in greedy.steps]
        assert "not distribution-preserving" in typ.config["verify_note"]
        assert "verify_note" not in greedy.config


def test_typical_acceptance_is_detected_as_lossy(small_decoder):
    """The negative control of docs/design/methods.md 11.4/11.5: at T = 1 with heads that always propose the
    target's argmax (whose probability exceeds min(epsilon, delta e^-H) since it is >= 1/V > epsilon),
    typical acceptance keeps it every time, so the first generated token is the argmax in 100% of the
    runs instead of p(argmax): chi-square against p rejects (p < 1e-6). Standard verification of the
    same drafts passes (p > 0.001)."""
    dec, prompt, trials = small_decoder, [1, 6, 2, 3], 300
    p1, _ = exact_marginals(dec, prompt, temperature=1.0)
    top = int(p1.argmax())
    assert 0.09 < float(p1[top]) < 0.9  # the rule must accept it, and p is far from one-hot
    real = dict(dec.heads)

    class Argmax(torch.nn.Module):  # head i proposes the target's argmax at the first position
        config = SimpleNamespace(kind="medusa", num_heads=1, aux_layer_ids=())

        def forward(self, f):
            return torch.nn.functional.one_hot(torch.tensor([[top]]), V_SMALL).float() * 10

    try:
        dec.heads["medusa"] = Argmax()
        lossy, acc = first_two(dec, prompt, trials, "medusa", num_speculative_tokens=1, verify="typical",
                               temperature=1.0)
        fair, _ = first_two(dec, prompt, trials, "medusa", num_speculative_tokens=1, verify="standard", temperature=1.0)
    finally:
        dec.heads = real
    assert acc == trials and lossy[0, top] == trials
    assert chi2_pvalue(lossy[0], p1, trials) < 1e-6
    assert chi2_pvalue(fair[0], p1, trials) > 1e-3


def test_typical_rule_and_bad_parameters(small_decoder):
    """The rule itself: accept iff p(x) > min(epsilon, delta * exp(-H(p))), up to the first failure;
    bad epsilon / delta are ValueErrors that say the rule is not distribution-preserving."""
    from specviz.sampling.typical import typical_sample, typical_threshold

    p = torch.tensor([[[0.5, 0.3, 0.2, 0.0], [0.25, 0.25, 0.25, 0.25], [0.9, 0.05, 0.05, 0.0], [1.0, 0, 0, 0]]])
    H = -(p[0, :3] * torch.log(p[0, :3].clamp_min(1e-30))).sum(-1)
    thr = typical_threshold(p[0, :3], 0.09, 0.3)
    torch.testing.assert_close(thr, torch.clamp(0.3 * torch.exp(-H), max=0.09))
    out = typical_sample(p, torch.tensor([[1, 2, 1]]), 0.09, 0.3)  # 0.3 > 0.09; 0.25 > 0.075; 0.05 < 0.09
    assert out.num_accepted.tolist() == [2] and out.accept_prob[0].tolist() == [1.0, 1.0, 0.0]
    assert out.output_token_ids[0].tolist() == [1, 2, 0, -1]  # the emitted token: argmax p without noise
    with pytest.raises(ValueError, match="not distribution-preserving"):
        small_decoder.generate([1, 2], method="medusa", verify="typical", temperature=1.0,
                               typical_acceptance_sampler_posterior_threshold=0.0)
    with pytest.raises(ValueError, match="not distribution-preserving.*reference sampler"):
        small_decoder.generate([1, 2], method="medusa", verify="typical", sampler_backend="triton")


def test_medusa_view(medusa_decoders):
    """The 'where the draft came from' panel: each head's top candidates for the step, those that
    formed the draft marked, and the target's decision on each draft position."""
    from specviz.viz.source import source_figure, source_html

    dec = medusa_decoders["eager"]
    tr = dec.generate(PROMPT, method="medusa", num_speculative_tokens=4, max_new_tokens=12)
    st = next(s for s in tr.steps if s.draft_token_ids)
    page = source_html(tr, st.index)
    assert "sv-medusa" in page and page.count("<tr data-head=") == 4
    assert page.count("sv-medusa-chosen") == len(st.draft_token_ids)
    fig = source_figure(tr, st.index)
    (heat,) = fig.data
    assert len(heat.z) == 4 and all(len(row) == 5 for row in heat.z)
    assert [row[0] for row in heat.z] == [h["candidates"][0][1] for h in st.match["heads"]]
    assert [(round(r.x0 + 0.5), round(r.y0 + 0.5)) for r in fig.layout.shapes] == \
        [(0, h) for h in range(len(st.draft_token_ids))]  # the chain: rank 0 of heads 0..k'-1
    for h, cand in enumerate(st.match["heads"]):
        assert len(cand["candidates"]) == 5
        if h < len(st.draft_token_ids):
            assert cand["candidates"][0][0] == st.draft_token_ids[h]


@pytest.mark.gpu
def test_static_graphs_equal_eager_on_gpu(medusa_dirs):
    """fp32 on CUDA: the static runner with CUDA graphs gives the eager runner's tokens and per-step
    acceptances (greedy, seeded standard sampling, typical on the reference sampler), and greedy
    equals method none."""
    target, head = medusa_dirs
    assert_static_graphs_equal_eager(runner_decoders(target, {"medusa": head}, device="cuda"), "medusa", 4, "typical")


@pytest.mark.skipif(not all((__import__("specviz.loading").loading.bundled_heads()[k] / "model.safetensors").exists()
                            for k in ("medusa", "mtp")), reason="the bundled medusa / mtp heads are not there")
@pytest.mark.parametrize("runner", ("eager", "static"))
def test_bundled_heads_greedy_equals_plain_greedy(runner):
    """The trained heads shipped in assets/models (fp32 on the CPU): medusa and mtp return exactly method
    none's greedy tokens on two prompts, and their drafts are accepted at some steps."""
    dec = SpecDecoder.from_pretrained(device="cpu", dtype="float32", runner=runner)
    assert {"medusa", "mtp"} <= set(dec.heads), dec.head_errors
    for prompt in (PROMPT, "import torch\n\n\nclass Linear(torch.nn.Module):\n    def __init__(self"):
        want = dec.generate(prompt, method="none", max_new_tokens=32).output_token_ids
        for kind in ("medusa", "mtp"):
            got = dec.generate(prompt, method=kind, num_speculative_tokens=4, max_new_tokens=32)
            assert got.output_token_ids == want, (runner, kind, prompt)
            assert sum(s.num_accepted for s in got.steps) > 0, (kind, prompt)


def test_tree_sampling_is_lossless_per_position(small_decoder):
    """T > 0, a static Medusa tree (top-k children of each head: rule A, q one-hot), verify standard: the
    first and second generated tokens are distributed as the target's (chi-square, 400 runs, p > 0.001);
    verify typical is refused for trees (chain-only)."""
    dec, prompt, trials = small_decoder, [1, 6, 2, 3], 400
    tree = "[(0,), (1,), (2,), (0, 0), (1, 0), (0, 1)]"
    counts, accepted = first_two(dec, prompt, trials, "medusa", num_speculative_tokens=2, verify="standard",
                                 temperature=0.9, speculative_token_tree=tree)
    assert 0.05 * trials < accepted < 1.95 * trials
    for i, p in enumerate(exact_marginals(dec, prompt, temperature=0.9)):
        assert chi2_pvalue(counts[i], p, trials) > 1e-3, (i, counts[i].tolist())
    with pytest.raises(ValueError, match="chain-only"):
        dec.generate(prompt, method="medusa", num_speculative_tokens=2, verify="typical", temperature=0.9,
                     speculative_token_tree=tree)


def test_medusa_tree_panel_counts_the_tree_nodes(medusa_decoders):
    """The panel names the static tree's size (it said "a static tree of 1 nodes" for a 5-node tree: it counted the
    step's row, not its nodes)."""
    from specviz.viz.source import source_html

    tr = medusa_decoders["eager"].generate(PROMPT, method="medusa", num_speculative_tokens=4, max_new_tokens=12,
                                           speculative_token_tree="[(0,), (1,), (0, 0), (0, 1), (1, 0)]")
    st = next(s for s in tr.steps if s.nodes and len(s.draft_token_ids) < len(s.nodes))
    assert f"a static tree of {len(st.nodes)} nodes" in source_html(tr, st.index)


def test_every_medusa_candidate_has_its_text(medusa_decoders):
    """The panel's candidates are named by their text (they showed raw ids like <472>)."""
    dec = medusa_decoders["eager"]
    for tr in (dec.generate(PROMPT, method="medusa", num_speculative_tokens=4, max_new_tokens=12),
               list(dec.iter_generate(PROMPT, method="medusa", num_speculative_tokens=4, max_new_tokens=12))[-1]):
        cands = {c[0] for st in tr.steps for h in (st.match or {}).get("heads", []) for c in h["candidates"]}
        assert cands and all(str(t) in tr.token_texts for t in cands)


@pytest.mark.parametrize("layers, lm_heads, bias, truncated", [
    (1, "target", True, False), (2, "target", False, False), (1, "per_head", True, True), (2, "shared", True, False)])
def test_batched_forward_equals_each_head_alone(medusa_decoders, layers, lm_heads, bias, truncated):
    """forward (the drafting path: K heads' ResBlocks as batched matmuls, one LM head GEMM) == head_logits per head,
    for every layout's shape (ResBlock layers, own / shared / target LM heads, fc bias, a truncated head vocabulary);
    and a weight changed after a forward is seen by the next one (the stacked weights are rebuilt)."""
    import dataclasses

    dec = medusa_decoders["eager"]
    model = dec.target_model
    base = medusa_config_from_target(model.config, num_heads=3, num_layers=layers)
    cfg = dataclasses.replace(base, fc_bias=bias, lm_heads=lm_heads,
                              head_vocab_size=model.config.vocab_size // 2 if truncated else None)
    torch.manual_seed(7)
    head = MedusaHead(cfg, model)
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, 0.3)
    if truncated:
        head.token_map = torch.randperm(model.config.vocab_size)[: cfg.head_vocab_size]
    f = torch.randn(2, 5, cfg.hidden_size)
    alone = torch.stack([head.head_logits(f, i).float() for i in range(cfg.num_heads)])
    together = head(f)
    assert together.shape == (3, 2, 5, model.config.vocab_size)
    torch.testing.assert_close(together, alone, rtol=1e-5, atol=1e-5)
    assert torch.equal(together.isinf(), alone.isinf()) and bool(together.isinf().any()) == truncated
    with torch.no_grad():
        head.blocks[1][0].linear.weight.add_(1.0)
    torch.testing.assert_close(head(f)[1], head.head_logits(f, 1).float(), rtol=1e-5, atol=1e-5)


def test_a_trainers_evaluation_sees_each_steps_weights(medusa_decoders):
    """A fused optimizer updates weights in place without bumping their version: the trainer's held-out evaluation
    (eval mode, forward) read the stacked weights of its first evaluation at every later one (a 400 s run logged the
    same held-out loss five times). An update that leaves the version alone (through .data) between two evaluations
    is seen after train() / eval(); in training mode nothing is kept."""
    dec = medusa_decoders["eager"]
    head = MedusaHead(medusa_config_from_target(dec.target_model.config, num_heads=2, num_layers=2), dec.target_model)
    f = torch.randn(1, 4, head.config.hidden_size)
    head.eval()
    first = head(f)
    head.train()
    w = head.blocks[0][1].linear.weight
    version = w._version
    w.data.add_(0.5)
    assert w._version == version  # the update the version key cannot see
    torch.testing.assert_close(head(f)[0], head.head_logits(f, 0).float(), rtol=1e-5, atol=1e-5)
    head.eval()
    again = head(f)
    assert not torch.allclose(again[0], first[0])
    torch.testing.assert_close(again[0], head.head_logits(f, 0).float(), rtol=1e-5, atol=1e-5)


def test_the_lesson_says_one_forward_of_every_head_drafted_the_chain(medusa_decoders):
    """The lesson's draft chapter for a Medusa chain names the feature's position and each draft's head and
    probability (the method's draft_why), not the generic sentence."""
    from specviz.viz.common import fmt_prob, quoted
    from specviz.viz.lesson import _draft_why

    dec = medusa_decoders["eager"]
    trace = dec.generate(PROMPT, method="medusa", num_speculative_tokens=3, max_new_tokens=10)
    st = next(s for s in trace.steps if s.draft_token_ids)
    text = _draft_why(trace, st)
    assert f"final-norm feature at position {st.match['feature_position']}" in text
    assert f"the root token at position {st.match['root_position']} came from the target's own LM head" in text
    for i, (h, t) in enumerate(zip(st.match["heads"], st.draft_token_ids), start=1):
        prob = fmt_prob(h["candidates"][0][1])
        said = f"x{i} = {quoted(trace, t)} from head {h['head']} (the head's probability {prob})"
        assert said in text
