"""The draft-tree view on hand-built trace-v2 steps: one box per node (plus the
root and the step's own token), colours per fate, the layout (a parent between its children, the
emitted token after the last accepted node), the position <-> node mapping of the accepted-path
row, box text that fits its column, the off-path node panel, and chains from version-1 steps."""

from __future__ import annotations

import html
import math

import pytest

from specviz.trace import Emitted, Position, Step, Trace, TreeNode
from specviz.viz import tree as tv

# node: (parent, token, p, u, fate, score); top-k children (q one-hot), accepted path 0 -> 3
SPEC = [(-1, 10, 0.61, 0.20, "accepted", math.log(0.7)), (-1, 11, 0.10, None, "unvisited", math.log(0.2)),
        (0, 12, 0.05, 0.90, "rejected", math.log(0.35)), (0, 13, 0.70, 0.30, "accepted", math.log(0.3)),
        (1, 14, None, None, "unvisited", math.log(0.1)), (2, 15, None, None, "unvisited", math.log(0.2)),
        (3, 16, 0.02, 0.50, "rejected", math.log(0.2)), (3, 17, 0.01, 0.70, "rejected", math.log(0.05))]
PATH = [0, 3]


def _pos(i, tok, p, u, accepted):
    return Position(index=i, token_id=tok, p=p, q=1.0, u=u, accept_prob=p, accepted=accepted, residual_mass=1 - p,
                    p_top=[[tok, p]], q_top=[[tok, 1.0]])


def tree_trace(spec=SPEC, path=PATH, long_token=False) -> Trace:
    depth = {}
    nodes = []
    for i, (parent, tok, p, u, fate, score) in enumerate(spec):
        depth[i] = 1 if parent < 0 else depth[parent] + 1
        nodes.append(TreeNode(id=i, parent=parent, depth=depth[i], token_id=tok, p=p, q=1.0, u=u, fate=fate,
                              score=score))
    path_tokens = [spec[i][1] for i in path]
    row = [*path, 7] if path == PATH else list(path)  # trace v2's row: the path, then the last child tested
    step = Step(index=0, proposer="eagle3", draft_token_ids=[spec[i][1] for i in row], num_accepted=len(path),
                emitted=Emitted(position=len(path) + 1, token_id=18, kind="recovered", p=0.4, top=[[18, 0.5]]),
                positions=[_pos(j + 1, spec[i][1], spec[i][2], spec[i][3], True) for j, i in enumerate(path)],
                committed_token_ids=[*path_tokens, 18],
                match={"kind": "eagle3", "tree": "dynamic", "top_k": 2, "depth": 2, "total_tokens": 9, "levels": 2,
                       "num_candidates": 10, "root_position": 2},
                nodes=nodes, accepted_path=list(path), tree_rule="topk")
    texts = {str(t): f"t{t}" for t in range(30)}
    if long_token:
        texts["13"] = "a_very_long_token_name"
    return Trace(config={"method": "eagle3", "verify": "standard", "num_speculative_tokens": 3, "temperature": 1.0},
                 prompt_token_ids=[1, 2, 3], steps=[step], output_token_ids=[*path_tokens, 18], token_texts=texts)


def _boxes(fig):
    return {a.name: a for a in fig.layout.annotations if (a.name or "").startswith("node ")}


def test_one_box_per_node_and_clickable_markers():
    fig = tv.tree_figure(tree_trace(), 0)
    boxes = _boxes(fig)
    assert len(boxes) == len(SPEC) + 2  # + root + the step's own token
    marks = next(t for t in fig.data if t.name == "nodes")
    assert sorted(c[0] for c in marks.customdata) == [tv.EMITTED, tv.ROOT, *range(len(SPEC))]
    assert fig.layout.meta["tree_nodes"] == len(SPEC) and fig.layout.meta["accepted_path"] == PATH


