"""Lesson mode: a real run told as a sequence of chapters, each written from the trace's numbers.

Pure functions of a :class:`~specviz.trace.Trace`; no gradio, no model. Per verification step
the chapters are (docs/design/algorithms.md's terms, vLLM's method names):

1. ``draft``: what the proposer drafted and why (the n-gram match, the suffix-tree candidate,
   the draft model's own top candidates q, or a generic line for a method this module does not
   know, e.g. one added later through the method registry);
2. ``forward``: the one target forward over the k' draft tokens (p_1 ... p_{k'+1} at once);
3. ``test``: the acceptance test at each verified position (greedy: the target's argmax;
   standard: u <= min(1, p/q); block: eta_i <= h_i, Sun et al. 2024; typical (lossy): p(x) > min(eps,
   delta exp(-H(p))), Medusa; synthetic: u <= a_i / a_(i-1),
   not lossless); block adds a ``block`` chapter with tau;
4. ``outcome``: the recovered token and the residual it was drawn from, or the bonus token;
5. ``commit``: the tokens the step committed.

A tree step (EAGLE-2 / static / ranked n-gram trees; trace version 2's ``nodes``) is told as one:
the draft chapter names the tree (nodes, depth, how its children were chosen), the forward chapter
the tree attention, the tests the rule the step used on its row (rule A: u <= r(x), r the target's
p at the parent with the siblings rejected before x removed and renormalised; rule B: SpecInfer's
u <= min(1, r(x)/q(x))), the outcome the residual of rule A (p with every tested child removed) or
the bonus at a leaf. The draft and forward chapters highlight the draft-tree view, and so do a greedy step's tests
and outcome (the walk down the tree by depth); rule A / B tests highlight the row's p and q view.

A run starts with an ``intro`` chapter and ends with ``stats`` (metrics from ``trace.metrics``,
defined in specviz/trace/metrics.py). Each chapter names the step and position it selects in the
existing views and the view it highlights (``focus``).
"""

from __future__ import annotations

import html
import statistics

from specviz import methods
from specviz.trace import Step, Trace
from specviz.trace.metrics import counted

from .common import as_trace, fmt_prob, metrics_of, quoted, tokenwise_accepted
from .source import draft_limit, hook, view_module
from .stats import rate_set, rates_html

from .lesson_base import (CUT_COUNTING, FOCUS_VIEWS, TOP_CANDIDATES, VERIFY_TEXT, VIEW_NAMES, Chapter,  # noqa: F401
                          _method, _rejected_before, _row_node, _toks, _top, _verify, is_tree)
from .lesson_decision import outcome_chapter, test_chapters, test_sentence  # noqa: F401 (re-exported)


def _tree_draft_why(trace: Trace, st: Step) -> str:
    m = st.match or {}
    kind = {"dynamic": "EAGLE-2's dynamic tree (each frontier node expanded by its top-k children, the best "
                       "nodes by cumulative draft confidence kept)",
            "static": "a static tree (speculative_token_tree: the r-th child of a node is the draft's r-th most "
                      "likely token there)"}.get(m.get("tree") if isinstance(m.get("tree"), str) else "",
                                                 "a tree of the draft's ranked continuations")
    depth = max(n.depth for n in st.nodes)
    how = ("Its children were drawn from q, so the test uses their q (rule B)." if st.tree_rule == "sampled" else
           "Its children are the draft's top-ranked tokens, chosen deterministically, so the verifier treats their "
           "q as one-hot (q = 1); the draft's own confidence in each is in the draft-tree view's hover.")
    return (f"The proposer {html.escape(_method(trace, st))} drafted <b>a tree of {len(st.nodes)} nodes</b>, "
            f"{depth} deep: {kind}.{_capped(trace, m)} {how} The other views show the step's row: the accepted path, "
            f"then the last child tested: {_toks(trace, st.draft_token_ids)}.")


