"""Uploaded traces are validated as data, every nested field included, and a
brief (detailed_trace=False) trace says the emitted token's p was not recorded."""

from __future__ import annotations

import copy
import json

import pytest

from specviz.trace import Trace, TraceFormatError
from specviz.viz import token_stream_html

PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a"
RUNS = {
    "ngram": dict(method="ngram", prompt_lookup_min=1),
    "ngram_gpu": dict(method="ngram_gpu", prompt_lookup_min=1),
    "suffix": dict(method="suffix"),
    "draft_block": dict(method="draft_model", temperature=0.8, verify="block"),
    "none": dict(method="none"),
    "draft_standard": dict(method="draft_model", temperature=0.8, verify="standard"),
    "draft_tree": dict(method="draft_model", temperature=1.0, verify="standard",
                       speculative_token_tree="[(0,), (1,), (0, 0), (0, 1), (1, 0)]"),
}


@pytest.fixture(scope="module")
def traces(decoders):
    dec = decoders["llama"]
    return {name: dec.generate(PROMPT, num_speculative_tokens=3, max_new_tokens=12, **kw).to_dict()
            for name, kw in RUNS.items()}


def test_every_method_round_trips(traces):
    for name, data in traces.items():
        assert Trace.from_dict(copy.deepcopy(data)).to_dict() == data, name


def _first(data, pred):
    return next(s for s in data["steps"] if pred(s))


MUTATIONS = [
    ("ngram", lambda d: _first(d, lambda s: s["match"].get("n"))["match"].update(occurrences=["x"]), "occurrences[0]"),
    ("ngram", lambda d: _first(d, lambda s: s["match"].get("n"))["match"].update(suffix="12"), "match.suffix"),
    ("ngram", lambda d: _first(d, lambda s: s["match"].get("trie"))["match"]["trie"][0].update(count="many"),
     "trie[0].count"),
    ("ngram", lambda d: d["steps"][0]["match"].update(n=True), "match.n"),
    ("suffix", lambda d: d["steps"][0]["match"].update(candidates=[{"draft": [1, "a"]}]), "candidates[0].draft[1]"),
    ("draft_block", lambda d: _first(d, lambda s: s["block"])["block"].update(P=["nan"]), "block.P[0]"),
    ("draft_block", lambda d: _first(d, lambda s: s["block"])["block"].update(tau=1.5), "block.tau"),
    ("draft_block", lambda d: d["steps"][0].update(timings_ms={"draft": "fast"}), "timings_ms.draft"),
    ("draft_block", lambda d: _first(d, lambda s: s["positions"])["positions"][0].update(p_top=[[1]]), "p_top[0]"),
    ("draft_block", lambda d: d["steps"][0]["emitted"].update(top=[["a", 0.5]]), "emitted.top[0]"),
    ("none", lambda d: d["config"].update(num_speculative_tokens="5"), "config.num_speculative_tokens"),
    ("none", lambda d: d["config"].update(synthetic_rates=[0.5, "x"]), "config.synthetic_rates"),
    ("none", lambda d: d["metrics"].update(acceptance_histogram="x"), "metrics.acceptance_histogram"),
    ("none", lambda d: d["token_texts"].update({"3": 3}), "token_texts.3"),
]


@pytest.mark.parametrize("run, mutate, where", MUTATIONS, ids=[m[2] for m in MUTATIONS])
def test_malformed_nested_fields_are_refused(traces, run, mutate, where):
    data = copy.deepcopy(traces[run])
    mutate(data)
    text = json.dumps(data)
    with pytest.raises(TraceFormatError, match=r"must be") as info:
        Trace.from_json(text)
    assert where in str(info.value)


def test_brief_trace_records_p_as_not_recorded(decoders):
    tr = decoders["llama"].generate(PROMPT, method="ngram", prompt_lookup_min=1, num_speculative_tokens=3,
                                    max_new_tokens=10, detailed_trace=False)
    assert all(s.emitted.p is None for s in tr.steps)
    again = Trace.from_json(tr.to_json())
    assert again.to_dict() == tr.to_dict()
    page = token_stream_html(again)
    assert "p(x) = not recorded" in page and "p(x) = 0" not in page


