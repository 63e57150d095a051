"""'What am I looking at' texts (Markdown), one per view, for a student who knows sampling but not speculative
decoding; each method's own texts come from its registry entry (:class:`specviz.methods.base.Texts`)."""

from specviz import methods

INTRO = """\
**Speculative decoding** makes a big *target* model (distribution **p**) generate several tokens per
forward pass. A cheap *proposer* (distribution **q**) guesses the next **k** tokens (the *draft*); the
target scores all of them in **one** forward pass and keeps the longest prefix it agrees with
(*accepted tokens*). At the first disagreement it replaces the draft token by a token drawn from the
*residual distribution* max(p − q, 0)/Z (the *recovered token*); if it agrees with every draft token it
adds one more token from its own next distribution for free (the *bonus token*). With standard or block
verification the output has exactly the target's distribution: only the speed changes.
"""

STREAM = """\
**Token stream.** The generated text, one box per token, coloured by what happened to it. Green tokens
were guessed by the proposer and accepted by the target. A red, struck-through token is a draft token the
target rejected: it is *not* in the output; the orange token after it is the recovered token the target drew
instead. Blue is a bonus token (every draft token of the step was accepted). Grey tokens came from plain
decoding steps where the proposer had nothing to suggest. Tokens of one verification step touch and a small
gap separates steps: the longer a run of touching tokens, the more one target forward produced. Hover a token for p(x),
q(x), the uniform u and the acceptance probability min(1, p/q).
"""

GRID = """\
**Step grid.** One row per verification step (one target forward pass), one column per draft position
x1…xk, plus the token the step produced itself ("+1 token": recovered or bonus). Reading a row left to
right replays the check: green cells passed, the first red cell failed, light-grey cells after it were
never used. Click a cell (or use the sliders) to see the numbers behind that decision on the right.
"""

# the exported report has no sliders: it shows the step selected at export
GRID_REPORT = GRID.replace(
    "Click a cell (or use the sliders) to see the numbers behind that decision on the right.",
    "Hover a cell for its numbers; the residual view below shows the step and position that were selected\n"
    "when the report was exported.")

RESIDUAL = """\
**Accepted, rejected, recovered or bonus: the numbers behind one decision** (the figure's
heading asks the question for the selected token). Bars compare the target's distribution **p** (blue), the proposer's
**q** (orange) and the residual **max(p − q, 0)/Z** (green) over the most likely tokens. The draft token x
is accepted when a uniform random number **u ≤ min(1, p(x)/q(x))** (the green region of the bar below):
tokens the proposer over-rates (q > p) are sometimes rejected. After a rejection the recovered token is drawn
from the residual, which puts mass only where the target wants *more* than the proposer offered; that is
exactly what makes the output follow p. Deterministic proposers (n-gram, greedy draft) have a one-hot q,
so x is accepted with probability p(x). With greedy verification (temperature 0) x is accepted only if it
is the target's top token. **Block verification** (Sun et al. 2024) judges the draft as a whole: P_i tracks
how well the first i tokens match, h_i is the probability to accept the block up to i, and the step keeps
the *last* i whose uniform η_i ≤ h_i, so a later pass can rescue an earlier token-wise failure.
"""

def _texts(method: str):
    """The method's :class:`~specviz.methods.base.Texts`, or None for a method this installation does not know."""
    return methods.get(method).texts if method in methods.names() else None


def source_heading(method: str | None) -> str:
    """The section-3 heading (Markdown) naming what drafted in a run of ``method``; None (no run yet)
    -> the generic heading. An unknown method is named as it is."""
    if not method:
        return "## 3 · Where the draft came from"
    texts = _texts(method)
    return f"## 3 · Where the draft came from: {texts.source if texts else f'method {method}'}"


def source_explain(method: str | None) -> str:
    """The section-3 "what am I looking at" text for a run of ``method`` (Markdown): the question named
    for that method and its paragraph; None (no run yet) -> what the section will show."""
    if not method:
        return ("**Where did the draft come from?** After a run this section shows how the method that ran made "
                "its draft: the n-gram match, the suffix tree, the draft model's candidates, the EAGLE / Medusa / "
                "MTP heads or the DFlash block.")
    texts = _texts(method)
    what, text = (texts.source, texts.how) if texts else (f"method {method}", "This method records no view of its drafts.")
    question = "Why was nothing drafted?" if method == "none" else f"How did {what} make this draft?"
    return f"**{question}** {text}"


MATCH = source_explain(None)  # before any run (and the section's text for an unknown method)

STATS = """\
**Run statistics.** Top left: how many draft tokens each step accepted. Top right: the fraction of steps
that got at least i tokens accepted (blue) and the chance to accept token i once i − 1 were accepted
(orange). Bottom left: if every draft token were accepted independently with probability a, a step would
yield (1 − a^(k+1))/(1 − a) tokens on average (dashed); the star is this run (mean acceptance length over
drafting steps). Bottom right: where the time went (draft = proposer, verify = target forward, sample =
acceptance test and resampling), next to plain decoding with method "none". **Tokens per target forward**
is the hardware-independent gain; tokens/s also pays for the proposer and this machine's overheads.
"""