def _capped(trace: Trace, m: dict) -> str:
    """The sentence that says k capped an EAGLE-2 tree (its depth setting d drafts d + 1 deep; the engine stops at
    k), or "" when it did not."""
    d, levels, k = m.get("depth"), m.get("levels"), trace.config.get("num_speculative_tokens")
    if m.get("tree") != "dynamic" or not isinstance(d, int) or not isinstance(levels, int) or levels >= d:
        return ""
    return (f" Its depth setting {d} would draft {d + 1} deep (the root's children, then {d} levels), but "
            f"k = {k} caps every path at {k} drafts: set k = {d + 1} for the whole tree.")


def intro_chapter(trace: Trace) -> Chapter:
    cfg = trace.config
    method, verify = _method(trace), _verify(trace)
    how = method_text(method)
    rule = VERIFY_TEXT.get(verify, f"verification {html.escape(verify)}")
    n = len(trace.steps)
    text = (f"This run used <b>{how}</b>, k = {cfg.get('num_speculative_tokens')}, temperature "
            f"{cfg.get('temperature')}, and <b>{rule}</b>. {n} verification step(s), one target forward each. Per step: "
            "the draft, the target forward, the test at each position, the recovered or bonus token, the commit; "
            "then the statistics.")
    trees = [st for st in trace.steps if is_tree(st)]
    if trees and verify != "greedy":
        rule = ("rule B (SpecInfer: children sampled from q)" if trees[0].tree_rule == "sampled" else
                "rule A (top-k children, q one-hot: u ≤ r(x), r the target's p with the rejected siblings removed)")
        text += f" {len(trees)} step(s) drafted a tree, verified by {rule}; their chapters show the draft-tree view."
    return Chapter("intro", f"A real run, step by step ({n} steps)", text, 0 if n else None, None, "stream")


# ---- 1. the draft ---------------------------------------------------------------------------
def method_text(method: str) -> str:
    """The lesson's one-line description of ``method`` (its registry texts)."""
    if method in methods.names():
        return methods.get(method).texts.lesson
    return f"method {html.escape(method)} (a proposer this lesson has no special text for)"


def _draft_why(trace: Trace, st: Step) -> str:
    """Why the proposer drafted these tokens: the method's view says (its ``draft_why``), else a generic sentence."""
    return _method_draft_why(trace, st) or _generic_draft_why(trace, st)


def _method_draft_why(trace: Trace, st: Step) -> str | None:
    why = hook(trace, "draft_why")
    return (why(trace, st) if why is not None else None) or None


def _generic_draft_why(trace: Trace, st: Step) -> str:
    method, k = _method(trace, st), len(st.draft_token_ids)
    qs = ", ".join(f"q(x{i}) = {fmt_prob(p.q)}" for i, p in enumerate(st.positions[:k], start=1))
    return (f"The proposer {html.escape(method)} drafted {k} token(s): {_toks(trace, st.draft_token_ids)}"
            + (f" ({qs})." if qs else "."))


def _no_draft_why(trace: Trace, st: Step) -> str:
    method = _method(trace, st)
    if method == "none":
        return "Method none never drafts: this is one plain decoding step of the target."
    left = _tokens_left(trace, st)
    if left is not None and left[0] == 1:  # the budget, not the proposer: the step's own token is the last one
        return (f"Only 1 token was left before max new tokens = {left[1]}: the step's own token fills it, so "
                "nothing is drafted and the target decodes that one token, as plain decoding would.")
    why = hook(trace, "no_draft_why")
    return (why(trace, st) if why is not None else None) or (
        f"The proposer {html.escape(method)} had nothing to suggest, so the target decodes one token, as plain "
        "decoding would.")


def draft_chapter(trace: Trace, st: Step) -> Chapter:
    k = len(st.draft_token_ids)
    if k == 0:
        return Chapter("draft", f"Step {st.index}: nothing drafted", _no_draft_why(trace, st), st.index, 1, "match")
    if is_tree(st):
        return Chapter("draft", f"Step {st.index}: the proposer drafts a tree of {len(st.nodes)} nodes",
                       _tree_draft_why(trace, st), st.index, 1, "tree")
    said = _method_draft_why(trace, st)
    # the method's own view of where this draft came from (its LESSON_FOCUS, default that view) when the method could
    # say so; else the step grid's row
    focus = getattr(view_module(trace), "LESSON_FOCUS", "match") if said else "grid"
    text = (said or _generic_draft_why(trace, st)) + _capped_by_end(trace, st)
    return Chapter("draft", f"Step {st.index}: the proposer drafts {k} token(s)", text, st.index, 1, focus)