def test_colours_per_fate():
    fig = tv.tree_figure(tree_trace(), 0)
    boxes = _boxes(fig)
    for i, (*_, fate, _score) in enumerate(SPEC):
        assert boxes[f"node {i}"].bgcolor == tv.NODE_STYLE[fate][0], (i, fate)
    assert boxes[f"node {tv.EMITTED}"].bgcolor == tv.FATE_STYLE["recovered"][0]
    legend = {t.name for t in fig.data if t.showlegend is not False and t.name != "nodes"}
    assert set(tv.NODE_LEGEND.values()) <= legend and tv.FATE_STYLE["recovered"][2] in legend
    # accepted edges are drawn thick and green, the others thinner
    widths = {t.line.color: t.line.width for t in fig.data if t.mode == "lines"}
    assert widths[tv.EDGE_STYLE["accepted"][0]] > widths[tv.EDGE_STYLE["rejected"][0]]


def test_layout_parents_between_children():
    tr = tree_trace()
    nodes, path, _ = tv.step_tree(tr.steps[0])
    place = tv.tree_layout(nodes, path)
    kids = {}
    for n in nodes:
        kids.setdefault(n.parent, []).append(n.id)
    kids.setdefault(path[-1], []).append(tv.EMITTED)
    for parent, cs in kids.items():
        ys = [place[c][1] for c in cs]
        assert min(ys) <= place[parent][1] <= max(ys)
        assert all(place[c][0] == place[parent][0] + 1 for c in cs)
    rows = sorted(y for (_, y), n in zip(place.values(), place) if n not in kids)
    assert rows == list(map(float, range(len(rows))))  # leaves on consecutive rows
    assert place[tv.EMITTED][0] == len(PATH) + 1


def test_position_node_mapping():
    st = tree_trace().steps[0]
    assert [tv.node_for_position(st, i) for i in (1, 2, 3, 4)] == [0, 3, tv.EMITTED, None]
    # node 7: the last child tested below the stop node 3 (the row's rejected position); 6: an earlier one
    assert tv.row_rejected(st) == 7
    assert [tv.position_for_node(st, n) for n in (0, 3, tv.EMITTED, 7, 2, 1, 6, tv.ROOT)] == \
        [1, 2, 3, 3, None, None, None, None]


def test_text_fits_its_column():
    fig = tv.tree_figure(tree_trace(long_token=True), 0)
    boxes = _boxes(fig)
    assert "…" in boxes["node 3"].text  # the long token is cut
    # monospace: a character is about 0.62 em; the first line at 11 px, the number line at 9 px
    longest_px = 0.0
    for a in boxes.values():
        first, *rest = a.text.split("<br>")
        longest_px = max(longest_px, 0.62 * 11 * _chars(first), *(0.62 * 9 * _chars(r) for r in rest))
    assert longest_px + 2 * (2 + 1.5) <= tv.COLUMN_PX * 0.95
    columns = max(x for x in (a.x for a in boxes.values())) + 1
    assert fig.layout.width >= tv.COLUMN_PX * columns
    assert tv.box_text_chars(fig) <= 16


def _chars(markup: str) -> int:
    import html
    import re

    return len(html.unescape(re.sub(r"<[^>]+>", "", markup)))


def test_selected_node_outlined_and_numbers_shown():
    fig = tv.tree_figure(tree_trace(), 0, selected=2)
    boxes = _boxes(fig)
    assert boxes["node 2"].bordercolor == tv.SELECTED_BORDER
    assert boxes["node 3"].bordercolor != tv.SELECTED_BORDER
    assert "p 0.70" in boxes["node 3"].text and "c 0.30" in boxes["node 3"].text  # c = exp(score)
    assert "not tested" in boxes["node 4"].text and "p " not in boxes["node 4"].text  # unvisited: no test read p


