"""Tree drafts end to end: forward -> tree verifier -> commit(path) -> observe -> trace (version 2).

Greedy tree output equals plain greedy decoding token for token (fp32) on the eager and the static
runner (the CPU static runner runs trees eagerly), a draft identical to the target accepts the
full depth, the proposer sees the accepted path's features in path order, invalid settings give
ValueErrors, and version-1 traces still load."""

from __future__ import annotations

import copy

import pytest
import torch

from specviz import SpecDecoder
from specviz import tree as T
from specviz.proposer import Draft, NoFeedback
from specviz.runner import EagerRunner
from specviz.trace import Trace, TraceFormatError

PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a"
TREE = "[(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]"


@pytest.fixture(scope="module")
def static_decoders(tiny_dirs):
    return {arch: SpecDecoder.from_pretrained(t, d, device="cpu", dtype="float32", runner="static")
            for arch, (t, d) in tiny_dirs.items()}


@pytest.fixture(scope="module")
def static_self_decoders(tiny_dirs):
    return {"llama": SpecDecoder.from_pretrained(tiny_dirs["llama"][0], tiny_dirs["llama"][0], device="cpu",
                                                 dtype="float32", runner="static")}


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("runner", ["eager", "static"])
def test_greedy_tree_equals_plain_greedy(decoders, static_decoders, arch, runner):
    dec = decoders[arch] if runner == "eager" else static_decoders[arch]
    want = dec.generate(PROMPT, method="none", max_new_tokens=40).output_token_ids
    for tree in (TREE, "[(0,), (0, 0), (0, 1), (0, 0, 0), (0, 0, 1), (0, 0, 0, 0)]"):
        tr = dec.generate(PROMPT, method="draft_model", num_speculative_tokens=4, max_new_tokens=40,
                          speculative_token_tree=tree)
        assert tr.output_token_ids == want, (runner, tree)
        assert tr.config["speculative_token_tree"] == tree
        branching = [s for s in tr.steps if len(s.nodes) > s.draft_depth]  # a depth-capped chain runs as a chain
        assert branching and all(s.tree_rule == "topk" for s in branching)


def test_identical_draft_accepts_the_full_depth(self_decoders):
    dec = self_decoders["llama"]
    want = dec.generate(PROMPT, method="none", max_new_tokens=33).output_token_ids
    tr = dec.generate(PROMPT, method="draft_model", num_speculative_tokens=3, max_new_tokens=33,
                      speculative_token_tree=TREE)
    assert tr.output_token_ids == want
    full = [s for s in tr.steps if s.draft_depth == 3]
    assert full and all(s.accepted_path == [0, 3, 6] and s.emitted.kind == "bonus" for s in full)
    m = tr.metrics
    assert m["num_draft_tokens"] == sum(len(s.nodes) for s in tr.steps)
    assert m["num_accepted_tokens"] == sum(len(s.accepted_path) for s in tr.steps)
    assert m["mean_acceptance_length"] == pytest.approx(len(want) / m["num_drafts"], rel=0.2)
    assert m["acceptance_rate_per_position"][:3] == [1.0, 1.0, pytest.approx(m["accepted_per_position"][2] / m["num_drafts"])]
    # the row: the accepted path (every node a draft the target kept)
    assert all(s.draft_token_ids == [s.nodes[c].token_id for c in s.accepted_path] for s in full)


@pytest.mark.parametrize("runner", ["eager", "static"])
def test_sampled_tree_runs_and_records_rule_a(decoders, static_decoders, runner):
    dec = decoders["llama"] if runner == "eager" else static_decoders["llama"]
    tr = dec.generate(PROMPT, method="draft_model", num_speculative_tokens=3, max_new_tokens=20, temperature=0.8,
                      speculative_token_tree=TREE, seed=3)
    assert len(tr.output_token_ids) == 20
    for s in tr.steps:
        assert s.tree_rule == ("topk" if len(s.nodes) > s.draft_depth else "chain")
        assert s.num_accepted == len(s.accepted_path)
        assert all(n.q == 1.0 for n in s.nodes)  # top-k children: q one-hot (rule A)
        tested = [n for n in s.nodes if n.fate != "unvisited"]
        assert all(n.u is not None and 0.0 <= n.u < 1.0 for n in tested)
        assert s.committed_token_ids[: s.num_accepted] == [s.nodes[c].token_id for c in s.accepted_path][
            : len(s.committed_token_ids)]
    again = Trace.from_json(tr.to_json())
    assert again.to_dict() == tr.to_dict()