def _capped_by_end(trace: Trace, st: Step) -> str:
    """The sentence for a step whose draft max_new_tokens shortened (the engine drafts at most the tokens left
    minus the step's own one), else ""."""
    k_cfg, left = trace.config.get("num_speculative_tokens"), _tokens_left(trace, st)
    if not isinstance(k_cfg, int) or left is None:
        return ""
    left, max_new = left
    limit = draft_limit(trace)  # a head that drafts fewer than k by design (Medusa, DFlash): that is the full draft
    k_cfg = min(k_cfg, limit[0]) if limit else k_cfg
    if len(st.draft_token_ids) >= k_cfg or len(st.draft_token_ids) != left - 1:
        return ""
    return (f" Only {left} token(s) were left before max new tokens = {max_new}, so the step drafts {left - 1} "
            f"instead of k = {k_cfg}: its own token fills the last place.")


def _tokens_left(trace: Trace, st: Step) -> tuple[int, int] | None:
    """(tokens max_new_tokens still allowed when step ``st`` began, max_new_tokens), None without the setting."""
    max_new = trace.config.get("max_new_tokens")
    if not isinstance(max_new, int):
        return None
    return max_new - sum(len(s.committed_token_ids) for s in trace.steps[: st.index]), max_new


# ---- 2. the target forward ------------------------------------------------------------------
FORWARD_KINDS = {True: "tree forwards", False: "forwards over a chain of drafts"}
SPREAD = 2.0  # forward times this many times apart: the chapter says why they vary


def _forward_ms(trace: Trace, st: Step) -> str:
    """'This forward took X ms', then the range and median of the run's forwards of the same kind (a tree or a chain;
    a forward's time grows with the tokens it checks) and, where they lie more than SPREAD times apart, why (warm-up
    in the first steps, other work on the machine): one step's time is one sample; the speedup panel's timed segments
    are named as the time to quote. '' when the step has no verify time."""
    ms = st.timings_ms.get("verify")
    if not ms:
        return ""
    same = [(s.index, s.timings_ms["verify"]) for s in trace.steps
            if s.timings_ms.get("verify") and s.is_tree == st.is_tree and bool(s.draft_token_ids)]
    # a live run's forwards read slower than Compare's: recording every step and the app's drawing share the machine;
    # kept short, as the chapter's length decides the room a tree figure gets below it
    text = f"This forward took {ms:.1f} ms live (recording and drawing slow it: quote the speedup panel's times)"
    times = [t for _, t in same]
    if len(times) < 2:
        return text + "."
    lo, hi = min(times), max(times)
    text += (f"; the run's {len(times)} {FORWARD_KINDS[st.is_tree]} took {lo:.1f}–{hi:.1f} ms (median "
             f"{statistics.median(times):.1f} ms).")
    if hi < SPREAD * lo:
        return text
    slowest = max(same, key=lambda it: it[1])[0]
    # a later slow step is not only other work: a first run also pays one-time costs mid-run (a new shape's first
    # forward); kept short, as the chapter's length decides the room a tree figure gets below it
    why = "warm-up in the first steps" if slowest < 2 else "a one-time cost or other work"
    return text + f" Times this far apart come from the machine ({why}), not the method."