def test_node_figure_off_path():
    fig = tv.node_figure(tree_trace(), 0, 2)
    bars = {t.name: t.y[0] for t in fig.data if t.type == "bar"}
    # q as the verifier used it (one-hot) and the draft's confidence exp(log 0.35 - log 0.7) = 0.5
    assert bars == {"target p": 0.05, "q (as verified)": 1.0, "conf. at parent": pytest.approx(0.5),
                    "path conf. c": pytest.approx(0.35)}  # node 2 at depth 2: c = exp(log 0.35), the box's c
    caption = next(a.text for a in fig.layout.annotations if a.name == "caption")
    assert "rejected" in caption and "node 2" in caption
    with pytest.raises(IndexError):
        tv.node_figure(tree_trace(), 0, 99)


def test_tree_step_round_trips_through_json():
    tr = Trace.from_json(tree_trace().to_json())
    fig = tv.tree_figure(tr, 0)
    assert fig.layout.meta["tree_nodes"] == len(SPEC) and fig.layout.meta["tree_rule"] == "topk"


def test_chain_from_version1_trace():
    """A version-1 trace (no nodes) loads as chain nodes (trace.py) and is drawn as a chain."""
    data = tree_trace().to_dict()
    data["version"] = 1
    st = data["steps"][0]
    for name in ("nodes", "accepted_path", "tree_rule"):
        del st[name]
    st["draft_token_ids"], st["num_accepted"], st["committed_token_ids"] = [10, 13, 16], 2, [10, 13, 18]
    st["positions"] = [_pos(1, 10, 0.6, 0.2, True).__dict__, _pos(2, 13, 0.7, 0.3, True).__dict__,
                       _pos(3, 16, 0.02, 0.5, False).__dict__]
    tr = Trace.from_dict(data)
    nodes, path, rule = tv.step_tree(tr.steps[0])
    assert [n.parent for n in nodes] == [-1, 0, 1] and [n.fate for n in nodes] == ["accepted", "accepted", "rejected"]
    assert path == [0, 1] and rule == "chain"
    fig = tv.tree_figure(tr, 0)
    assert len(_boxes(fig)) == 5 and "draft chain" in fig.layout.title.text
    assert [tv.position_for_node(tr.steps[0], n) for n in (0, 1, 2, tv.EMITTED)] == [1, 2, 3, 3]


def test_eagle_panel_draws_acceptance_by_depth_for_tree_runs():
    """An EAGLE-2 tree run fills the EAGLE panel of section 3 (acceptance by depth) instead of saying "no EAGLE
    drafts" (a fresh user found it empty); the empty head-confidence series is left out."""
    from specviz import SpecDecoder
    from specviz.methods.eagle.view import eagle_figure

    dec = SpecDecoder.from_pretrained(device="cpu")  # the bundled target and EAGLE-3 head
    tr = dec.generate("def add(a, b):\n    return", method="eagle3", num_speculative_tokens=5, eagle_tree_top_k=4,
                      eagle_tree_depth=3, eagle_tree_total_tokens=12, max_new_tokens=16)
    assert {st.match.get("tree") for st in tr.steps} == {"dynamic"}
    fig = eagle_figure(tr, 0)
    assert fig.data and all(len(t.y) for t in fig.data)
    assert "no EAGLE drafts" not in str(fig.layout.annotations)


# ---- the run's rates for tree drafts (specviz/trace.py metrics, specviz/viz/stats.py rate set) -----------------
def _chain_step(index=1):
    """A chain step of 3 drafts, 1 accepted, then the recovered token."""
    from specviz.trace import chain_nodes

    pos = [_pos(1, 20, 0.9, 0.1, True), _pos(2, 21, 0.1, 0.8, False), _pos(3, 22, 0.3, None, False)]
    return Step(index=index, proposer="ngram", draft_token_ids=[20, 21, 22], num_accepted=1,
                emitted=Emitted(position=2, token_id=23, kind="recovered", p=0.4, top=[[23, 0.5]]), positions=pos,
                committed_token_ids=[20, 23], nodes=chain_nodes([20, 21, 22], 1, pos), accepted_path=[0])


