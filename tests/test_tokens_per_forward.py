"""Tokens per target forward: one definition (trace.py), the same number in
the metrics, the run summary, the speedup table (with the formula in its hover) and the summary."""

from __future__ import annotations

import html
import re

from specviz.trace import TOKENS_PER_FORWARD_FORMULA, tokens_per_target_forward
from specviz.ui.views import summary_markdown
from specviz.viz.speed import speedup_html
from specviz.viz.stats import run_summary

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


def _summary(tokens, steps, draft, verify, sample):
    t = {"draft": draft, "verify": verify, "sample": sample}
    decode_s = sum(t.values()) / 1e3
    return {"tokens": tokens, "steps": steps, "tokens_per_forward": tokens / steps, "time_ms": t,
            "decode_s": decode_s, "decode_tokens_per_second": tokens / decode_s}


def test_speedup_note_never_says_speculation_loses_beside_a_pooled_gain():
    """The new-user report: "... = 1.10x (the segments pooled). Here speculation loses" (the sentence followed the
    0.95x median alone). When the median and the pooled ratio fall on different sides of 1x the note says the
    difference is within the noise; when both are below 1x it explains the loss."""
    from specviz.viz.speed import _speedup_note

    def note(median, seg_draft_ms, spread=0.02):
        base = _summary(32, 32, 0.0, 320.0, 0.0)  # method none: 10 ms a token
        seg = _summary(32, 10, seg_draft_ms, 100.0, 10.0)  # 3.2 tokens a step
        meas = {"median": median, "low": median * (1 - spread), "high": median * (1 + spread), "n": 3, "pairs": 3,
                "segment_tokens": 32, "ratios": [median] * 3, "noisy": False, "cost_s": 1.0, "method_summary": seg}
        text = _speedup_note(seg, {**base, "measurement": meas})
        return " ".join(re.sub(r"<[^>]+>", " ", text).split())

    pooled_gain = note(0.95, 180.0)  # pooled: 32 tokens in 290 ms vs 320 ms = 1.10x
    assert "= 1.10× (the segments pooled)" in pooled_gain
    assert "speculation loses" not in pooled_gain and "within the noise" in pooled_gain
    both_lose = note(0.8, 300.0)  # pooled 32 / 410 ms vs 320 ms = 0.78x
    assert "Here speculation loses" in both_lose and "within the noise" not in both_lose
    both_win = note(1.6, 50.0)
    assert "speculation loses" not in both_win and "within the noise" not in both_win
    # pairs on both sides of 1x are no reading (trial 7: "Too noisy to read" above a bold "Here speculation loses"):
    # the step-cost split of those segments is withheld, and no verdict is drawn from it
    across = note(0.8, 300.0, spread=0.5)
    assert "Why they differ: not readable from these segments" in across and "speculation loses" not in across


def test_lossy_verification_says_so_in_the_summary(self_decoders):
    """Lossy modes say so wherever they appear: synthetic acceptance in the run summary (the dropdown names it too)."""
    dec = self_decoders["llama"]
    trace = dec.generate(PROMPT, method="draft_model", num_speculative_tokens=3, max_new_tokens=8, verify="synthetic",
                         temperature=1.0, synthetic_rates=[0.9, 0.8, 0.7])
    assert "**Lossy:** verify = synthetic" in summary_markdown(trace)
    lossless = dec.generate(PROMPT, method="draft_model", num_speculative_tokens=3, max_new_tokens=8)
    assert "Lossy" not in summary_markdown(lossless)
