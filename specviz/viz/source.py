"""Where a step's draft came from: the view of each method, looked up by method name.

Every method registered in :mod:`specviz.methods` records its own details in ``step.match``
(``Draft.details``); its entry here draws them as an HTML panel (left) and a figure (right). A
new method adds its view module and one line to ``VIEWS``; a method without an entry gets a
generic note. Pure functions of the trace (no model, no gradio).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import plotly.graph_objects as go

from specviz.trace import Trace

from . import dflash, eagle, match, medusa, mtp
from .common import as_trace
from .residual import message_figure


@dataclass(frozen=True)
class SourceView:
    """html: (trace, step, position) -> HTML; figure: (trace, step) -> Plotly figure; note:
    (trace) -> a Markdown hint for the run summary ("" for none)."""

    html: Callable[[Trace, int, int | None], str]
    figure: Callable[[Trace, int], go.Figure]
    note: Callable[[Trace], str] = lambda trace: ""


def _lookup_note(trace: Trace) -> str:
    """Prompt lookup drafted at fewer than 30% of the steps of a finished run: say what helps."""
    drafted = sum(1 for st in trace.steps if st.draft_token_ids)
    if not trace.stop_reason or drafted >= 0.3 * len(trace.steps):
        return ""
    return (f"Prompt lookup found a match at only {drafted} of {len(trace.steps)} steps: it copies drafts "
            "from earlier text, so it needs text that repeats itself (a longer prompt, code that reuses its "
            "names, or a lower prompt_lookup_min).")


_MATCH = SourceView(lambda trace, step, position: match.match_context_html(trace, step), match.trie_figure)
_LOOKUP = SourceView(_MATCH.html, _MATCH.figure, _lookup_note)
_EAGLE = SourceView(eagle.eagle_html, eagle.eagle_figure)
_DFLASH = SourceView(dflash.dflash_html, dflash.dflash_figure)

VIEWS: dict[str, SourceView] = {
    "none": _MATCH, "draft_model": _MATCH, "suffix": _MATCH,  # match.py explains none / draft_model itself
    "ngram": _LOOKUP, "ngram_gpu": _LOOKUP,
    "eagle": _EAGLE, "eagle3": _EAGLE,
    "dflash": _DFLASH,
    "medusa": SourceView(medusa.medusa_html, medusa.medusa_figure), "mtp": SourceView(mtp.mtp_html, mtp.mtp_figure),
}


def view_of(trace: Trace) -> SourceView:
    """The trace's method's view (the n-gram/suffix view for unknown methods: it explains itself)."""
    return VIEWS.get(str(trace.config.get("method", "")), _MATCH)


def source_html(trace: Trace | dict[str, Any], step: int, position: int | None = None) -> str:
    """The left panel of "where the draft came from" at ``step`` (``position`` highlighted where the
    view has one). Raises IndexError if ``step`` is not a step of the trace."""
    trace = as_trace(trace)
    return view_of(trace).html(trace, step, position)


def source_figure(trace: Trace | dict[str, Any], step: int) -> go.Figure:
    """The right panel of "where the draft came from" at ``step``."""
    trace = as_trace(trace)
    if not trace.steps:
        return message_figure("no steps", height=160)
    return view_of(trace).figure(trace, step)


def source_note(trace: Trace) -> str:
    """The method's hint for the run summary ("" for none), then :func:`draft_limit_note`'s line."""
    return "\n\n".join(n for n in (view_of(trace).note(trace), draft_limit_note(trace)) if n)


def draft_limit(trace: Trace) -> tuple[int, str, str] | None:
    """(most draft tokens per step, a short reason, the reason in full) for a chain method whose proposer drafts fewer than k =
    num_speculative_tokens by design, else None: Medusa drafts min(k, number of heads) (head i
    predicts only the token i + 1 after the root; ``specviz/proposers/medusa.py``), DFlash at most
    block size - 1 (``specviz/proposers/dflash.py``; the engine refuses a larger k). Read from the
    steps' ``match`` (the heads / block the proposer recorded); trees (``shape`` "tree") are left
    out: their k is a depth."""
    k = int(trace.config.get("num_speculative_tokens") or 0)
    for st in trace.steps:
        m = st.match or {}
        if m.get("shape") == "tree":
            return None
        if m.get("kind") == "medusa" and m.get("heads"):
            n = len(m["heads"])
            return (n, f"Medusa: min(k, {n} heads)", f"Medusa drafts min(k, number of heads) = {n} tokens: this head file has {n} heads and head "
                       f"i predicts only the token i + 1 after the root") if n < k else None
        if m.get("kind") == "dflash" and m.get("block_size"):
            n = int(m["block_size"]) - 1
            return (n, f"DFlash: block size − 1 = {n}", f"DFlash drafts at most block size − 1 = {n} tokens (one block of {n + 1})") if n < k else None
    return None


def draft_limit_note(trace: Trace) -> str:
    """One line for the run summary when :func:`draft_limit` applies ("" otherwise): why columns
    x(n+1)..xk of the step grid stay empty."""
    limit = draft_limit(trace)
    if limit is None:
        return ""
    n, _, why = limit
    k = int(trace.config["num_speculative_tokens"])
    cols = f"x{n + 1}" if n + 1 == k else f"x{n + 1}–x{k}"
    return f"k = {k}, but {why}, so column{'s' if n + 1 < k else ''} {cols} of the step grid stay{'s' if n + 1 == k else ''} empty."
