"""One notion of q per view: where a deterministic draft is verified as one-hot (an EAGLE-3 head's argmax at
temperature 0), the decision panel, the chain view and the source table all show the q the verifier used (1) and
call the head's own probability "confidence"; where the head samples (T > 0), they all show the head's q(d_i)."""

from __future__ import annotations

import html
import re

import pytest

from helpers import save_eagle_heads, save_tiny_target
from specviz.viz.common import short_prob, verified_q
from specviz.viz.residual import residual_figure
from specviz.viz.source import source_html
from specviz.viz.tree import node_figure, tree_figure

PROMPT = "def add(a, b):\n    return a + b\n"
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def eagle3_decoder(tmp_path_factory):
    from specviz import SpecDecoder

    root = tmp_path_factory.mktemp("q-views")
    target, model = save_tiny_target(root, layers=4)
    heads = save_eagle_heads(root, model)
    return SpecDecoder.from_pretrained(target, device="cpu", dtype="float32", heads={"eagle3": str(heads["eagle3"])})


def _table(page: str) -> tuple[list[str], list[list[str]]]:
    """(header cells, rows of cells) of the source panel's table, as text."""
    def cells(row: str, tag: str) -> list[str]:
        return [html.unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in re.findall(rf"<{tag}[^>]*>(.*?)</{tag}>", row)]
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", page, flags=re.S)
    return cells(rows[0], "th"), [cells(r, "td") for r in rows[1:]]


def _panel_q(trace, step: int, i: int) -> float:
    """The decision panel's q bar at the drafted token of (step, position i)."""
    fig = residual_figure(trace, step, i)
    bar = next(b for b in fig.data if b.type == "bar" and b.name and b.name.startswith(("draft q", "q (")))
    tok = trace.steps[step].positions[i - 1].token_id
    ids = [int(c[1]) for c in bar.customdata]
    return float(bar.y[ids.index(tok)])


@pytest.mark.parametrize("sampling", ({"temperature": 0.0}, {"temperature": 0.9, "verify": "standard", "seed": 3}))
def test_every_view_shows_the_q_the_verifier_used(eagle3_decoder, sampling):
    tr = eagle3_decoder.generate(PROMPT, method="eagle3", num_speculative_tokens=3, max_new_tokens=16, **sampling)
    greedy = sampling["temperature"] == 0.0
    steps = [st for st in tr.steps if len(st.draft_token_ids) >= 2 and st.positions]
    assert steps
    for st in steps:
        head, rows = _table(source_html(tr, st.index))
        assert "confidence" in head and "q (as verified)" in head and not any("q(" in h for h in head)
        q_col, conf_col = head.index("q (as verified)"), head.index("confidence")
        tree = tree_figure(tr, st.index)
        boxes = " ".join(str(a.text) for a in tree.layout.annotations)
        for i, (row, pos) in enumerate(zip(rows, st.match["positions"]), start=1):
            q = verified_q(st, i)
            node = st.nodes[i - 1]
            assert q == node.q == pytest.approx(_panel_q(tr, st.index, i))  # decision panel = chain view
            if node.fate == "unvisited":  # past a rejection: no test read its p or q, its box says so
                assert "not tested" in boxes
            else:
                assert f"q {short_prob(q)}" in boxes  # the chain view's box
            if greedy:  # an argmax draft: verified as one-hot, whatever the head's confidence
                assert q == 1.0 and row[q_col] == "1 (one-hot)"
                assert pos["head_top_prob"] < 1.0  # a random head is never sure: confidence differs from q
            else:  # a sampled draft: the verifier used the head's q(d_i)
                assert q == pytest.approx(pos["draft_prob"], rel=1e-4) and row[q_col] == short_prob(q)
            assert row[conf_col] == f"{pos['head_top_prob']:.2f}"
            bars = {b.name: b.y[0] for b in node_figure(tr, st.index, node.id).data if b.type == "bar"}
            assert bars["q (as verified)"] == pytest.approx(q)  # the tree view's node panel
        if greedy:
            assert "treats as one-hot" in source_html(tr, st.index)
