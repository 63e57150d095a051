"""EAGLE tree drafting: EAGLE-2's dynamic tree against a brute-force reference
that runs every candidate's root-to-node path through the head as a plain chain (so a tree mask
letting a node see its cousins, or a wrong per-depth position, changes the logits and fails), the
static tree's child ranks, the tree's shape rules, the head cache keeping committed positions only,
and the knobs' errors. Tiny random target and random heads (fp32, CPU)."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import PROMPT, runner_decoders, save_eagle_heads, save_tiny_target

from specviz import tree
from specviz.methods.eagle.head import build_head, crop_cache
from specviz.methods.eagle.config import head_config_from_target
from specviz.proposer import Outcome, StepContext
from specviz.methods.eagle.proposer import head_taps
from specviz import methods
from specviz.methods.eagle.tree import DynamicTree, EagleTreeProposer
from specviz.tree import DraftTree
from tiny_models import build_model

D = 32
pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: one intra-op thread


@pytest.fixture(scope="module", params=["eagle", "eagle3"])
def head(request):
    target = build_model("llama", seed=3, layers=4, hidden=D)
    torch.manual_seed(11)
    h = build_head(head_config_from_target(target.config, request.param), target).eval()
    # sharpen the random head so its top-k are well separated (no near-ties between chain and tree)
    with torch.no_grad():
        for p in h.parameters():
            p.mul_(1.5)
    return h


def _prefill(prop: EagleTreeProposer, ids: list[int], seed: int = 0) -> None:
    """Tell the proposer of a prompt's (random) target features, as the engine's prefill does."""
    g = torch.Generator().manual_seed(seed)
    feats = {tap: torch.randn(len(ids) - 1, D, generator=g) for tap in prop.taps}
    prop.observe(Outcome(0, [], 0, ids[1:], feats))


@torch.no_grad()
def _chain_logp(head, cache0, root_hidden, path_tokens, n):
    """Brute force: log q after the root-to-node path, run through the head as a chain from the
    committed cache (positions n, n+1, ...)."""
    cache = copy.deepcopy(cache0)
    h = root_hidden
    lg = None
    for m, tok in enumerate(path_tokens):
        h, lg = head(h, torch.tensor([tok]), torch.tensor([n + m]), cache, from_target=False)
    return torch.log_softmax(lg[0].float(), dim=-1), h


def _reference_dynamic(head, cache0, root_hidden, root_logits, n, K, depth, total):
    """EAGLE-2's topK_genrate (docs/design/methods.md 3.1) in plain Python over candidates, with each node's
    distribution from its path run as a chain. Ties: candidate order (the proposer's rule)."""
    cands = []  # dicts: token, score, parent (candidate id or -1), path (tokens)
    lp = torch.log_softmax(root_logits.float(), dim=-1)
    vals, idx = torch.sort(lp, descending=True, stable=True)
    for r in range(K):
        cands.append({"token": int(idx[r]), "score": float(vals[r]), "parent": -1, "path": [int(idx[r])]})
    frontier = list(range(K))
    for _ in range(depth):
        level = []
        for f in frontier:
            lp_f, _ = _chain_logp(head, cache0, root_hidden, cands[f]["path"], n)
            vals, idx = torch.sort(lp_f, descending=True, stable=True)
            for r in range(K):
                level.append({"token": int(idx[r]), "score": cands[f]["score"] + float(vals[r]), "parent": f,
                              "path": cands[f]["path"] + [int(idx[r])]})
        base = len(cands)
        cands.extend(level)
        order = sorted(range(len(level)), key=lambda j: (-level[j]["score"], j))
        frontier = [base + j for j in order[:K]]
    keep = sorted(sorted(range(len(cands)), key=lambda c: (-cands[c]["score"], c))[: total - 1])
    node = {c: i for i, c in enumerate(keep)}
    return ([cands[c]["token"] for c in keep], [node[cands[c]["parent"]] if cands[c]["parent"] >= 0 else -1
                                                 for c in keep], [cands[c]["score"] for c in keep])


def _check_shape(draft, max_nodes, max_depth):
    parents = draft.parents
    assert len(parents) == len(draft) == len(draft.scores) and 0 < len(parents) <= max_nodes
    assert tree.validate_parents(parents) == parents  # -1 <= parents[i] < i
    assert max(tree.depths(parents)) <= max_depth
    toks = draft.token_ids.tolist()
    for kids in tree.children(parents):
        assert len({toks[c] for c in kids}) == len(kids), "siblings must hold distinct tokens"
    assert draft.probs is None and draft.tree_rule == "topk"


@pytest.mark.parametrize("K,depth,total", [(2, 2, 6), (3, 3, 12), (4, 2, 24)])
def test_dynamic_tree_equals_brute_force(head, K, depth, total):
    ids = [5, 17, 33, 9, 41, 2, 77, 12]
    prop = EagleTreeProposer(head, dynamic=DynamicTree(K, depth, total))
    _prefill(prop, ids)
    draft = prop.propose(ids, None, StepContext())
    _check_shape(draft, total - 1, depth + 1)
    n = len(ids) - 1
    cache0 = copy.deepcopy(prop.cache)
    crop_cache(cache0, prop.committed)  # the committed prefix only (the tree's scratch slots dropped)
    hidden, logits = prop._last
    toks, parents, scores = _reference_dynamic(head, cache0, hidden, logits, n, K, depth, total)
    assert draft.token_ids.tolist() == toks
    assert draft.parents == parents
    assert list(draft.scores) == pytest.approx(scores, abs=1e-4)  # a Sequence (lazy host copy)
    # a child's cumulative score never exceeds its parent's (the closure EAGLE-2's rerank relies on)
    for i, p in enumerate(draft.parents):
        if p >= 0:
            assert draft.scores[i] <= draft.scores[p] + 1e-6
    assert draft.details["tree"] == "dynamic" and draft.details["num_candidates"] == K + depth * K * K


def test_static_tree_ranks(head):
    ids = [5, 17, 33, 9, 41, 2, 77, 12]
    choices = "[(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 1, 3)]"
    prop = EagleTreeProposer(head, choices=choices)
    _prefill(prop, ids)
    draft = prop.propose(ids, None, StepContext())
    paths = tree.parse_choices(choices)
    assert draft.parents == tree.choices_parents(paths) and len(draft) == len(paths)
    _check_shape(draft, len(paths), 3)
    n = len(ids) - 1
    cache0 = copy.deepcopy(prop.cache)
    crop_cache(cache0, prop.committed)
    hidden, logits = prop._last
    toks = draft.token_ids.tolist()
    for i, path in enumerate(paths):
        prefix = tree.path_to(draft.parents, i)[:-1]
        if prefix:
            lp, _ = _chain_logp(head, cache0, hidden, [toks[j] for j in prefix], n)
        else:
            lp = torch.log_softmax(logits.float(), dim=-1)
        order = torch.sort(lp, descending=True, stable=True).indices
        assert toks[i] == int(order[path[-1]]), f"node {i} (path {path}) is not the rank-{path[-1]} child"
    assert draft.details["choices"] == [list(p) for p in paths]


def test_depth_capped_by_num_tokens(head):
    ids = [5, 17, 33, 9, 41, 2, 77, 12]
    prop = EagleTreeProposer(head, dynamic=DynamicTree(3, 4, 20))
    _prefill(prop, ids)
    draft = prop.propose(ids, 2, StepContext())
    _check_shape(draft, 19, 2)
    static = EagleTreeProposer(head, choices=[[0], [0, 0], [0, 0, 0], [1]])
    _prefill(static, ids)
    assert static.propose(ids, 2, StepContext()).parents == [-1, -1, 0]


def test_head_cache_keeps_committed_positions_only(head):
    """After a tree step and a partial accept, the head's K/V at every committed position equals a
    fresh first pass over the committed (feature, token) pairs (docs/design/methods.md 1.2, 11.3)."""
    ids = [5, 17, 33, 9, 41, 2, 77, 12]
    g = torch.Generator().manual_seed(4)
    feats = {tap: torch.randn(len(ids) + 12, D, generator=g) for tap in head_taps(head.config)}
    prop = EagleTreeProposer(head, dynamic=DynamicTree(3, 2, 10))
    prop.observe(Outcome(0, [], 0, ids[1:], {t: f[: len(ids) - 1] for t, f in feats.items()}))
    draft = prop.propose(ids, None, StepContext())
    assert prop.cache.get_seq_length() > prop.committed  # the tree's scratch slots were written
    path = tree.path_to(draft.parents, len(draft) - 1)  # a root-to-node path (the last node: a deep one)
    accepted = [int(draft.token_ids[j]) for j in path]
    committed = accepted + [99]  # the accepted path + the recovered/bonus token
    n = len(ids) - 1
    prop.observe(Outcome(n, accepted, len(accepted), committed,
                         {t: f[n: n + len(committed)] for t, f in feats.items()}))
    ids2 = ids + committed
    prop.propose(ids2, None, StepContext())
    fresh = EagleTreeProposer(head, dynamic=DynamicTree(3, 2, 10))
    fresh.observe(Outcome(0, [], 0, ids2[1:], {t: f[: len(ids2) - 1] for t, f in feats.items()}))
    fresh._first_pass()
    L = prop.committed
    assert L == len(ids2) - 1 == fresh.committed
    for layer_a, layer_b in zip(prop.cache.layers, fresh.cache.layers):
        torch.testing.assert_close(layer_a.keys[:, :, :L], layer_b.keys[:, :, :L], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(layer_a.values[:, :, :L], layer_b.values[:, :, :L], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("knobs,match", [
    ({"top_k": 0}, "eagle_tree_top_k"),
    ({"depth": -1}, "eagle_tree_depth"),
    ({"total_tokens": 1}, "eagle_tree_total_tokens"),
    ({"total_tokens": tree.MAX_TREE_NODES + 2}, "at most"),
    ({"top_k": 2, "depth": 1, "total_tokens": 8}, "candidates"),
])
def test_invalid_knobs(knobs, match):
    with pytest.raises(ValueError, match=match):
        DynamicTree(**knobs)


def test_invalid_choices_and_settings(head):
    with pytest.raises(ValueError, match="parent path"):
        EagleTreeProposer(head, choices="[(0,), (1, 0)]")
    with pytest.raises(ValueError, match="not a list of tuples"):
        EagleTreeProposer(head, choices="[(0,), (0, 0")
    with pytest.raises(ValueError, match="exactly one"):
        EagleTreeProposer(head)

    with pytest.raises(ValueError, match="not both"):
        DraftTree.from_settings({"eagle_tree_top_k": 4, "speculative_token_tree": "[(0,)]"}, "eagle", methods.names())
    assert DraftTree.from_settings({"eagle_tree_top_k": 4}, "eagle", methods.names()) == DraftTree(
        "dynamic", dynamic=DynamicTree(4, 6, 32))


@pytest.mark.parametrize("settings,match", [
    ({"method": "ngram", "eagle_tree_top_k": 4}, "applies to method"),
    ({"method": "eagle", "ngram_tree_branches": 2}, "applies to method"),
    ({"method": "eagle3", "eagle_tree_top_k": 0}, "eagle_tree_top_k must be"),
    ({"method": "eagle3", "eagle_tree_total_tokens": 500}, "at most"),
    ({"method": "ngram", "ngram_tree_branches": 0}, "ngram_tree_branches must be"),
    ({"method": "suffix", "suffix_tree_branches": -2}, "suffix_tree_branches must be"),
])
def test_generate_settings_refused_early(settings, match):
    from specviz.config import GenerationConfig

    with pytest.raises(ValueError, match=match):
        GenerationConfig.from_settings(**settings)


def test_block_verification_refused_for_trees():
    from specviz.config import GenerationConfig

    with pytest.raises(ValueError, match="chain-only"):
        GenerationConfig.from_settings(method="ngram", ngram_tree_branches=2, verify="block", temperature=1.0)


# ---- end to end through the engine (tree forward, tree verifier, trace v2) ----------------------------


@pytest.fixture(scope="module")
def decoders(tmp_path_factory):
    """{runner: SpecDecoder} on a tiny 4-layer Llama with one random head of each kind (fp32)."""
    root = tmp_path_factory.mktemp("eagle_tree")
    target, model = save_tiny_target(root, layers=4, hidden=D)
    return runner_decoders(target, save_eagle_heads(root, model))


TREES = [("eagle", {"eagle_tree_top_k": 3, "eagle_tree_depth": 3, "eagle_tree_total_tokens": 16}),
         ("eagle3", {"eagle_tree_top_k": 4, "eagle_tree_depth": 2, "eagle_tree_total_tokens": 24}),
         ("eagle3", {"speculative_token_tree": "[(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]"}),
         ("ngram", {"ngram_tree_branches": 2, "prompt_lookup_min": 1, "prompt_lookup_max": 3}),
         ("suffix", {"suffix_tree_branches": 3})]


@pytest.mark.parametrize("runner", ["eager", "static"])
@pytest.mark.parametrize("method,tree_settings", TREES)
def test_tree_greedy_equals_plain_greedy(decoders, runner, method, tree_settings):
    dec = decoders[runner]
    plain = dec.generate(PROMPT, method="none", max_new_tokens=24)
    tr = dec.generate(PROMPT, method=method, num_speculative_tokens=4, max_new_tokens=24, **tree_settings)
    assert tr.output_token_ids == plain.output_token_ids
    trees = [st for st in tr.steps if st.tree_rule == "topk"]
    if method.startswith("eagle"):
        assert trees, "the EAGLE head drafted no tree"
    for st in trees:
        assert max(n.depth for n in st.nodes) <= 4  # num_speculative_tokens caps the depth
        assert st.num_accepted == len(st.accepted_path)
        assert [st.nodes[c].token_id for c in st.accepted_path] == st.committed_token_ids[: st.num_accepted]


def test_tree_at_temperature_runs_rule_a(decoders):
    tr = decoders["eager"].generate(PROMPT, method="eagle3", num_speculative_tokens=4, max_new_tokens=20,
                                    temperature=1.0, seed=3, eagle_tree_top_k=3, eagle_tree_depth=3,
                                    eagle_tree_total_tokens=12)
    assert len(tr.output_token_ids) == 20 and all(st.tree_rule == "topk" for st in tr.steps if st.nodes)
    tested = [n for st in tr.steps for n in st.nodes if n.fate != "unvisited"]
    assert tested and all(n.u is not None for n in tested)
    from specviz.viz.tree import tree_figure

    fig = tree_figure(tr, 1)
    assert fig.layout.meta["tree_nodes"] == len(tr.steps[1].nodes)


def test_every_tree_node_has_its_text(decoders):
    tr = decoders["eager"].generate(PROMPT, method="eagle3", num_speculative_tokens=4, max_new_tokens=12,
                                    eagle_tree_top_k=4, eagle_tree_depth=3, eagle_tree_total_tokens=30)
    missing = {n.token_id for st in tr.steps for n in st.nodes} - {int(t) for t in tr.token_texts}
    assert not missing


@pytest.mark.parametrize("runner", ["eager", "static"])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_bundled_eagle3_tree_equals_plain_greedy(device, runner):
    """The bundled target and EAGLE-3 head (fp32): the EAGLE-2 tree's output equals plain greedy decoding (as
    the chain's) over all 48 tokens (the prompt ends mid-statement, so the target does not stop at once), and
    the tree steps accepted drafts."""
    from specviz import SpecDecoder

    dec = SpecDecoder.from_pretrained(device=device, dtype="float32", runner=runner)
    prompt = "class LlamaMLP(nn.Module):\n    def __init__(self, config):\n        super().__init__()\n        self."
    plain = dec.generate(prompt, method="none", max_new_tokens=48)
    chain = dec.generate(prompt, method="eagle3", num_speculative_tokens=6, max_new_tokens=48)
    tree = dec.generate(prompt, method="eagle3", num_speculative_tokens=6, max_new_tokens=48, eagle_tree_top_k=4,
                        eagle_tree_depth=5, eagle_tree_total_tokens=24)
    assert len(plain.output_token_ids) == 48  # a comparison over every token, not a first-token EOS
    assert tree.output_token_ids == plain.output_token_ids == chain.output_token_ids
    assert any(len(st.nodes) > max(n.depth for n in st.nodes) for st in tree.steps if st.nodes)  # branching trees
    assert tree.metrics["num_accepted_tokens"] >= len(tree.steps)  # at least one accepted draft per step on average
    if runner == "static" and device == "cuda":  # each tree: one CUDA graph of the pooled static head runner
        head_runner, = dec.pool.free(("head", id(dec.heads["eagle3"])))
        drafts = {key: g for key, g in head_runner.graphs.items() if key[0] == "eagle2"}
        assert ("eagle2", 4, 5, 24) in drafts and all(g is not None for g in drafts.values()), drafts


@pytest.mark.parametrize("tree_kw", [dict(dynamic=DynamicTree(3, 3, 12)), dict(dynamic=DynamicTree(4, 2, 24)),
                                     dict(choices="[(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 1, 3)]")],
                         ids=["dynamic-3-3-12", "dynamic-4-2-24", "static"])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("compiled", [False, True], ids=["plain", "compiled"])
def test_static_head_runner_trees_equal_the_eager_ones(head, tree_kw, device, compiled):
    """The static head runner's tree levels (scratch slots past max_len, the visibility mask over every slot;
    on CUDA a dynamic tree is one captured graph and a static tree's levels one graph per width) draft the eager
    runner's trees, step after step
    (after a partial accept too): same tokens, parents, and scores. Compiled: the levels and the whole EAGLE-2
    draft through torch.compile ("aot_eager" on the CPU, inductor inside the graphs on CUDA; scores to
    inductor's fusion rounding there)."""
    from specviz.methods.eagle.runner import StaticHeadRunner

    if compiled and device == "cuda" and tree_kw.get("dynamic") == DynamicTree(3, 3, 12):
        pytest.skip("one dynamic tree is compiled on the GPU (inductor's compile time); 4-2-24 covers it")
    ids = [5, 17, 33, 9, 41, 2, 77, 12]
    g = torch.Generator().manual_seed(4)
    head = copy.deepcopy(head).to(device)  # on CUDA the static runner's whole EAGLE-2 draft is one captured graph
    head._shared = tuple(m.to(device) for m in head._shared)  # the (copied) target's embedding and LM head
    feats = {tap: torch.randn(len(ids) + 20, D, generator=g).to(device) for tap in head_taps(head.config)}
    if compiled:
        torch._dynamo.reset()
    backend = "inductor" if device == "cuda" else "aot_eager"
    static = StaticHeadRunner(head, 64, compile=compiled, compile_backend=backend)
    tol = 1e-4 if compiled and device == "cuda" else 1e-5
    props = {"eager": EagleTreeProposer(head, **tree_kw), "static": EagleTreeProposer(head, **tree_kw, runner=static)}
    for prop in props.values():
        prop.observe(Outcome(0, [], 0, ids[1:], {t: f[: len(ids) - 1] for t, f in feats.items()}))
    context = list(ids)
    for step in range(3):
        drafts = {name: prop.propose(context, None, StepContext()) for name, prop in props.items()}
        a, b = drafts["eager"], drafts["static"]
        assert b.token_ids.tolist() == a.token_ids.tolist(), step
        assert b.parents == a.parents, step
        assert list(b.scores) == pytest.approx(list(a.scores), abs=tol), step
        path = tree.path_to(a.parents, len(a) - 1)[: 1 + step % 2]  # accept one or two nodes of a path
        accepted = [int(a.token_ids[j]) for j in path]
        committed = accepted + [99 - step]
        n = len(context) - 1
        for prop in props.values():
            prop.observe(Outcome(n, accepted, len(accepted), committed,
                                 {t: f[n: n + len(committed)] for t, f in feats.items()}))
        context += committed
    if device == "cuda":  # the graphs ran (the dynamic tree as one graph, a static tree's levels one graph each)
        assert static.replays > 0 and static.graphs and all(g is not None for g in static.graphs.values())
    assert static.compiled == compiled  # no compile fallback


def test_a_tree_larger_than_the_static_head_runners_scratch_is_refused(head):
    """top_k x depth rows per step beyond the static head runner's scratch slots: a clear ValueError when the
    proposer is made (before, the levels past the scratch ran on the slot cache with stale slot indices)."""
    from specviz.methods.eagle.runner import TREE_SCRATCH, StaticHeadRunner

    runner = StaticHeadRunner(head, 64, cuda_graphs=False)
    with pytest.raises(ValueError, match="static head runner holds"):
        EagleTreeProposer(head, dynamic=DynamicTree(TREE_SCRATCH // 4 + 1, 4, 24), runner=runner)
    EagleTreeProposer(head, dynamic=DynamicTree(TREE_SCRATCH // 4 + 1, 4, 24))  # the eager runner has no bound