def test_per_depth_acceptance_of_a_hand_built_tree():
    """SPEC: 8 nodes, depths 1..3, the path 0 -> 3 accepted (2 of the 3 depths). Per node: 2 / 8; per depth:
    depth 1 and 2 accepted in the 1 step that reached them, depth 3 not: 2 / 3."""
    from specviz.trace import compute_metrics

    tree = tree_trace().steps[0]
    m = compute_metrics([tree], 3)
    assert m["num_draft_tokens"] == 8 and m["draft_acceptance_rate"] == pytest.approx(2 / 8)
    assert m["drafted_per_depth"] == [1, 1, 1] and m["accepted_per_position"] == [1, 1, 0]
    assert m["acceptance_rate_per_depth"] == [1.0, 1.0, 0.0]
    assert m["depth_acceptance_rate"] == pytest.approx(2 / 3)
    # a chain's depths are its drafts: there the two rates are one (1 of 3)
    chain = compute_metrics([_chain_step()], 3)
    assert chain["depth_acceptance_rate"] == chain["draft_acceptance_rate"] == pytest.approx(1 / 3)
    # both together: (2 + 1) / (3 + 3) per depth, (2 + 1) / (8 + 3) per node
    both = compute_metrics([tree, _chain_step()], 3)
    assert both["drafted_per_depth"] == [2, 2, 2] and both["depth_acceptance_rate"] == pytest.approx(3 / 6)
    assert both["draft_acceptance_rate"] == pytest.approx(3 / 11)


def test_a_path_that_ends_at_a_leaf_tests_nothing_deeper():
    """SPEC's path 1 -> 4 ends at a leaf at depth 2 of a depth-3 tree: the emitted token is a bonus, no child was
    tested at depth 3, so a = 2 accepted / 2 verified positions and position 3 is not offered (it counted the tree's
    depth: a = 2 / 3, a rejection no chapter shows). The path 0 -> 3 rejected both children at depth 3: 2 / 3."""
    from dataclasses import replace

    from specviz.trace import compute_metrics

    step = tree_trace().steps[0]
    leaf = replace(step, accepted_path=[1, 4], num_accepted=2, draft_token_ids=[11, 14],
                   emitted=Emitted(position=3, token_id=18, kind="bonus", p=0.4, top=[[18, 0.5]]),
                   committed_token_ids=[11, 14, 18])
    m = compute_metrics([leaf], 3)
    assert m["num_verified_positions"] == 2 and m["alpha"] == 1.0
    assert m["offered_per_position"] == [1, 1, 0] and m["conditional_acceptance_rate"] == [1.0, 1.0, 0.0]
    assert m["drafted_per_depth"] == [1, 1, 1]  # depth 3 was drafted (elsewhere in the tree), just not on this path
    rejected = compute_metrics([step], 3)
    assert rejected["num_verified_positions"] == 3 and rejected["alpha"] == pytest.approx(2 / 3)
    assert rejected["offered_per_position"] == [1, 1, 1]


def test_per_depth_acceptance_counts_committed_depths_only():
    """The request stopped (an EOS) at the tree's second accepted token: the step kept two tokens, the last counted
    as its own (accepted = committed - 1 = 1), so depths 2 and 3 are discarded (neither accepted nor drafted for the
    metric), depth 1 was drafted and accepted. Stopped at the first accepted token, the step kept only its own."""
    from dataclasses import replace

    from specviz.trace import compute_metrics

    step = tree_trace().steps[0]
    cut = replace(step, committed_token_ids=step.committed_token_ids[:2])
    m = compute_metrics([cut], 3)
    assert m["num_accepted_tokens"] == 1 and m["num_discarded_draft_tokens"] == 6
    assert m["drafted_per_depth"] == [1, 0, 0] and m["depth_acceptance_rate"] == 1.0
    assert m["draft_acceptance_rate"] == pytest.approx(1 / 2)  # nodes 0 and 1 (depth 1) were drafted
    assert m["mean_acceptance_length"] == 2.0 == 1 + m["num_accepted_tokens"]
    first = compute_metrics([replace(step, committed_token_ids=step.committed_token_ids[:1])], 3)
    assert first["num_accepted_tokens"] == 0 and first["num_discarded_draft_tokens"] == len(step.nodes)
    assert first["drafted_per_depth"] == [0, 0, 0] and first["mean_acceptance_length"] == 1.0


