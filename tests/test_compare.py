"""The comparison runner: metrics on hand-built traces (both acceptance-length conventions, pooling over
requests, zero-draft runs, Wilson intervals, speedups), losslessness checks, the same-draft replay of
every rule (against the engine's own decisions), JSON export/import and the CLI."""

from __future__ import annotations

import csv
import io
import json
import math
import re

import pytest
import torch

from specviz.compare import (
    Comparison,
    ComparisonFormatError,
    Prompt,
    RunConfig,
    RunResult,
    losslessness,
    new_comparison,
    pooled_metrics,
    pooled_row,
    run_comparison,
    same_draft_rules,
    table,
    table_csv,
    wilson_interval,
)
from specviz import methods
from specviz.compare import comparison_from_dict, load_comparison
from specviz.trace import Emitted, Position, Step, Trace, acceptance_length
from specviz.tree import DraftTree

LOOKUP_1_3 = (("prompt_lookup_max", 3), ("prompt_lookup_min", 1))  # prompt lookup's bounds, a config's options


def _step(i, draft, acc, committed, kind=None, ms=(1.0, 10.0, 1.0), positions=None):
    kind = kind or ("target" if not draft else ("bonus" if acc == len(draft) else "recovered"))
    return Step(index=i, proposer="x", draft_token_ids=list(draft), num_accepted=acc,
                emitted=Emitted(position=acc + 1, token_id=committed[-1], kind=kind, p=0.5),
                positions=positions or [], committed_token_ids=list(committed),
                timings_ms={"draft": ms[0], "verify": ms[1], "sample": ms[2]})


def _trace(steps, method="ngram", k=3, seed=0, temperature=0.0, verify="greedy"):
    out = [t for s in steps for t in s.committed_token_ids]
    return Trace(config={"method": method, "num_speculative_tokens": k, "verify": verify, "temperature": temperature,
                         "seed": seed}, prompt_token_ids=[1, 2], steps=steps, output_token_ids=out)


def trace_a():
    """4 steps: no draft; 3 drafted, 3 accepted (+bonus); 3 drafted, 1 accepted (+recovered); no draft."""
    return _trace([_step(0, [], 0, [5]), _step(1, [6, 7, 8], 3, [6, 7, 8, 9]), _step(2, [1, 2, 3], 1, [1, 4]),
                   _step(3, [], 0, [7])])


def trace_b():
    """1 step: 2 drafted, none accepted (+recovered)."""
    return _trace([_step(0, [3, 4], 0, [9])])


def test_both_acceptance_length_conventions_and_coverage():
    m = pooled_metrics([trace_a()], 3)
    assert m.mean_acceptance_length == pytest.approx(1 + 4 / 2)  # vLLM: drafting steps only
    assert m.tokens_per_target_forward == pytest.approx(8 / 4)  # tokens per target forward: every step counts
    assert m.draft_coverage == pytest.approx(2 / 4)
    assert m.offered_per_position == [2, 2, 1]  # position 3 verified only where 1 and 2 were accepted
    assert m.accepted_per_position == [2, 1, 1]
    # the convention switch's three readings of the same counts (trace.ACCEPTANCE_LENGTH_CONVENTIONS)
    assert acceptance_length(m, "vllm") == pytest.approx(3.0)  # 1 + 4 accepted / 2 drafts
    assert acceptance_length(m, "per_forward") == pytest.approx(2.0)  # 8 tokens / 4 steps
    assert acceptance_length(m, "drafts_only") == pytest.approx(2.0)  # 4 accepted / 2 drafts
    none = pooled_metrics([_none_trace([1, 2])], 1)
    assert acceptance_length(none, "vllm") is None and acceptance_length(none, "per_forward") == 1.0
    row = pooled_row(_comparison([trace_a()], [_none_trace([1, 2, 3, 4, 5, 6, 7, 8])]), 1)
    assert row["acceptance_length"] == {"vllm": 3.0, "per_forward": 2.0, "drafts_only": 2.0}
    with pytest.raises(ValueError, match="per_forward"):
        acceptance_length(m, "sglang")


def test_pooling_is_step_weighted_not_a_mean_of_request_means():
    a, b = pooled_metrics([trace_a()], 3), pooled_metrics([trace_b()], 3)
    both = pooled_metrics([trace_a(), trace_b()], 3)
    assert (a.mean_acceptance_length, b.mean_acceptance_length) == (3.0, 1.0)
    assert both.mean_acceptance_length == pytest.approx(1 + 4 / 3)  # not (3 + 1) / 2
    assert both.tokens_per_target_forward == pytest.approx(9 / 5)
    assert both.draft_acceptance_rate == pytest.approx(4 / 8)


def test_wilson_interval_matches_the_closed_form():
    z = 1.959963984540054
    for s, n in ((8, 10), (0, 5), (5, 5), (37, 120)):
        p = s / n
        centre = (p + z * z / (2 * n)) / (1 + z * z / n)
        half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
        lo, hi = wilson_interval(s, n)
        assert lo == pytest.approx(max(centre - half, 0.0), abs=1e-9)
        assert hi == pytest.approx(min(centre + half, 1.0), abs=1e-9)
    assert wilson_interval(0, 0) == (0.0, 1.0)


def _comparison(spec_traces, none_traces, cfg=RunConfig("ngram", 3, "greedy", 0.0)):
    c = Comparison([RunConfig("none", 1, "greedy", 0.0), cfg], [Prompt("a", "x"), Prompt("b", "y")], [0], 16)
    for p, t in enumerate(none_traces):
        c.runs.append(RunResult(0, p, 0, t, 1.0))
    for p, t in enumerate(spec_traces):
        c.runs.append(RunResult(1, p, 0, t, 1.0))
    return c


