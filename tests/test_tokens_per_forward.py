"""Tokens per target forward (issue 10, point 6): one definition (trace.py), the same number in
the metrics, the run summary, the speedup table (with the formula in its hover) and the summary."""

from __future__ import annotations

import html
import re

from specviz.trace import TOKENS_PER_FORWARD_FORMULA, tokens_per_target_forward
from specviz.ui.views import summary_markdown
from specviz.viz.stats import run_summary, speedup_html

PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a"


def test_one_definition_everywhere(self_decoders):
    dec = self_decoders["llama"]
    trace = dec.generate(PROMPT, method="draft_model", num_speculative_tokens=4, max_new_tokens=30)
    base = dec.generate(PROMPT, method="none", max_new_tokens=30)
    steps, tokens = len(trace.steps), len(trace.output_token_ids)
    assert trace.target_forward_passes == steps + 1  # the prefill is the extra forward
    want = tokens_per_target_forward(tokens, steps)
    assert want == tokens / steps and steps < tokens  # the speculative path gained something
    assert trace.metrics["tokens_per_target_forward"] == want == trace.metrics["tokens_per_step"]
    run, none = run_summary(trace), run_summary(base)
    assert run["tokens_per_forward"] == want and none["tokens_per_forward"] == 1.0
    page = speedup_html(run, none)
    row = re.search(r"<tr title='([^']*)'><td[^>]*>tokens per target forward = tokens / verification steps</td>"
                    r"<td[^>]*>([\d.]+)</td><td[^>]*>([\d.]+)</td>", page)
    assert row, page
    assert html.unescape(row.group(1)) == TOKENS_PER_FORWARD_FORMULA and "prefill" in row.group(1)
    assert float(row.group(2)) == round(want, 2) and float(row.group(3)) == 1.0
    assert f">{steps}</td>" in page and f">{steps + 1}</td>" in page  # steps and forwards incl. prefill
    assert f"{want:.2f} tokens per target forward" in summary_markdown(trace)
    assert f"{want / 1.0:.2f}× tokens per target forward" in page