OUT_OF_RANGE = [  # a hand-edited trace: each probability a view draws, pushed out of [0, 1]
    ("draft_block", lambda d: _first(d, lambda s: s["positions"])["positions"][0].update(p=7.5), "positions[0].p"),
    ("draft_block", lambda d: _first(d, lambda s: s["positions"])["positions"][0].update(q=-0.2), "positions[0].q"),
    ("draft_block", lambda d: _first(d, lambda s: s["positions"])["positions"][0].update(u=1.5), "positions[0].u"),
    ("draft_block", lambda d: _first(d, lambda s: s["positions"])["positions"][0]["p_top"][0].__setitem__(1, 2.0),
     "positions[0].p_top[0][1]"),
    ("draft_block", lambda d: d["steps"][0]["emitted"].update(p=3.0), "emitted.p"),
    ("draft_block", lambda d: _first(d, lambda s: s["nodes"])["nodes"][0].update(q=1.2), "nodes[0].q"),
    ("draft_block", lambda d: _first(d, lambda s: s["block"])["block"]["eta"].__setitem__(0, 1.7), "block.eta[0]"),
    ("draft_block", lambda d: d["metrics"].update(draft_acceptance_rate=1.3), "metrics.draft_acceptance_rate"),
    ("ngram", lambda d: d["metrics"]["acceptance_rate_per_position"].__setitem__(0, -0.5),
     "metrics.acceptance_rate_per_position[0]"),
]


@pytest.mark.parametrize("run, mutate, where", OUT_OF_RANGE, ids=[m[2] for m in OUT_OF_RANGE])
def test_probabilities_out_of_range_are_refused(traces, run, mutate, where):
    data = copy.deepcopy(traces[run])
    assert Trace.from_json(json.dumps(data)).to_dict() == data  # the untouched trace loads (the control)
    mutate(data)
    with pytest.raises(TraceFormatError, match=r"between 0 and 1") as info:
        Trace.from_json(json.dumps(data))
    assert where in str(info.value)


def _rejected(data):
    """(position dict, step dict) of the first chain position a step rejected."""
    st = _first(data, lambda s: s["num_accepted"] < len(s["draft_token_ids"]))
    return st["positions"][st["num_accepted"]], st


def _u_below(d):
    pos, _ = _rejected(d)
    assert pos["accept_prob"] > 0, pos  # room for a u below it
    pos["u"] = pos["accept_prob"] / 2  # a lecturer's edit: rejected, yet u < min(1, p/q)


def _tree_node_flipped(d):
    node = next(n for s in d["steps"] for n in s["nodes"] if n["fate"] == "rejected" and n["u"] is not None
                and n["accept_prob"] and n["accept_prob"] > 0)
    node["u"] = node["accept_prob"] / 2


def _block_tau(d):
    st = _first(d, lambda s: s["block"] and s["num_accepted"] < len(s["draft_token_ids"]))
    st["block"]["eta"] = [0.0] * len(st["block"]["eta"])  # every eta_i <= h_i: tau = k, not num_accepted


CONTRADICTIONS = [("draft_standard", _u_below, "u = "), ("draft_tree", _tree_node_flipped, "nodes["),
                  ("draft_block", _block_tau, "eta_i <= h_i")]


@pytest.mark.parametrize("run, mutate, says", CONTRADICTIONS, ids=[c[0] for c in CONTRADICTIONS])
def test_a_decision_contradicting_its_numbers_is_refused(traces, run, mutate, says):
    """An uploaded trace whose decision disagrees with its own u and acceptance probability (a lecturer's trial:
    the app then printed "u = 0.05 > min(1, p/q) = 0.1306: rejected") is refused at upload, naming the field; the
    untouched trace passes (the control)."""
    from specviz.trace.validate import check_consistency

    data = copy.deepcopy(traces[run])
    check_consistency(Trace.from_json(json.dumps(data)))
    mutate(data)
    with pytest.raises(TraceFormatError, match="contradicts its own numbers") as info:
        check_consistency(Trace.from_json(json.dumps(data)))
    assert says in str(info.value)
