"""The token stream's and the step grid's hovers state the run's own verification rule: its acceptance test with its
numbers, and where the step's own token came from (not the standard rule's u against min(1, p/q) for every rule)."""

from __future__ import annotations

import html
import re

import pytest

from specviz import SpecDecoder
from specviz.viz.grid import grid_cells
from specviz.viz.stream import token_stream_html

PROMPT = "class LlamaMLP(nn.Module):\n    def __init__(self, config):\n"


@pytest.fixture(scope="module")
def dec():
    return SpecDecoder.from_pretrained(device="cpu")


def _hovers(trace) -> dict[str, list[str]]:
    """{fate: [stream hover text, as the browser shows it]} of the run; an accepted stop token counts as accepted."""
    out: dict[str, list[str]] = {}
    for fate, title in re.findall(r'data-fate="(\w+)"[^>]*title="([^"]*)"', token_stream_html(trace)):
        text = html.unescape(title)
        assert "&lt;" not in text and "&amp;" not in text, text  # escaped once, for the attribute only
        out.setdefault("accepted" if fate == "stop" else fate, []).append(text)
    return out


def _run(dec, verify, temperature=0.8, **kw):
    """A run of ``verify`` that rejected at least once (seeds tried in turn)."""
    for seed in range(20):
        trace = dec.generate(PROMPT, method="draft_model", num_speculative_tokens=4, verify=verify,
                             temperature=temperature, seed=seed, max_new_tokens=24, **kw)
        if any(s.num_accepted < len(s.draft_token_ids) for s in trace.steps):
            return trace
    pytest.fail(f"no rejection in 20 seeds of {verify}")


def test_typical_hovers_name_the_entropy_threshold_and_a_draw_from_p(dec):
    h = _hovers(_run(dec, "typical"))
    assert all("Typical acceptance" in t and "u = " not in t for t in h["accepted"] + h["rejected"])
    assert all("drawn from the target's p itself" in t and "r(x)" not in t for t in h["recovered"])
    assert not any("max(p - q, 0)" in t for ts in h.values() for t in ts)


def test_synthetic_hovers_name_the_given_rate_not_p_over_q(dec):
    h = _hovers(_run(dec, "synthetic", synthetic_rates=[0.6, 0.5, 0.4, 0.3]))
    tested = h["accepted"] + h["rejected"]
    assert tested and all(re.search(r"a_\d", t) and "min(1, p/q)" not in t for t in tested)
    assert all("not lossless" in t for t in h["recovered"])


def test_greedy_hovers_name_the_argmax_and_no_uniform(dec):
    h = _hovers(_run(dec, "greedy", temperature=0.0))
    assert all("argmax" in t and "u = " not in t for t in h["accepted"] + h["rejected"])


def test_block_and_standard_hovers_keep_their_own_tests(dec):
    block = _hovers(_run(dec, "block"))
    assert all("Block test" in t for t in block["accepted"] + block["rejected"])
    assert all("block residual" in t for t in block["recovered"])
    std = _hovers(_run(dec, "standard"))
    assert all("min(1, p/q)" in t for t in std["accepted"] + std["rejected"])
    assert all("max(p - q, 0)/Z" in t and "r(x)" in t for t in std["recovered"])


def test_a_tree_runs_hovers_name_rule_a(dec):
    for seed in range(20):
        trace = dec.generate(PROMPT + "        super().__init__()\n", method="eagle3", num_speculative_tokens=5,
                             temperature=0.8, seed=seed, max_new_tokens=24, eagle_tree_top_k=3, eagle_tree_depth=4,
                             eagle_tree_total_tokens=16)
        if len(trace.steps) > 2 and any(s.is_tree for s in trace.steps):
            break
    h = _hovers(trace)
    assert all("Rule A" in t for t in h.get("accepted", []) + h.get("rejected", []))
    assert all("rule A's residual" in t for t in h.get("recovered", []))
    assert h.get("accepted") or h.get("rejected")


def test_the_grid_hovers_match_the_stream(dec):
    trace = _run(dec, "typical")
    _, _, hovers = grid_cells(trace)
    flat = [t for row in hovers for t in row if t]
    assert any("Typical acceptance" in t for t in flat) and not any("min(1, p/q) = " in t for t in flat)
    assert any("drawn from the target's p itself" in t for t in flat)


def test_a_typical_runs_draft_tree_shows_no_q_the_rule_never_read(dec):
    """Typical acceptance tests p alone: the tree view's boxes show p only, its legend and hovers say q is not read,
    and the step's own token is labelled a draw from p, not from a residual."""
    from specviz.viz.tree import tree_figure

    trace = _run(dec, "typical")
    step = next(s.index for s in trace.steps if s.num_accepted < len(s.draft_token_ids))
    fig = tree_figure(trace, step)
    texts = [a.text for a in fig.layout.annotations] + [str(t.text) for t in fig.data if t.text is not None]
    hovers = [str(t.hovertext) + str(t.hovertemplate) for t in fig.data]
    names = [t.name for t in fig.data if t.name]
    assert not any(re.search(r"· q [\d—]", t) for t in texts), texts  # no "p 0.30 · q 1.00" box
    assert any("q is not read" in t for t in texts)
    assert any("q: not read" in h for h in hovers) and not any("u = " in h for h in hovers)
    assert any("drawn from p" in n for n in names) and not any("from the residual" in n for n in names)


def test_a_position_after_the_rejection_gets_no_verdict_in_the_grid(dec):
    """Draft positions after the first rejection were never tested: the grid says so instead of a verdict."""
    for seed in range(30):
        trace = _run(dec, "standard") if seed == 0 else dec.generate(
            PROMPT, method="draft_model", num_speculative_tokens=4, verify="standard", temperature=0.8, seed=seed,
            max_new_tokens=24)
        steps = [s for s in trace.steps if s.num_accepted + 1 < len(s.draft_token_ids) == len(s.positions)]
        if steps:
            break
    _, _, hovers = grid_cells(trace)
    st = steps[0]
    unused = hovers[st.index][st.num_accepted + 1]  # the draft column after the rejected one
    assert "never tested" in unused and "rejected" not in unused.split("<br>", 1)[1].replace("was rejected", "")
    assert "min(1, p/q)" not in unused


def test_block_without_details_still_names_the_block_residual(dec):
    trace = dec.generate(PROMPT, method="draft_model", num_speculative_tokens=4, verify="block", temperature=0.8,
                         seed=3, max_new_tokens=24, detailed_trace=False)
    h = _hovers(trace)
    assert h.get("recovered") and all("block residual" in t for t in h["recovered"])


def test_a_typical_chain_is_titled_a_chain(dec):
    from specviz.viz.tree import tree_figure

    trace = _run(dec, "typical")
    step = next(s.index for s in trace.steps if s.num_accepted < len(s.draft_token_ids))
    title = tree_figure(trace, step).layout.title.text
    assert "draft chain" in title and "recovered" not in title
