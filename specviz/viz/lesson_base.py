"""What every lesson chapter shares: the :class:`Chapter` record, the verification rules' sentences, and small
readers of a step (its method, its rule, a tree's row nodes)."""


from __future__ import annotations

from dataclasses import dataclass

from specviz.trace import Step, Trace

from .common import quoted_tokens, top_pairs

FOCUS_VIEWS = ("stream", "grid", "residual", "match", "stats", "tree")
# what the chapter panel calls each view ("highlighted: the ..."); a chapter may name its view more exactly (its
# ``view``): the residual view shows no residual for greedy verification, only the target's p against the draft's q
VIEW_NAMES = {"stream": "token stream", "grid": "step grid", "residual": "residual view", "match": "draft source view",
              "stats": "statistics", "tree": "draft tree"}
DECISION_VIEW = "p and q view (no residual is drawn here)"
TOP_CANDIDATES = 3  # draft candidates / residual entries named in a sentence
# how the metrics (specviz.trace.metrics.counted) count a step the stop cut, in one clause
CUT_COUNTING = "Counted as every statistic counts a cut step, its last kept token is the step's own token"

VERIFY_TEXT = {
    "greedy": ("greedy verification: a draft token is accepted iff it is the target's argmax; the output equals "
               "plain greedy decoding token for token"),
    "standard": ("standard verification (rejection sampling): x is accepted when u ≤ min(1, p(x)/q(x)); lossless, "
                 "the output follows the target's distribution exactly"),
    "block": ("block verification (Sun et al. 2024): the draft is judged as a whole through P_i, h_i and η_i; "
              "lossless, and accepts at least as many tokens as standard on average"),
    "synthetic": ("synthetic verification: position i is accepted with a given rate a_i, not from p and q. It is "
                  "NOT lossless (the output does not follow the target); use it for speed studies only"),
    "typical": ("typical acceptance (Medusa): x is accepted while p(x) > min(ε, δ·exp(−H(p))); after a rejection the "
                "token is drawn from p itself. It is NOT distribution-preserving (lossy)"),
}


@dataclass(frozen=True)
class Chapter:
    """One page of a lesson.

    kind: intro | draft | forward | test | block | outcome | commit | step (a whole step, brief lessons) | stats.
    title / text: HTML-safe strings (token texts escaped), written from the trace's numbers.
    step: the step index it talks about (None for intro / stats); position: the 1-based slot it
    selects in the views (None: the step's decision slot); focus: one of FOCUS_VIEWS; view: what the chapter panel
    calls the highlighted view ("": VIEW_NAMES[focus]); anchor: "top" (the page scrolls the view's top below the
    pinned chapter panel) or "bottom" (the view's bottom to the window's, when it is taller than the room: the block
    test's P_i / h_i / η_i rows are the residual figure's lowest).
    """

    kind: str
    title: str
    text: str
    step: int | None = None
    position: int | None = None
    focus: str = "stream"
    view: str = ""
    anchor: str = "top"

    @property
    def view_name(self) -> str:
        """The highlighted view as the chapter panel names it."""
        return self.view or VIEW_NAMES.get(self.focus, f"{self.focus} view")


def _toks(trace: Trace, ids: list[int]) -> str:
    return quoted_tokens(trace, ids)


def _top(trace: Trace, pairs: list[list[float]], n: int = TOP_CANDIDATES) -> str:
    return top_pairs(trace, pairs, n)


def _verify(trace: Trace) -> str:
    return str(trace.config.get("verify", ""))


def _method(trace: Trace, step: Step | None = None) -> str:
    return str((step.proposer if step is not None and step.proposer else None) or trace.config.get("method", ""))


def is_tree(st: Step) -> bool:
    """:attr:`specviz.trace.Step.is_tree`."""
    return st.is_tree


def _row_node(st: Step, index: int):
    """The tree node at (1-based) row position ``index``: the accepted path, then the last child tested."""
    from .tree import row_rejected

    path = st.accepted_path
    node = path[index - 1] if index <= len(path) else row_rejected(st)
    return None if node is None else st.nodes[node]


def _rejected_before(st: Step, node) -> int:
    """Siblings of ``node`` tested and rejected before it (rule A / B test children in node order)."""
    return sum(1 for n in st.nodes if n.parent == node.parent and n.id < node.id and n.fate == "rejected")