class FixedTree(NoFeedback):
    """Drafts a fixed tree of the tokens it is given; records what observe receives."""

    name = "fixed_tree"
    taps = ("final_norm",)
    num_speculative_tokens = 3

    def __init__(self, tokens, parents):
        self.tokens, self.parents, self.outcomes = tokens, parents, []

    def reset(self):
        self.outcomes = []

    def propose(self, token_ids, num_tokens=None, context=None):
        return Draft(token_ids=torch.tensor(self.tokens), parents=list(self.parents))

    def observe(self, outcome):
        self.outcomes.append(outcome)


def test_observe_gets_the_accepted_path_features_in_path_order(self_decoders, monkeypatch):
    """With the target's own greedy continuation planted on a non-first branch, the proposer's
    Outcome carries the committed tokens and the target features at their positions."""
    dec = self_decoders["llama"]
    ids = dec.encode(PROMPT)
    plain = dec.generate(ids, method="none", max_new_tokens=4).output_token_ids
    a, b, c = plain[:3]
    # node 2 (second root child) and node 4 (its child) hold the continuation; others are decoys
    proposer = FixedTree([(a + 1) % 300, (a + 2) % 300, a, (b + 7) % 300, b, (c + 5) % 300], [-1, -1, -1, 0, 2, 3])
    monkeypatch.setattr(dec, "make_proposer", lambda cfg, **extras: proposer)
    tr = dec.generate(ids, method="ngram", num_speculative_tokens=3, max_new_tokens=4)  # proposer replaced
    assert tr.output_token_ids == plain
    step = tr.steps[0]
    assert step.accepted_path == [2, 4] and step.committed_token_ids == [a, b, c]
    out = proposer.outcomes[1]  # [0] is the prefill
    assert out.draft_token_ids == [a, b] and out.num_accepted == 2 and out.committed_token_ids == [a, b, c]
    ref = EagerRunner(dec.target_model)
    ref.reset()
    full = ref.forward_features(torch.tensor(ids + [a, b]), ("final_norm",)).features["final_norm"]
    torch.testing.assert_close(out.features["final_norm"], full[len(ids) - 1:], rtol=1e-4, atol=1e-4)
    assert out.start == len(ids) - 1


@pytest.mark.parametrize("settings, match", [
    (dict(method="draft_model", verify="block", temperature=0.8), "chain-only"),
    (dict(method="draft_model", verify="synthetic", synthetic_rates=[0.5, 0.4, 0.3]), "chain-only"),
    (dict(method="ngram"), "does not draft static trees"),
    (dict(method="draft_model", num_speculative_tokens=2), "3 deep but num_speculative_tokens is 2"),
])
def test_invalid_tree_settings_raise(decoders, settings, match):
    kw = {"num_speculative_tokens": 3, "max_new_tokens": 4, "speculative_token_tree": TREE, **settings}
    with pytest.raises(ValueError, match=match):
        decoders["llama"].generate(PROMPT, **kw)


@pytest.mark.parametrize("tree, match", [
    ("[(0,), (0, 0", "not a list of tuples"),
    ("[(0,), (1, 0)]", "no parent path"),
    ("[(0,), (-1,)]", "negative"),
    ("[]", "at least one path"),
    (str([(i,) for i in range(T.MAX_TREE_NODES + 1)]), "at most"),
    ("[(0,), (0,)]", "appears twice"),
])
def test_invalid_choices_raise(decoders, tree, match):
    with pytest.raises(ValueError, match=match):
        decoders["llama"].generate(PROMPT, method="draft_model", num_speculative_tokens=3, max_new_tokens=4,
                                   speculative_token_tree=tree)