def test_run_summary_says_what_the_rate_means_for_trees():
    """The summary's draft acceptance rate of a tree run says it is per node, and the per-depth acceptance
    stands beside it; a chain run's summary has neither."""
    from specviz.trace import compute_metrics
    from specviz.viz.stats import rate_set, rates_markdown

    tr = tree_trace()
    tr.metrics = compute_metrics(tr.steps, 3)
    rates = {r.key: r for r in rate_set(tr)}
    assert rates["draft_acceptance_rate"].numbers == "2 / 8"
    assert "per node drafted: a tree drafts 8 nodes per step" in rates["draft_acceptance_rate"].note
    assert "at most its depth can be accepted" in rates["draft_acceptance_rate"].note
    # the name says it too: the presentation lesson hides the notes (a lecturer read 0.16 as a failing tree)
    assert rates["draft_acceptance_rate"].name == "draft acceptance rate per node (alternatives count)"
    depth = rates["depth_acceptance_rate"]
    assert depth.value == pytest.approx(2 / 3) and depth.numbers == "2 / 3" and "1: 1/1, 2: 1/1, 3: 0/1" in depth.note
    text = rates_markdown(list(rates.values()))
    assert text.index("draft acceptance rate") < text.index("per-depth acceptance **0.67**")
    new_keys = ("drafted_per_depth", "acceptance_rate_per_depth", "depth_acceptance_rate")
    tr.metrics = {k: v for k, v in tr.metrics.items() if k not in new_keys}  # a trace saved before these metrics
    assert {r.key: r for r in rate_set(tr)}["depth_acceptance_rate"].value == pytest.approx(2 / 3)
    chain = Trace(config=tr.config, prompt_token_ids=[1, 2, 3], steps=[_chain_step(0)], token_texts=tr.token_texts)
    chain_rates = {r.key: r for r in rate_set(chain)}
    assert "depth_acceptance_rate" not in chain_rates
    assert "per node" not in chain_rates["draft_acceptance_rate"].note


# ---- q as verified vs the draft's confidence, and the step's rule ---------------
def _hovers(fig):
    marks = next(t for t in fig.data if t.name == "nodes")
    return {c[0]: h for c, h in zip(marks.customdata, marks.hovertext)}


def test_hover_names_q_as_verified_and_the_draft_confidence():
    """A top-k child is verified with q one-hot (rule A) while the head gave it 0.3 / 0.7 = 0.4286 at its
    parent: the hover names both, and the path confidence c = exp(score) = 0.3 the box shows."""
    hover = _hovers(tv.tree_figure(tree_trace(), 0))[3]
    assert "q (as verified) = 1, one-hot: deterministic top-k child" in hover
    assert "draft confidence at its parent (head softmax) = 0.4286" in hover
    assert "path confidence c = exp(score) = 0.3" in hover
    assert "draft confidence at its parent (head softmax) = 0.7" in _hovers(tv.tree_figure(tree_trace(), 0))[0]  # root child


def test_node_panel_names_both_and_says_why():
    import re

    caption = next(a.text for a in tv.node_figure(tree_trace(), 0, 2).layout.annotations if a.name == "caption")
    caption = " ".join(re.sub(r"<[^>]+>", " ", caption).split())  # the wrapped lines as one text
    assert "q (as verified) = 1, one-hot: deterministic top-k child" in caption
    assert "draft confidence at its parent (head softmax) = 0.5" in caption and "Both are right" in caption
    assert "path confidence c = 0.35 (the product down the path, the tree's c)" in html.unescape(caption)  # box: c 0.35