def forward_chapter(trace: Trace, st: Step) -> Chapter:
    if is_tree(st):
        text = (f"The target runs <b>one</b> forward over the context plus all {len(st.nodes)} nodes (tree attention: "
                "each node sees the committed text and its own ancestors only, at position n + its depth). It "
                "returns the target's p after every node at once, so every branch can be tested. "
                + _forward_ms(trace, st))
        return Chapter("forward", f"Step {st.index}: one target forward checks all {len(st.nodes)} nodes", text,
                       st.index, 1, "tree")
    k = len(st.draft_token_ids)
    # past the first rejection the forward computed p, but no test reads it (block verification tests every position)
    tested = k if _verify(trace) == "block" else st.num_accepted + 1
    ps = ", ".join(f"p(x{i}) = {fmt_prob(p.p)}" + (" (never tested)" if i > tested else "")
                   for i, p in enumerate(st.positions[:k], start=1))
    text = (f"The target runs <b>one</b> forward over the context plus the {k} draft token(s). It returns all "
            f"{k + 1} next-token distributions p_1 … p_{k + 1} at once (p_{k + 1} is the bonus slot, used only if "
            "every draft token is accepted). "
            + (f"The target's probability of each draft token: {ps}. " if ps else "")
            + _forward_ms(trace, st))
    return Chapter("forward", f"Step {st.index}: one target forward checks all {k} draft tokens", text, st.index, 1,
                   "grid")


# ---- 5. what was committed ------------------------------------------------------------------
def commit_chapter(trace: Trace, st: Step) -> Chapter:
    """What ``st`` committed, counted as every metric counts it (:func:`specviz.trace.metrics.counted`): accepted
    draft tokens + 1 token of the step's own. A step cut by the stop says what was dropped and that its last kept
    token is counted as its own token."""
    done = sum(len(s.committed_token_ids) for s in trace.steps[: st.index + 1])
    n, acc = len(st.committed_token_ids), counted(st)[0]
    own = st.emitted.kind
    toks = _toks(trace, st.committed_token_ids)
    if st.emitted_committed:
        text = f"Step {st.index} commits {n} token(s): {toks} ({acc} accepted draft token(s) + 1 {own} token)."
    else:
        text = (f"Step {st.index} commits {n} token(s): {toks}. The request stopped "
                f"({html.escape(trace.stop_reason or 'stop')}) inside this step, so only {n} of the "
                f"{st.num_accepted + 1} tokens it produced were kept (its {own} token {quoted(trace, st.emitted.token_id)} "
                f"was dropped). {CUT_COUNTING}: {acc} accepted draft token(s) + 1 = {n}.")
    text += f" After {st.index + 1} target forward(s) the output has {done} token(s), {done / (st.index + 1):.2f} per forward."
    return Chapter("commit", f"Step {st.index}: {n} token(s) committed", text, st.index, None, "stream")


# ---- the run ----------------------------------------------------------------------------------
def stats_chapter(trace: Trace) -> Chapter:
    m = metrics_of(trace)
    t = float(trace.config.get("temperature") or 0)
    # a run at T > 0 is one draw: a neighbouring run may read quite another set of numbers
    draw = f" (one run at T = {trace.config.get('temperature')}: another seed gives other numbers)" if t > 0 else ""
    text = (f"{m.num_generated_tokens} tokens in {m.num_steps} verification steps{draw}. "
            + rates_html(rate_set(trace)))
    if m.num_drafts:
        # one line in the presentation layout: a second one pushes the figure under the pinned chapter panel
        text += "Tokens per forward is what drafting buys (plain decoding: 1); the speedup panel times the seconds."
    else:
        text += "Nothing was drafted, so there is no acceptance to measure."
    return Chapter("stats", "The run's statistics", text, None, None, "stats")


def step_chapters(trace: Trace, st: Step, every_position: bool = False) -> list[Chapter]:
    """A step told in full: draft, forward, the tests (:func:`test_chapters`), outcome, commit."""
    if not st.draft_token_ids:
        return [draft_chapter(trace, st), outcome_chapter(trace, st), commit_chapter(trace, st)]
    return [draft_chapter(trace, st), forward_chapter(trace, st), *test_chapters(trace, st, every_position),
            outcome_chapter(trace, st), commit_chapter(trace, st)]