def test_a_tree_draft_with_block_verification_is_refused_in_the_loop(self_decoders, monkeypatch):
    """A proposer's tree met by verify="block" (no speculative_token_tree setting) -> ValueError."""
    dec = self_decoders["llama"]
    monkeypatch.setattr(dec, "make_proposer", lambda cfg, **extras: FixedTree([5, 6], [-1, -1]))
    with pytest.raises(ValueError, match="chain-only"):
        dec.generate(PROMPT, method="ngram", num_speculative_tokens=3, max_new_tokens=4, verify="block",
                     temperature=0.8)


def _as_v1(data):
    data = copy.deepcopy(data)
    data["version"] = 1
    data["config"].pop("speculative_token_tree", None)
    for s in data["steps"]:
        for key in ("nodes", "accepted_path", "tree_rule"):
            s.pop(key)
    return data


def test_version_1_trace_loads_with_chain_nodes(decoders):
    tr = decoders["llama"].generate(PROMPT, method="draft_model", num_speculative_tokens=3, max_new_tokens=12,
                                    temperature=0.8, seed=1)
    loaded = Trace.from_dict(_as_v1(tr.to_dict()))
    assert loaded.version == 2
    for s, orig in zip(loaded.steps, tr.steps):
        assert s.nodes == orig.nodes and s.accepted_path == orig.accepted_path and s.tree_rule == "chain"
        assert [n.parent for n in s.nodes] == T.chain_parents(len(s.draft_token_ids))
    assert loaded.metrics == tr.metrics


@pytest.mark.parametrize("mutate, match", [
    (lambda s: s["nodes"][1].update(parent=5), "parent is 5"),
    (lambda s: s["nodes"][1].update(depth=7), "depth is 7"),
    (lambda s: s["nodes"][0].update(fate="maybe"), "fate must be"),
    (lambda s: s["nodes"][0].update(p="high"), "nodes\\[0\\].p"),
    (lambda s: s.update(accepted_path=[5]), "not a path of accepted nodes"),
    (lambda s: s.update(tree_rule="magic"), "tree_rule must be"),
    (lambda s: s.update(nodes="x"), "nodes must be a list"),
])
def test_malformed_tree_fields_are_refused_with_a_message(self_decoders, mutate, match):
    tr = self_decoders["llama"].generate(PROMPT, method="draft_model", num_speculative_tokens=3, max_new_tokens=8,
                                         speculative_token_tree=TREE)
    data = tr.to_dict()
    mutate(next(s for s in data["steps"] if len(s["nodes"]) > 3))
    with pytest.raises(TraceFormatError, match=match):
        Trace.from_dict(data)


def test_cli_speculative_token_tree(tiny_dirs, tmp_path, capsys):
    from specviz.cli import main

    target, _ = tiny_dirs["llama"]
    out = tmp_path / "tree.trace.json"
    code = main(["generate", "--target", str(target), "--draft", str(target), "--method", "draft_model", "-k", "3",
                 "--speculative-token-tree", TREE, "--prompt", PROMPT, "--max-new-tokens", "10", "--device", "cpu",
                 "--trace", str(out), "--no-color"])
    assert code == 0, capsys.readouterr().err
    trace = Trace.from_json(out.read_text())
    assert trace.config["speculative_token_tree"] == TREE and any(len(s.nodes) == 7 for s in trace.steps)
    assert main(["generate", "--target", str(target), "--draft", str(target), "--method", "draft_model", "-k", "2",
                 "--speculative-token-tree", TREE, "--prompt", PROMPT, "--device", "cpu"]) == 2
    assert "3 deep" in capsys.readouterr().err