def _rule_line(tr):
    fig = tv.tree_figure(tr, 0)
    return fig.layout.meta["verified_by"], next(a.text for a in fig.layout.annotations if a.name == "rule")


def test_caption_states_the_rule_of_the_step():
    tr = tree_trace()
    assert _rule_line(tr) == ("topk", tv.RULE_CAPTION["topk"]) and "rule A" in tv.RULE_CAPTION["topk"]
    tr.config["verify"] = "greedy"
    assert _rule_line(tr)[0] == "greedy" and "argmax" in _rule_line(tr)[1]
    tr.config["verify"] = "standard"
    tr.steps[0].tree_rule = "sampled"
    assert _rule_line(tr)[0] == "sampled" and "rule B" in _rule_line(tr)[1]
    hover = _hovers(tv.tree_figure(tr, 0))[3]
    assert "q (as verified) = 1: the draft's probability (children sampled from q)" in hover
    chain = Trace(config={**tr.config, "verify": "block"}, prompt_token_ids=[1, 2, 3], steps=[_chain_step(0)],
                  token_texts=tr.token_texts)
    assert _rule_line(chain)[0] == "block"
    chain.config["verify"] = "standard"
    assert _rule_line(chain) == ("standard", tv.RULE_CAPTION["standard"])


def test_rule_captions_fit_the_narrowest_tree():
    """One line each, at most as wide as the figure's minimum width at 11 px (about 6.2 px a character of
    Plotly's default sans-serif), also at the presentation layout's 1.45x text."""
    from specviz.ui.lesson import PRESENT_FONT_SCALE

    for key, text in tv.RULE_CAPTION.items():
        assert "<br>" not in text and len(text) * 6.2 * PRESENT_FONT_SCALE <= tv.MIN_WIDTH - 20, (key, len(text))


def test_residual_panel_names_the_tree_rule_not_the_chain_test():
    """A tree node's accept test is rule A's r(x) (or rule B's min(1, r/q)), not min(1, p/q): the decision
    panel says so (it printed "u > min(1, p/q) = r(x)", a false formula, for tree steps); chains keep p/q."""
    from specviz.viz.residual import residual_figure

    def caption(trace):
        fig = residual_figure(trace, 0, 1)
        return next(a.text for a in fig.layout.annotations if a.name == "caption"), [t.name for t in fig.data]

    text, names = caption(tree_trace())
    assert "r(x) = " in text and "min(1, p/q)" not in text and "tree rule A" in text
    assert "q (one-hot: top-k child)" in names and "residual max(p−q,0)/Z" not in names
    chain = tree_trace()
    st = chain.steps[0]
    st.nodes, st.tree_rule = [], "chain"
    text, names = caption(chain)
    # (position 1 was accepted: its residual is the chain's, named as not drawn from, since only a rejection samples it)
    assert "min(1, p/q) = " in text and "tree rule" not in text and "residual max(p−q,0)/Z (not drawn from here)" in names


def test_cli_metrics_say_the_tree_rate_is_per_node_and_give_the_per_depth_one():
    from specviz.cli import format_metrics
    from specviz.trace import compute_metrics

    tree = tree_trace()
    tree.metrics = compute_metrics(tree.steps, 3)
    text = format_metrics(tree)
    assert "draft acceptance rate 0.250 (per node drafted)  per-depth acceptance 0.667" in text
    for chain in _chains():  # a version-2 chain step has nodes too (parents i - 1): still a chain
        chain.metrics = compute_metrics(chain.steps, 3)
        assert "per node" not in format_metrics(chain)


def _chains():
    """tree_trace()'s step made a chain two ways: no nodes (as a version-1 trace loaded), and the chain nodes a
    version-2 trace of a chain draft holds (what the engine records)."""
    from specviz.trace import chain_nodes

    bare, noded = tree_trace(), tree_trace()
    bare.steps[0].nodes = []
    st = noded.steps[0]
    st.nodes, st.tree_rule = chain_nodes(st.draft_token_ids, st.num_accepted, st.positions), "chain"
    assert st.nodes and not st.is_tree
    return bare, noded