def _none_trace(tokens, ms=(0.0, 10.0, 1.0)):
    return _trace([_step(i, [], 0, [t], ms=ms) for i, t in enumerate(tokens)], method="none", k=1)


def test_row_speedups_time_split_and_conditional_rates():
    spec = [trace_a(), trace_b()]
    none = [_none_trace([5, 6, 7, 8, 9, 1, 4, 7]), _none_trace([9])]
    row = pooled_row(_comparison(spec, none), 1)
    # decode time: spec 5 steps x 12 ms = 60 ms for 9 tokens; none 9 steps x 11 ms = 99 ms for 9 tokens
    assert row["tokens_per_s"] == pytest.approx(9 / 0.060)
    assert row["speedup"] == pytest.approx((9 / 0.060) / (9 / 0.099))
    assert row["ms_per_step"] == pytest.approx({"draft": 1.0, "verify": 10.0, "sample": 1.0})
    assert row["step_cost"]["verify"] == pytest.approx(10 / 11)
    # cost model: a = 4 accepted / 6 verified positions (offered 3, 2, 1), k = 8 drafted / 3 drafts, g = 3/5
    m = pooled_metrics(spec, 3)
    a = m.num_accepted_tokens / sum(m.offered_per_position)
    k, g = 8 / 3, 3 / 5
    expected = ((1 - g) + g * (1 - a ** (k + 1)) / (1 - a)) / (1 + 1.0 / 11)
    assert row["predicted_speedup"] == pytest.approx(expected)
    cond = row["conditional"]
    assert [c["n"] for c in cond] == m.offered_per_position
    assert cond[0]["rate"] == pytest.approx(2 / 3) and cond[0]["low"] < 2 / 3 < cond[0]["high"]
    assert row["lossless"]["ok"] is True and row["lossless"]["badge"].startswith("✓")


def test_zero_draft_row():
    none = [_none_trace([1, 2, 3]), _none_trace([4])]
    row = pooled_row(_comparison([], none), 0)
    assert row["mean_acceptance_length"] is None and row["draft_coverage"] == 0.0
    assert row["conditional"] == [] and row["predicted_speedup"] is None
    assert row["speedup"] == pytest.approx(1.0) and row["tokens_per_target_forward"] == 1.0


def test_greedy_losslessness_flags_a_different_output():
    none = [_none_trace([5, 6, 7, 8, 9, 1, 4, 7]), _none_trace([8])]  # prompt b differs from trace_b's [9]
    check = losslessness(_comparison([trace_a(), trace_b()], none), 1)
    assert check["ok"] is False and "prompt 2" in check["detail"] and "token 1" in check["detail"]


def test_csv_has_one_row_per_configuration():
    c = _comparison([trace_a(), trace_b()], [_none_trace([5, 6, 7, 8, 9, 1, 4, 7]), _none_trace([9])])
    rows = list(csv.DictReader(io.StringIO(table_csv(c))))
    assert [r["label"] for r in rows] == ["none T=0", "ngram k=3 greedy T=0"]
    assert float(rows[1]["mean_acceptance_length"]) == pytest.approx(1 + 4 / 3, rel=1e-5)
    assert rows[1]["conditional_acceptance"].startswith("0.667[")


def _pos(p, q, u, top):
    return Position(index=0, token_id=0, p=p, q=q, u=u, accept_prob=min(1.0, p / q), accepted=False,
                    residual_mass=0.0, p_top=top)


def test_same_draft_rules_on_a_hand_built_one_hot_step():
    # drafts 6, 7, 8 with q one-hot; p(x) = 0.9, 0.3, 0.8; argmax p = 6, 2, 8; u = 0.5, 0.5, 0.1
    pos = [_pos(0.9, 1.0, 0.5, [[6, 0.9]]), _pos(0.3, 1.0, 0.5, [[2, 0.6]]), _pos(0.8, 1.0, 0.1, [[8, 0.8]])]
    t = _trace([_step(0, [6, 7, 8], 1, [6, 2], positions=pos)], temperature=1.0, verify="standard")
    rules = same_draft_rules(t)
    assert rules["greedy"] == [1]  # 7 is not argmax
    assert rules["standard"] == [1]  # u_2 = 0.5 > 0.3
    # block: P = 0.9, 0.27, 0.216; h_1 = 0.9*0.7/(0.63+0.1), h_2 = 0.27*0.2/(0.054+0.73), h_3 = P_3
    h = [0.63 / 0.73, 0.054 / 0.784, 0.216]
    assert [0.5 <= h[0], 0.5 <= h[1], 0.1 <= h[2]] == [True, False, True]
    assert rules["block"] == [3]  # the last pass wins: a later pass overrides an earlier fail


def test_the_same_draft_figure_says_it_is_one_run_and_why_block_may_equal_standard():
    """A lecturer read "block = standard on all 17 steps" against the table's block AL 2.81 vs standard 2.40 as a
    contradiction. The figure's title names the one run (its seed) it replays, and the note beside it says why block
    equals standard at steps where p >= q and that its gain is on average, over the table's many runs."""
    from specviz.viz.compare import RULES_VS_TABLE, rules_figure

    pos = [_pos(0.9, 1.0, 0.5, [[6, 0.9]]), _pos(0.3, 1.0, 0.5, [[2, 0.6]]), _pos(0.8, 1.0, 0.1, [[8, 0.8]])]
    t = _trace([_step(0, [6, 7, 8], 1, [6, 2], positions=pos)], temperature=1.0, verify="standard")
    t.config["seed"] = 7
    title = rules_figure(t).layout.title.text
    assert title.startswith("one run's drafts and uniforms") and "seed 7" in title
    for words in ("*one* recorded run", "mean over its prompts and seeds", "P_i = 1 and h_i = 1", "on average*"):
        assert words in RULES_VS_TABLE, words