def test_eos_inside_the_accepted_path_counts_only_what_was_committed(self_decoders, monkeypatch):
    """EOS as the second accepted node: 2 tokens committed, the rest of the tree discarded, and the
    metrics count the committed tokens."""
    dec = self_decoders["llama"]
    ids = dec.encode(PROMPT)
    a, b, c = dec.generate(ids, method="none", max_new_tokens=3).output_token_ids
    proposer = FixedTree([(a + 1) % 300, a, b, (b + 3) % 300, c], [-1, -1, 1, 1, 2])
    monkeypatch.setattr(dec, "make_proposer", lambda cfg, **extras: proposer)
    monkeypatch.setattr(dec, "eos_token_ids", {b})
    tr = dec.generate(ids, method="ngram", num_speculative_tokens=3, max_new_tokens=10)
    s = tr.steps[0]
    assert tr.output_token_ids == [a, b] and tr.stop_reason == "eos"
    assert s.accepted_path == [1, 2, 4] and s.num_accepted == 3 and s.committed_token_ids == [a, b]
    assert s.num_accepted_committed == 2 and not s.emitted_committed
    assert s.num_drafts_discarded == 1  # node 4 (depth 3): after the stop
    # the metrics (specviz.trace.metrics.counted, vLLM's accepted = committed - 1): the EOS is the step's own
    # token, so 1 accepted draft; the nodes deeper than it (2, 3, 4) are discarded, neither accepted nor rejected
    m = tr.metrics
    assert m["num_draft_tokens"] == 5 and m["num_accepted_tokens"] == 1 and m["num_discarded_draft_tokens"] == 3
    assert m["mean_acceptance_length"] == 2.0 and m["acceptance_histogram"][:4] == [0, 1, 0, 0]
    assert m["draft_acceptance_rate"] == pytest.approx(1 / 2)


class SampledTree(FixedTree):
    """Three root children drawn i.i.d. from a fixed q (SpecInfer rule B), one child under each."""

    def __init__(self, vocab):
        super().__init__([], [-1, -1, -1, 0, 1, 2])
        self.q = torch.softmax(torch.linspace(0, 3, vocab), -1)  # [V]

    def propose(self, token_ids, num_tokens=None, context=None):
        x = torch.multinomial(self.q, 6, replacement=True, generator=context.generator)
        return Draft(token_ids=x, probs=self.q.expand(6, -1).clone(), parents=list(self.parents), tree_rule="sampled")


@pytest.mark.parametrize("runner", ["eager", "static"])
def test_rule_a_residual_of_an_accepted_node_is_p_without_its_token(self_decoders, static_self_decoders, runner):
    """Rule A (one-hot q), a self-draft (many accepted nodes): an accepted position's residual is p at its
    parent with the node's token removed: the token is absent, the mass is 1 - p(token), and every other
    top-20 entry is p's renormalised."""
    dec = self_decoders["llama"] if runner == "eager" else static_self_decoders["llama"]
    tr = dec.generate(PROMPT, method="draft_model", num_speculative_tokens=3, max_new_tokens=24, temperature=0.8,
                      speculative_token_tree=TREE, seed=5)
    checked = 0
    for s in tr.steps:
        for pos in s.positions[: s.num_accepted]:
            p_top, resid = dict((int(t), v) for t, v in pos.p_top), dict((int(t), v) for t, v in pos.residual_top)
            assert pos.token_id not in resid and resid
            assert pos.residual_mass == pytest.approx(1.0 - pos.p, abs=1e-5)
            for t, v in resid.items():
                if t in p_top:
                    assert v == pytest.approx(p_top[t] / (1.0 - pos.p), rel=1e-4, abs=1e-6)
            checked += 1
    assert checked >= 5


def test_sampled_children_run_rule_b_end_to_end(self_decoders, monkeypatch):
    dec = self_decoders["llama"]
    proposer = SampledTree(dec.vocab_size)
    monkeypatch.setattr(dec, "make_proposer", lambda cfg, **extras: proposer)
    tr = dec.generate(PROMPT, method="ngram", num_speculative_tokens=2, max_new_tokens=16, temperature=1.0, seed=2)
    assert len(tr.output_token_ids) == 16
    tree_steps = [s for s in tr.steps if len(s.nodes) == 6]
    assert tree_steps and all(s.tree_rule == "sampled" for s in tree_steps)
    for s in tree_steps:
        for n in s.nodes:
            assert n.q == pytest.approx(float(proposer.q[n.token_id]), rel=1e-5)
        if s.emitted.kind == "recovered" and not s.emitted.residual_empty:
            last = s.positions[-1]  # the last rejected child: its residual is the emitted distribution
            assert not last.accepted and last.residual_top == s.emitted.top
    Trace.from_json(tr.to_json())