def brief_chapter(trace: Trace, st: Step) -> Chapter:
    """One chapter for a whole step (the brief lesson's later steps): what was drafted, and what was committed."""
    draft, commit = draft_chapter(trace, st), commit_chapter(trace, st)
    k, acc = st.num_drafted, counted(st)[0]
    if not k:
        title = f"Step {st.index}: nothing drafted, 1 target token"
    elif st.emitted_committed:
        title = f"Step {st.index}: {acc} of {k} draft token(s) accepted, + 1 {st.emitted.kind} token"
    else:  # its last kept token is its own (the metrics' count); the panels select that slot
        title = (f"Step {st.index}: {acc} of {k} draft token(s) accepted, + 1: the last kept "
                 f"{quoted(trace, st.committed_token_ids[-1])}; cut by the stop")
    what = draft.title.split(": ", 1)[-1]  # e.g. "the proposer drafts 3 token(s)"
    position = None if st.emitted_committed or not st.committed_token_ids else acc + 1
    return Chapter("step", title, f"{what[:1].upper()}{what[1:]}. {_rescued(st)}{commit.text}", st.index, position,
                   "grid")


def _rescued(st: Step) -> str:
    """A block-verification step that kept more than token-wise verification would have, in one sentence, else ""."""
    tokenwise = tokenwise_accepted(st) if st.block else None
    tau = min(int(st.block.get("tau", st.num_accepted)), counted(st)[0]) if st.block else 0  # a stop may cut it
    return (f"Block verification kept {tau - tokenwise} token(s) here (★ in the grid) that token-wise verification "
            "would have thrown away with the same uniforms. " if tokenwise is not None and tau > tokenwise else "")


BRIEF_FULL_STEPS = 2  # a brief lesson tells this many steps in full, then one chapter a step


def lesson_chapters(trace: Trace | dict, full_steps: int | None = None,
                    every_position: bool = False) -> list[Chapter]:
    """Every chapter of a lesson on ``trace`` (a Trace or its dict): intro, the chapters of each
    step in order, then the statistics. A trace without steps gives the intro only. ``full_steps``: tell
    only the first ``full_steps`` steps in full and every later one in one chapter (:func:`brief_chapter`);
    None (default) tells every step in full (an 11-step run: about 90 chapters). ``every_position``: greedy
    verification's accepted positions get a chapter each (default: a step's accepted greedy positions share one,
    :func:`~specviz.viz.lesson_decision.test_chapters`).
    Raises:
        specviz.trace.TraceFormatError: ``trace`` is a malformed dict."""
    trace = as_trace(trace)
    out = [intro_chapter(trace)]
    for n, st in enumerate(trace.steps):
        out += (step_chapters(trace, st, every_position) if full_steps is None or n < full_steps
                else [brief_chapter(trace, st)])
    if trace.steps:
        out.append(stats_chapter(trace))
    return out


def chapter_of_step(chapters: list[Chapter], step: int) -> int:
    """Index of the first chapter about ``step`` (clamped to the steps the lesson has; 0 if none)."""
    idx = [n for n, c in enumerate(chapters) if c.step is not None and c.kind != "intro"]
    if not idx:
        return 0
    steps = [chapters[n].step for n in idx]
    want = min(max(int(step), min(steps)), max(steps))
    return next(n for n in idx if chapters[n].step >= want)


def chapter_html(chapters: list[Chapter], index: int) -> str:
    """The chapter ``index`` (clamped) as the lesson panel shows it. The outer div carries
    data-focus (the view's element id, e.g. sv-residual), data-anchor, data-step, data-position, data-index
    and data-count, which the page's script uses to highlight and scroll to the view."""
    n = min(max(int(index), 0), len(chapters) - 1)
    c = chapters[n]
    where = f"step {c.step}" if c.step is not None and c.kind != "intro" else c.kind
    return (f"<div class='sv-chapter' data-focus='sv-{c.focus}' data-anchor='{c.anchor}' "
            f"data-step='{'' if c.step is None else c.step}' "
            f"data-position='{'' if c.position is None else c.position}' data-index='{n}' data-count='{len(chapters)}'>"
            f"<div class='sv-chapter-where'>chapter {n + 1} of {len(chapters)} · {where} · "
            f"highlighted: the {c.view_name}</div><div class='sv-chapter-title'>{c.title}</div>"
            f"<div class='sv-chapter-text'>{c.text}</div></div>")