def test_draft_model_panel_says_tree_children_are_ranked_not_sampled():
    from specviz.methods.draft_model.view import draft_candidates_html

    tree = tree_trace()
    page = draft_candidates_html(tree, tree.steps[0])
    assert "candidate of its rank" in page and "sampled x_i" not in page
    for chain in _chains():
        assert "sampled x_i from the draft's q" in draft_candidates_html(chain, chain.steps[0])


def test_greedy_tree_legend_names_the_argmax_as_the_recovered_token():
    greedy = tree_trace()
    greedy.config["verify"], greedy.config["temperature"] = "greedy", 0.0
    names = [t.name for t in tv.tree_figure(greedy, 0).data]
    assert "recovered token (the target's argmax)" in names and "recovered token (from the residual)" not in names
    assert "recovered token (from the residual)" in [t.name for t in tv.tree_figure(tree_trace(), 0).data]


@pytest.mark.parametrize("verify", ["greedy", "typical"])
def test_decision_panel_of_greedy_and_typical_has_no_residual(verify):
    """Greedy takes the argmax and typical draws from p: neither has a residual (the panel drew one for typical and
    appended 'Z = Σ max(p−q, 0)' to both; typical also drew its recorded one-hot q beside the draft's q)."""
    from specviz.viz.residual import residual_figure

    chain = tree_trace()
    st = chain.steps[0]
    st.nodes, st.tree_rule = [], "chain"
    chain.config.update(verify=verify, temperature=0.0 if verify == "greedy" else 1.0)
    fig = residual_figure(chain, 0, 1)
    text = next(a.text for a in fig.layout.annotations if a.name == "caption")
    names = [t.name for t in fig.data]
    assert "Z = " not in text and not any(n and n.startswith("residual") for n in names)
    if verify == "greedy":
        assert "x is the argmax, accepted" in text
    else:
        assert "q is not read" in text and "ε = " in text


def test_meta_gives_the_geometry_the_presentation_fit_reads():
    """specviz/ui/lesson_script.py svTreeFit computes a row pitch from meta.tree_rows and scales the boxes from
    tree_row_px / tree_box_font: they must be the figure's own rows (its y range) and sizing (its height, its
    boxes' font)."""
    fig = tv.tree_figure(tree_trace(), 0)
    m = fig.layout.meta
    lo, hi = fig.layout.yaxis.range
    assert m["tree_rows"] == round(lo - hi) and m["tree_rows"] >= 2
    fixed = fig.layout.height - m["tree_row_px"] * m["tree_rows"]
    assert fixed == 190 + tv.RULE_LINE_PX + tv.LEGEND_PX and not m["tree_compact"]
    fonts = {a.font.size for a in fig.layout.annotations if (a.name or "").startswith("node ")}
    assert fonts == {m["tree_box_font"]}
    # the legend beside the tree: its rows and longest entry, the bottom margin without them, the depth columns
    assert fig.layout.margin.b == m["tree_margin_b"] + m["tree_legend_px"]
    assert m["tree_legend_chars"] == max(len(t.name) for t in fig.data if t.showlegend is not False and t.name)
    hi_x = fig.layout.xaxis.range[1]
    assert m["tree_columns"] == round(hi_x + 0.45) and m["tree_box_chars"] == tv.TOKEN_CHARS
    # the definitions shortened to their first line: p and c named, the rest in the chapter and the rule line
    defs = next(a.text for a in fig.layout.annotations if a.name == "definitions")
    assert "<br>" in defs and defs.startswith(m["tree_defs_head"] + "<br>")
    assert m["tree_defs_head"].startswith("p = the target's probability") and "c = exp(score)" in m["tree_defs_head"]