def test_a_tree_steps_detail_is_queued_with_its_verification_and_picks_the_rows_of_every_row_detail(decoders,
                                                                                                   monkeypatch):
    """The host work of a tree step: the detailed record (top-20 lists, residuals) is computed for EVERY row
    and node by fixed-shape device ops queued with the verification (record.tree_detail_rows, captured in the
    verifier's graphs on CUDA), right behind the tree's forward and before the walk; the record picks the accepted
    path's rows on the host. Each position's p_top is the top-20 of p at its node's parent, the emitted token's p
    is p at the row it was emitted from; generate() and iter_generate() give the same trace."""
    from specviz.sampling import logits_to_probs
    from specviz.sampling.tree import QueuedTreeVerify
    from specviz.verify import StepVerifier

    dec = decoders["llama"]
    log: list[str] = []
    runner_forward = EagerRunner.forward_features  # the decoders fixture runs the target eagerly
    original_queue, original_finish = StepVerifier.queue_tree, QueuedTreeVerify.finish
    probs: list[torch.Tensor] = []

    def forward(self, *a, **k):
        if k.get("parents") is not None and self is dec.target_runner:  # the target's tree forward (not the drafter's)
            log.append("forward")
        return runner_forward(self, *a, **k)

    def queue(self, spec, logits, *a, **k):
        log.append("verify")
        probs.append(logits_to_probs(logits, spec.temperature, spec.top_k, spec.top_p))
        out = original_queue(self, spec, logits, *a, **k)
        assert out.detail is not None  # queued here, with the verification
        return out

    monkeypatch.setattr(EagerRunner, "forward_features", forward)
    monkeypatch.setattr(StepVerifier, "queue_tree", queue)
    monkeypatch.setattr(QueuedTreeVerify, "finish", lambda self, p: (log.append("walk"), original_finish(self, p))[1])
    kw = dict(method="draft_model", num_speculative_tokens=3, max_new_tokens=24, speculative_token_tree=TREE)
    trace = dec.generate(PROMPT, **kw)
    steps = sum(1 for e in log if e == "verify")
    assert steps >= 3 and steps == log.count("walk") == log.count("forward")
    at = {name: [i for i, e in enumerate(log) if e == name] for name in ("forward", "verify", "walk")}
    for s in range(steps):  # each step: forward, verification (with its detail) queued, walk
        assert at["forward"][s] + 1 == at["verify"][s] < at["walk"][s]
    tree_steps = [st for st in trace.steps if st.is_tree]
    assert len(tree_steps) == steps and all(st.positions for st in tree_steps)
    for st, p in zip(tree_steps, probs):
        for m, pos in enumerate(st.positions):  # the row: the accepted path, then the last rejected child
            parent_row = 0 if m == 0 else st.accepted_path[m - 1] + 1
            vals, ids = torch.topk(p[parent_row] / p[parent_row].sum(), 20)
            want = [[int(t), float(v)] for v, t in zip(vals, ids) if v > 0]
            assert [t for t, _ in pos.p_top] == [t for t, _ in want]
            assert [v for _, v in pos.p_top] == pytest.approx([v for _, v in want], rel=1e-6)
        emit_row = 0 if not st.accepted_path else st.accepted_path[-1] + 1
        assert st.emitted.p == pytest.approx(float(p[emit_row, st.emitted.token_id]), rel=1e-6)
    streamed = list(dec.iter_generate(PROMPT, **kw))[-1]
    assert [(s.positions, s.nodes) for s in streamed.steps] == [(s.positions, s.nodes) for s in trace.steps]