@pytest.mark.parametrize("method,verify", [("draft_model", "standard"), ("draft_model", "block"), ("ngram", "standard"),
                                           ("ngram", "block"), ("draft_model", "greedy")])
def test_same_draft_replay_reproduces_the_engines_own_decisions(decoders, method, verify):
    dec = decoders["llama"]
    prompt = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n\ndef add("
    t = dec.generate(prompt, method=method, num_speculative_tokens=3, verify=verify,
                     temperature=0.0 if verify == "greedy" else 1.0, max_new_tokens=24, seed=3,
                     prompt_lookup_min=1, prompt_lookup_max=3)
    drafting = [s for s in t.steps if s.draft_token_ids]
    assert drafting, "the run must draft for this test to mean anything"
    replay = same_draft_rules(t)[verify]
    assert [replay[s.index] for s in drafting] == [s.num_accepted for s in drafting]


def _tiny_comparison(decoders, temperature=0.0, seeds=(0,)):
    c = new_comparison([RunConfig("ngram", 3, None, temperature, LOOKUP_1_3), RunConfig("draft_model", 2, None, temperature)],
                       [Prompt("p1", "def add(a, b):\n    return a + b\n\ndef add(", "code completion"),
                        Prompt("p2", "x = 1\ny = 2\nx = 1\n")], list(seeds), 10)
    return run_comparison(decoders["llama"], c)


@pytest.fixture(scope="module")
def greedy_comparison(decoders):
    return _tiny_comparison(decoders)


def test_runner_adds_method_none_and_greedy_runs_are_lossless(greedy_comparison):
    c = greedy_comparison
    assert [x.label for x in c.configs] == ["none T=0", "ngram k=3 greedy T=0", "draft_model k=2 greedy T=0"]
    assert len(c.runs) == 3 * 2
    assert [r.config for r in c.runs[:3]] == [0, 1, 2]  # interleaved: every configuration per prompt, none first
    rows = table(c)
    assert all(r["lossless"]["ok"] for r in rows[1:]), [r["lossless"] for r in rows]


def test_export_import_replays_equal(decoders, tmp_path):
    c = _tiny_comparison(decoders, temperature=1.0, seeds=(0, 1))
    back = load_comparison(c.to_json())
    assert back.to_dict() == c.to_dict()
    assert table(back) == table(c)
    assert table(c)[1]["lossless"]["badge"].startswith("not enough samples (2 seeds")  # 2 seeds: no T > 0 test


def test_import_refuses_malformed_data(greedy_comparison):
    c = greedy_comparison
    good = c.to_dict()

    def refused(mutate, message):
        data = json.loads(json.dumps(good))
        mutate(data)
        with pytest.raises(ComparisonFormatError, match=message):
            comparison_from_dict(data)

    refused(lambda d: d.update(format="specviz-trace"), "comparison.format")
    refused(lambda d: d["runs"][0].update(config=99), r"runs\[0\].config")
    refused(lambda d: d["runs"][1]["trace"].update(steps="x"), r"runs\[1\].trace: trace.steps must be a list")
    refused(lambda d: d["runs"][2].update(seed=7), "not one of the comparison's seeds")
    refused(lambda d: d["runs"].append(d["runs"][0]), "repeats")
    refused(lambda d: d["configs"][1].update(verify="exec"), r"configs\[1\].verify")
    refused(lambda d: d["runs"][1]["trace"]["config"].update(method="suffix"), "not configuration")
    with pytest.raises(ComparisonFormatError, match="limit"):
        load_comparison(c.to_json(), max_bytes=100)
    with pytest.raises(ComparisonFormatError, match="not valid JSON"):
        load_comparison("{")
    with pytest.raises(ComparisonFormatError, match="nests too deeply"):
        load_comparison('{"a": ' * 100_000 + "1" + "}" * 100_000)


def test_bad_settings_raise_value_errors():
    with pytest.raises(ValueError, match="unknown method 'eagle9'"):
        new_comparison([RunConfig("eagle9")], ["x"], [0])
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        new_comparison([RunConfig("ngram", 0)], ["x"], [0])
    with pytest.raises(ValueError, match="at least one"):
        new_comparison([RunConfig("ngram")], [], [0])


def test_cli_compare_writes_csv_json_and_html(tiny_dirs, tmp_path, capsys):
    from specviz.cli import main

    target, draft = tiny_dirs["llama"]
    out = tmp_path / "cmp"
    code = main(["compare", "--target", str(target), "--draft", str(draft), "--methods", "ngram,draft_model",
                 "-k", "3", "--prompt", "def add(a, b):\n    return a + b\n\ndef add(", "--max-new-tokens", "8",
                 "--device", "cpu", "--out", str(out)])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    rows = list(csv.DictReader((out / "compare.csv").open()))
    assert [r["label"] for r in rows] == ["none T=0", "ngram k=3 greedy T=0", "draft_model k=3 greedy T=0"]
    # the terminal gets an aligned table with a key, not the CSV: each row's tokens per forward as the CSV has it
    lines = printed.out.splitlines()
    assert lines[0].split()[:3] == ["configuration", "tok/fwd", "AL"] and "label,method" not in printed.out
    column = lines[0].index("tok/fwd")
    for row, line in zip(rows, lines[1:4]):
        assert line.startswith(row["label"])
        assert line[column:].split()[0] == f"{float(row['tokens_per_target_forward']):.2f}"
    assert "tok/fwd tokens per target forward" in printed.out
    back = load_comparison((out / "compare.json").read_text())
    assert len(back.runs) == 3
    html = (out / "compare.html").read_text()
    assert "plotly" in html.lower() and "tokens / forward" in html and "AL (vLLM)" in html
    assert main(["compare", "--target", str(target), "--methods", "ngram", "--seeds", "a", "--prompt", "x",
                 "--out", str(out)]) == 2
    assert "--seeds must be" in capsys.readouterr().err


def test_cli_compare_skips_prompts_too_long_for_the_context_and_names_them(tiny_dirs, tmp_path, capsys):
    """As the Compare tab does: a prompt whose tokens plus the new tokens exceed the target's context is skipped and
    named on stderr, the others run; when none fits, a clear error and exit code 2 (nothing written)."""
    from specviz.cli import main

    target, _ = tiny_dirs["llama"]
    long_prompt = "def add(a, b): return a + b\n" * 120  # far over the tiny target's 256 positions
    out = tmp_path / "cmp"
    code = main(["compare", "--target", str(target), "--methods", "ngram", "-k", "3", "--prompt", "def add(a, b):",
                 "--prompt", long_prompt, "--max-new-tokens", "8", "--device", "cpu", "--out", str(out)])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert "skipped: prompt 'prompt 2' (" in printed.err and "> the model's context of 256)" in printed.err
    back = load_comparison((out / "compare.json").read_text())
    assert [p.name for p in back.prompts] == ["prompt 1"] and {r.prompt for r in back.runs} == {0}
    code = main(["compare", "--target", str(target), "--methods", "ngram", "--prompt", long_prompt,
                 "--max-new-tokens", "8", "--device", "cpu", "--out", str(tmp_path / "none")])
    assert code == 2 and "no prompt fits the model's context of 256 tokens" in capsys.readouterr().err
    assert not (tmp_path / "none").exists()


def _sampled_comparison(spec_outputs, none_outputs, verify="standard", prompts=1):
    """A T = 1 comparison built by hand: one run per (prompt, seed) per arm with the given outputs
    (one plain step per token: the distribution check reads only the committed output)."""
    cfg = RunConfig("draft_model", 2, verify, 1.0)
    n = len(spec_outputs) // prompts
    c = Comparison([RunConfig("none", 1, "standard", 1.0), cfg], [Prompt(f"p{i}", "x") for i in range(prompts)],
                   list(range(n)), 8)
    for i, (ours, theirs) in enumerate(zip(spec_outputs, none_outputs)):
        prompt, seed = divmod(i, n)
        for config, out, method in ((0, theirs, "none"), (1, ours, "draft_model")):
            steps = [_step(j, [], 0, [t]) for j, t in enumerate(out)]
            c.runs.append(RunResult(config, prompt, seed, _trace(steps, method=method, k=2, seed=seed, temperature=1.0,
                                                                 verify="standard"), 1.0))
    return c


def _draws(rng, probs, runs, length):
    tokens = list(range(len(probs)))
    return [rng.choices(tokens, probs, k=length) for _ in range(runs)]


def test_sampled_losslessness_is_a_per_position_distribution_test_that_can_fail():
    import random

    rng = random.Random(0)
    p = [0.5, 0.3, 0.2]
    none = _draws(rng, p, 40, 6)
    fair = losslessness(_sampled_comparison(_draws(rng, p, 40, 6), none), 1)
    assert fair["ok"] is True and fair["test"]["status"] == "tested", fair
    assert fair["test"]["tables"] == 6 and "40 seeds" in fair["badge"] and fair["badge"].startswith("≈")
    assert "Bonferroni" in fair["detail"] and "does not prove" in fair["detail"]
    # a planted lossy run labelled "standard": at one position it draws from q = (0.1, 0.2, 0.7), not p
    lossy = _draws(rng, p, 40, 6)
    for out, tok in zip(lossy, _draws(rng, [0.1, 0.2, 0.7], 40, 1)):
        out[3] = tok[0]
    bad = losslessness(_sampled_comparison(lossy, none), 1)
    assert bad["ok"] is False and bad["badge"].startswith("✗"), bad
    assert bad["test"]["where"] == (1, 4) and bad["test"]["p"] < 0.01
    # runs that stop early are a category of their own: a row that always stops after 3 tokens is flagged
    short = losslessness(_sampled_comparison([o[:3] for o in _draws(rng, p, 40, 6)], none), 1)
    assert short["ok"] is False and short["test"]["where"][1] == 4


def test_sampled_losslessness_says_not_enough_samples():
    few = losslessness(_sampled_comparison([[0, 1]] * 3, [[1, 0]] * 3), 1)
    assert few["ok"] is None and few["badge"].startswith("not enough samples (3 seeds"), few
    # enough seeds, but every token of both arms is different: no cell is expected 5 times
    spread = losslessness(_sampled_comparison([[i] for i in range(12)], [[100 + i] for i in range(12)]), 1)
    assert spread["ok"] is None and spread["badge"] == "not enough samples" and spread["test"]["tables"] == 0


def test_planted_synthetic_run_is_flagged_by_the_distribution_test(decoders):
    """Real runs of the tiny models at T = 0.3 (at T = 1 their p is nearly uniform over 320 tokens, so no
    token repeats often enough to test): draft_model with standard verification passes; the same draft
    with synthetic verification accepting every draft (not lossless: the output follows q) is flagged by
    the test itself, although its row is labelled "standard"."""
    d = decoders["llama"]
    seeds, prompt, n_new = list(range(16)), "def add(a, b):\n    return a + b\n\ndef add(", 8
    cfgs = [RunConfig("none", 1, "standard", 0.3), RunConfig("draft_model", 3, "standard", 0.3),
            RunConfig("draft_model", 2, "standard", 0.3)]  # the last row's runs are planted: synthetic
    c = Comparison(cfgs, [Prompt("p", prompt)], seeds, n_new)
    for s in seeds:
        base = dict(temperature=0.3, seed=s, max_new_tokens=n_new)
        c.runs.append(RunResult(0, 0, s, d.generate(prompt, method="none", **base), 1.0))
        c.runs.append(RunResult(1, 0, s, d.generate(prompt, method="draft_model", num_speculative_tokens=3,
                                                    verify="standard", **base), 1.0))
        c.runs.append(RunResult(2, 0, s, d.generate(prompt, method="draft_model", num_speculative_tokens=2,
                                                    verify="synthetic", synthetic_rates=(1.0, 1.0), **base), 1.0))
    fair, planted = losslessness(c, 1), losslessness(c, 2)
    assert fair["test"]["status"] == "tested" and fair["ok"] is True, fair
    assert planted["ok"] is False and planted["test"]["p"] < 0.01, planted


def _ksweep_row(method: str, k: int, verify: str = "greedy", temperature: float = 0.0) -> dict:
    """A table row with just what ksweep_figure reads."""
    return {"method": method, "verify": verify, "temperature": temperature, "k": k, "label": f"{method} k={k}",
            "acceptance_length": {"vllm": 1.5, "per_forward": 1.4, "drafts_only": 0.5}, "speedup": 1.1,
            "conditional": [{"n": 10}] * k, "num_accepted_tokens": 5, "steps": 20, "num_drafts": 10}


def test_ksweep_gives_every_method_its_own_colour_and_marker():
    """Methods reused a 7-colour palette (ngram and medusa both blue, ...). Each method now has
    one colour and marker, distinct from every other method's, and the same whichever methods are swept."""
    from specviz.engine import METHODS
    from specviz.viz.compare import ksweep_figure, method_style

    METHOD_STYLE = {m: method_style(m) for m in METHODS}  # each method's registry style
    assert all(methods.get(m).style is not None for m in METHODS)
    assert len({c for c, _ in METHOD_STYLE.values()}) == len({m for _, m in METHOD_STYLE.values()}) == len(METHOD_STYLE)
    rows = [_ksweep_row(m, k) for m in METHODS for k in (1, 3, 5)]
    fig = ksweep_figure(rows)
    measured = [d for d in fig.data if d.showlegend is not False]  # one legend entry per method
    assert len(measured) == len(METHODS) - 1  # method none is the baseline, not drawn
    assert len({d.line.color for d in measured}) == len({d.marker.symbol for d in measured}) == len(measured)
    for d in measured:
        assert (d.line.color, d.marker.symbol) == METHOD_STYLE[d.name.split()[0]]
    alone = ksweep_figure([_ksweep_row("mtp", k) for k in (1, 3)])  # the same colour in a smaller sweep
    assert alone.data[0].line.color == METHOD_STYLE["mtp"][0]
    # a second verification of the same method: a shade of its colour, another marker and another line dash
    two = ksweep_figure([_ksweep_row("ngram", 2), _ksweep_row("ngram", 2, "standard", 0.8)])
    a, b = [d for d in two.data if d.showlegend is not False]
    assert (a.line.color, a.marker.symbol) == METHOD_STYLE["ngram"]
    assert b.line.color != a.line.color and b.marker.symbol != a.marker.symbol and a.line.dash != b.line.dash


def test_ksweep_tells_every_configuration_apart():
    """On a projector "draft_model standard" and "draft_model block" shared a purple triangle, and ngram and ngram_gpu
    (the same drafts, the same numbers) sat on top of each other. Every configuration now has a colour and a marker
    no other one has, and configurations with equal values are drawn side by side at each k (the hover keeps k)."""
    from specviz.viz.compare import ksweep_figure

    rows = [_ksweep_row(m, k, v, t) for m, v, t in (("draft_model", "standard", 0.8), ("draft_model", "block", 0.8),
                                                    ("draft_model", "greedy", 0.0), ("ngram", "greedy", 0.0),
                                                    ("ngram_gpu", "greedy", 0.0)) for k in (2, 4)]
    fig = ksweep_figure(rows)
    drawn = [d for d in fig.data if d.showlegend is not False]
    assert len(drawn) == 5
    assert len({d.marker.color for d in drawn}) == len({d.marker.symbol for d in drawn}) == 5, \
        [(d.name, d.marker.color, d.marker.symbol) for d in drawn]
    ngram, gpu = (next(d for d in drawn if d.name.startswith(m + " ")) for m in ("ngram", "ngram_gpu"))
    assert list(ngram.y) == list(gpu.y)  # equal values ...
    assert all(abs(a - b) >= 0.05 for a, b in zip(ngram.x, gpu.x))  # ... drawn apart
    assert list(ngram.customdata) == [2, 4] and all(abs(x - k) < 0.5 for x, k in zip(ngram.x, (2, 4)))
    speed = [d for d in fig.data if d.xaxis == "x2"]
    assert {(d.marker.color, d.marker.symbol) for d in speed} == {(d.marker.color, d.marker.symbol) for d in drawn}


def test_the_speedup_comes_with_its_per_run_spread():
    """The new-user report: ngram and ngram_gpu (same drafts) read 0.74x and 1.44x from one run each, with nothing to
    say that one run is not a measurement. Each row now carries the per-(prompt, seed) ratios' spread, shown in the
    table ("low–high (n N)", "noisy" past half the median; one run: "one sample, unchecked") and in the CSV."""
    from specviz.compare.stats import CSV_COLUMNS, _csv_cell
    from specviz.viz.compare import TABLE_COLUMNS, table_rows

    spec = [_none_trace([1, 2], ms=(0.0, 5.0, 0.0)), _none_trace([1, 2], ms=(0.0, 10.0, 0.0))]  # 400 and 200 tok/s
    none = [_none_trace([1, 2], ms=(0.0, 10.0, 0.0)), _none_trace([1, 2], ms=(0.0, 10.0, 0.0))]  # 200 tok/s each
    row = pooled_row(_comparison(spec, none), 1)
    s = row["speedup_spread"]
    assert (s["low"], s["high"], s["n"]) == (pytest.approx(1.0), pytest.approx(2.0), 2) and s["noisy"]
    assert s["median"] == pytest.approx(1.5) and row["speedup"] == pytest.approx(4 / 0.030 / (4 / 0.040))
    cells = dict(zip(TABLE_COLUMNS, table_rows([row])[0]))
    assert cells["speedup range (n)"] == "1.00–2.00 (n 2) noisy"
    assert [_csv_cell(row, c) for c in ("speedup_low", "speedup_high", "speedup_n")] == ["1", "2", 2]
    assert "speedup_n" in CSV_COLUMNS
    one = pooled_row(_comparison(spec[:1], none[:1]), 1)
    assert dict(zip(TABLE_COLUMNS, table_rows([one])[0]))["speedup range (n)"] == "n 1: one sample, unchecked"
    calm = pooled_row(_comparison([spec[1], spec[1]], none), 1)
    assert dict(zip(TABLE_COLUMNS, table_rows([calm])[0]))["speedup range (n)"] == "1.00–1.00 (n 2)"


def test_strips_and_scrubber_name_the_prompt():
    """The token strips' title and the scrubber's heading said "prompt 1" only; they now give the
    prompt's name too (cut at a word, "…", when long; HTML escaped), and just "prompt N" for an unnamed prompt."""
    from specviz.viz.compare_strips import PROMPT_NAME_MAX, prompt_label, scrub_html, strips_figure

    long = "MLP class repeated for a new model, n-gram lookup (greedy)"
    c = Comparison([RunConfig("none", 1, "greedy", 0.0), RunConfig("ngram", 3, "greedy", 0.0)],
                   [Prompt("Projections repeated", "x"), Prompt("prompt 2", "y"), Prompt(long, "z"),
                    Prompt("a <b> & c", "w")], [0], 16)
    for p in range(4):
        c.runs += [RunResult(0, p, 0, _none_trace([5, 6, 7]), 1.0), RunResult(1, p, 0, trace_a(), 1.0)]
    assert prompt_label(c, 0) == "prompt 1 “Projections repeated”"
    assert prompt_label(c, 1) == "prompt 2"  # no name of its own
    cut = prompt_label(c, 2)
    assert cut == "prompt 3 “MLP class repeated for a new model…”" and len(cut) <= len("prompt 3 “”") + PROMPT_NAME_MAX
    assert strips_figure(c, 0, 0).layout.title.text.startswith("prompt 1 “Projections repeated”, seed 0: ")
    assert "prompt 1 “Projections repeated”, seed 0" in scrub_html(c, 0, 0, 1)
    assert "a &lt;b&gt; &amp; c" in strips_figure(c, 3, 0).layout.title.text and "<b> &" not in scrub_html(c, 3, 0, 1)


# ---- draft trees beside chains ---------------------------------------------------------------------------
STATIC = "[(0,), (1,), (0, 0)]"


def draft_tree_settings(method, spec):
    """A tree string's generate() settings for ``method`` (its RunConfig's), {} for a chain."""
    out = RunConfig(method, tree=spec).settings(0, 1)
    return {k: v for k, v in out.items() if k.startswith(("speculative_token_tree", "eagle_tree_")) or k.endswith(
        "_tree_branches")}


def draft_tree_depth(settings):
    """The most drafts one path of a tree (given as its generate() settings) holds: None for a chain or branches."""
    tree = DraftTree.from_settings(dict(settings), next((k[:-len("_tree_branches")] for k in settings
                                                         if k.endswith("_tree_branches")), "eagle"), methods.names())
    return None if tree is None else tree.max_depth


def test_tree_specs_become_their_methods_settings_and_refuse_other_methods():
    assert draft_tree_settings("eagle3", "4, 6, 32") == {"eagle_tree_top_k": 4, "eagle_tree_depth": 6,
                                                         "eagle_tree_total_tokens": 32}
    assert draft_tree_settings("draft_model", STATIC) == {"speculative_token_tree": STATIC}
    assert draft_tree_settings("suffix", "2") == {"suffix_tree_branches": 2}
    assert draft_tree_settings("ngram", "") == {}
    assert draft_tree_depth(draft_tree_settings("eagle", "4,5,24")) == 6  # depth + 1 drafts on the deepest path
    assert draft_tree_depth({"speculative_token_tree": STATIC}) == 2 and draft_tree_depth({"ngram_tree_branches": 2}) is None
    with pytest.raises(ValueError, match=r"applies to method\(s\) eagle, eagle3, not 'ngram'"):
        draft_tree_settings("ngram", "4,6,32")
    with pytest.raises(ValueError, match=r"applies to method\(s\) ngram, suffix, not 'draft_model'"):
        draft_tree_settings("draft_model", "2")
    with pytest.raises(ValueError, match="static tree.* not 'ngram_gpu'"):
        draft_tree_settings("ngram_gpu", STATIC)
    with pytest.raises(ValueError, match="three integers"):
        draft_tree_settings("eagle3", "4,6")


def test_expand_configs_adds_each_tree_for_the_methods_that_take_it_at_its_depth():
    from specviz.compare import expand_configs

    cs = expand_configs(["eagle3", "ngram", "draft_model"], [3, 5], [None, "block"], [0.0],
                        ["chain", "4,6,32", "2", STATIC], {"prompt_lookup_min": 2, "prompt_lookup_max": 4})
    labels = [c.resolved().label for c in cs]
    assert labels[:12] == [f"{m} k={k} {v} T=0" for m in ("eagle3", "ngram", "draft_model") for k in (3, 5)
                           for v in ("greedy", "block")]  # the chains: methods x k x verification
    assert labels[12:] == ["eagle3 tree 4,6,32 k=7 greedy T=0",  # no tree row for block (chain-only)
                           "ngram tree 2 branches k=3 greedy T=0", "ngram tree 2 branches k=5 greedy T=0",
                           "eagle3 static tree [(0,),(1,),(0,0)] k=2 greedy T=0", "draft_model static tree [(0,),(1,),(0,0)] k=2 greedy T=0"]
    assert cs[12].settings(0, 8)["eagle_tree_depth"] == 6 and "speculative_token_tree" not in cs[0].settings(0, 8)
    with pytest.raises(ValueError, match="no chosen method takes the tree '4,6,32'"):
        expand_configs(["ngram"], [3], [None], [0.0], ["4,6,32"])
    with pytest.raises(ValueError, match="the tree '4,6' is not a draft tree: .*three integers top_k, depth"):
        expand_configs(["ngram", "eagle3"], [3], [None], [0.0], ["4,6"])  # eagle3's parse error, not ngram's
    # every tree its own label: the tree itself when short, else its size and 4 hex digits of its hash
    other = "[(0,), (0, 0), (0, 1)]"
    assert RunConfig("draft_model", 2, tree=other).tree_label == "static tree [(0,),(0,0),(0,1)]"
    big = str([(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (0, 1, 0)])
    label = RunConfig("draft_model", 3, tree=big).tree_label
    assert re.fullmatch(r"static tree \(8 nodes, depth 3, #[0-9a-f]{4}\)", label), label
    assert RunConfig("draft_model", 3, tree=big.replace("(1, 0), ", "(2,), ")).tree_label != label
    with pytest.raises(ValueError, match="no verification to run with: block, synthetic, typical are chain-only"):
        expand_configs(["draft_model"], [3], ["block"], [0.0], [STATIC])
    with pytest.raises(ValueError, match="chain-only"):
        new_comparison([RunConfig("draft_model", 2, "block", 0.0, tree=STATIC)], ["x"], [0])
    with pytest.raises(ValueError, match=r"applies to method\(s\) ngram, suffix"):
        new_comparison([RunConfig("draft_model", 2, None, 0.0, tree="2")], ["x"], [0])


@pytest.fixture(scope="module")
def tree_comparison(decoders):
    c = new_comparison([RunConfig("ngram", 3, None, 0.0, LOOKUP_1_3), RunConfig("ngram", 3, None, 0.0, LOOKUP_1_3, tree="2"),
                        RunConfig("draft_model", 2, None, 0.0, tree=STATIC)],
                       [Prompt("p1", "def add(a, b):\n    return a + b\n\ndef add(a, c):\n    return a + c\n\ndef add(")],
                       [0], 12)
    return run_comparison(decoders["llama"], c)


def test_tree_rows_run_as_trees_are_lossless_and_have_no_chain_cost_model(tree_comparison):
    c = tree_comparison
    assert [x.label for x in c.configs] == ["none T=0", "ngram k=3 greedy T=0", "ngram tree 2 branches k=3 greedy T=0",
                                            "draft_model static tree [(0,),(1,),(0,0)] k=2 greedy T=0"]
    by = {r.config: r.trace for r in c.runs}
    assert by[3].config["speculative_token_tree"] == STATIC and by[2].config["ngram_tree_branches"] == 2
    assert any(s.is_tree for s in by[3].steps), "the static tree must reach the engine as a tree"
    rows = table(c)
    assert all(r["lossless"]["ok"] for r in rows[1:]), [r["lossless"] for r in rows]
    assert rows[3]["tree"] == STATIC and rows[3]["tree_label"] == "static tree [(0,),(1,),(0,0)]"
    assert rows[3]["predicted_speedup"] is None and rows[1]["predicted_speedup"] is not None
    assert rows[3]["num_draft_tokens"] == sum(len(s.nodes) for s in by[3].steps if s.nodes)  # every node drafted
    csv_rows = list(csv.DictReader(io.StringIO(table_csv(c))))
    assert csv_rows[3]["tree"] == STATIC and csv_rows[1]["tree"] == ""


def test_tree_comparisons_round_trip_and_old_files_load_as_chains(tree_comparison):
    c = tree_comparison
    back = load_comparison(c.to_json())
    assert back.to_dict() == c.to_dict() and back.configs[3].tree == STATIC
    old = c.to_dict()
    old["configs"] = [{k: v for k, v in cfg.items() if k != "tree"} for cfg in old["configs"]]
    old["runs"] = [r for r in old["runs"] if r["config"] in (0, 1)]
    assert all(cfg.tree == "" for cfg in comparison_from_dict(old).configs)
    wrong = c.to_dict()
    wrong["configs"][3]["tree"] = "[(0,), (0, 0)]"  # the runs were drafted with another tree
    with pytest.raises(ComparisonFormatError, match=r"runs\[\d\].trace's draft-tree settings do not match"):
        comparison_from_dict(wrong)
    wrong["configs"][3]["tree"] = 7
    with pytest.raises(ComparisonFormatError, match=r"configs\[3\].tree must be a string"):
        comparison_from_dict(wrong)


def test_ksweep_draws_a_tree_as_its_own_group_without_the_chain_theory(tree_comparison):
    pytest.importorskip("plotly")
    from specviz.viz.compare import ksweep_figure, rules_source

    fig = ksweep_figure(table(tree_comparison))
    names = [t.name for t in fig.data]
    assert "draft_model static tree [(0,),(1,),(0,0)] greedy T=0" in names and "ngram greedy T=0" in names
    tree = next(t for t in fig.data if t.name == "draft_model static tree [(0,),(1,),(0,0)] greedy T=0")
    assert tree.mode == "markers" and tree.marker.symbol == "diamond-open"
    # two trees of one method: two symbols (the legend tells them apart), the method's colour kept
    two = ksweep_figure([{**r, "method": "draft_model", "tree_label": f"tree {i}"} for i, r in
                         enumerate(table(tree_comparison)[2:])])
    assert [t.marker.symbol for t in two.data if t.showlegend is not False] == ["diamond-open", "square-open"]
    theory = [t.legendgroup for t in fig.data if str(t.name).startswith("theory")]
    assert theory == ["ngram greedy T=0"]  # the chain's group only: neither tree gets the i.i.d. chain curve
    assert rules_source(tree_comparison) is None  # greedy runs only, and trees are never replayed as a chain


def test_cli_compare_runs_trees_beside_the_chains(tiny_dirs, tmp_path, capsys):
    from specviz.cli import main

    target, draft = tiny_dirs["llama"]
    out = tmp_path / "cmp"
    code = main(["compare", "--target", str(target), "--draft", str(draft), "--methods", "ngram,draft_model",
                 "-k", "2", "--trees", f"2; {STATIC}", "--prompt", "def add(a, b):\n    return a + b\n\ndef add(",
                 "--max-new-tokens", "6", "--device", "cpu", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    rows = list(csv.DictReader((out / "compare.csv").open()))
    assert [(r["label"], r["tree"]) for r in rows[3:]] == [("ngram tree 2 branches k=2 greedy T=0", "2"),
                                                           ("draft_model static tree [(0,),(1,),(0,0)] k=2 greedy T=0", STATIC)]
    assert main(["compare", "--target", str(target), "--methods", "ngram", "--trees", "4,6,32", "--prompt", "x",
                 "--out", str(out)]) == 2
    assert "no chosen method takes the tree" in capsys.readouterr().err


def test_a_comparison_does_not_depend_on_what_ran_before(decoders):
    """Suffix rows start from an empty tree of earlier outputs at every run: the same comparison gives the same
    acceptance figures on a fresh decoder, after another comparison, and after requests on the decoder's own tree
    (which used to replay identical greedy outputs: 1.14 then 4.45 tokens per target forward)."""
    dec = decoders["llama"]
    prompts = [Prompt("p1", "def add(a, b):\n    return a + b\n\ndef mul(a, b):\n"), Prompt("p2", "x = 1\ny = 2\n")]

    def figures():
        c = run_comparison(dec, new_comparison([RunConfig("suffix", 3), RunConfig("suffix", 5)], prompts, [0], 16))
        assert all(r.trace.steps[0].match["cached_requests"] == 0 for r in c.runs if r.trace.config["method"] == "suffix")
        return [(r.trace.output_token_ids, [s.num_accepted for s in r.trace.steps]) for r in c.runs]

    first = figures()
    for p in prompts:  # the decoder's own tree now holds these outputs, and a second comparison runs in between
        dec.generate(p.text, method="suffix", max_new_tokens=16)
    run_comparison(dec, new_comparison([RunConfig("suffix", 8), RunConfig("ngram", 3)], prompts, [0], 16))
    assert len(dec.request_state("suffix")) >= len(prompts)
    assert figures() == first


def test_cli_compare_takes_a_head_for_a_head_method(tiny_dirs, tmp_path, capsys):
    """`specviz compare --head METHOD=DIR` compares a user's head (here a new random Medusa head on the tiny target);
    a head directory that does not exist is refused with the loader's message and exit code 2."""
    from specviz.cli import main
    from specviz.engine import SpecDecoder
    from specviz.heads.io import save_any
    from specviz.train.heads import new_head

    target, _ = tiny_dirs["llama"]
    model = SpecDecoder.from_pretrained(target, device="cpu", dtype="float32").target_model
    torch.manual_seed(0)
    save_any(new_head("medusa", model), tmp_path / "medusa", dtype=torch.float32)
    out = tmp_path / "cmp"
    code = main(["compare", "--target", str(target), "--methods", "medusa", "--head", f"medusa={tmp_path / 'medusa'}",
                 "-k", "3", "--prompt", "def add(a, b):", "--max-new-tokens", "6", "--device", "cpu",
                 "--out", str(out)])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    rows = list(csv.DictReader((out / "compare.csv").open()))
    assert [r["label"] for r in rows] == ["none T=0", "medusa k=3 greedy T=0"]
    assert rows[1]["lossless"].startswith("✓")
    # which head ran is said in the CSV and under the printed table (a --head replaces the bundled one)
    assert rows[0]["head"] == "" and rows[1]["head"].endswith(str(tmp_path / "medusa"))
    assert table(load_comparison((out / "compare.json").read_text()))[1]["head_bundled"] is False
    assert f"head of medusa k=3 greedy T=0: {rows[1]['head']}" in printed.out
    code = main(["compare", "--target", str(target), "--methods", "medusa", "--head", f"medusa={tmp_path / 'nope'}",
                 "--prompt", "x", "--device", "cpu", "--out", str(out)])
    assert code == 2 and "nope" in capsys.readouterr().err


def test_seed_ranges_and_their_errors():
    """'0-4' is a range; '5-1' says the range runs backwards (trial 6 read 'must be comma-separated ints' for a field
    whose label advertises ranges), and a bad value names ranges too."""
    from specviz.compare.cli import _list

    assert _list("0-2,7", int, "seeds") == [0, 1, 2, 7]
    with pytest.raises(ValueError, match=r"seeds: the range '5-1' runs backwards; write it low-high, e.g. 1-5"):
        _list("5-1", int, "seeds")
    with pytest.raises(ValueError, match=r"seeds must be comma-separated ints or ranges \(e.g. 1,2,4 or 0-4\)"):
        _list("a", int, "seeds")
