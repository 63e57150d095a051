"""A step's draft tree as the tree view places it: nodes with their fates, depth columns and rows, and the mapping
between the step's row positions (the grid's columns) and tree nodes."""


from __future__ import annotations

from dataclasses import dataclass


from specviz.trace import Step


EMITTED = -2  # customdata id of the step's own token
ROOT = -1


@dataclass(frozen=True)
class ViewNode:
    """A node as the view draws it (draft nodes plus the root and the step's own token)."""

    id: int
    parent: int
    depth: int
    token_id: int
    fate: str
    p: float | None = None
    q: float | None = None
    u: float | None = None
    score: float | None = None
    accept_prob: float | None = None


def step_tree(step: Step) -> tuple[list[ViewNode], list[int], str]:
    """(draft nodes, accepted path, tree rule) of ``step``: its trace-v2 ``nodes`` or, for a step
    without them, the chain its positions describe (fates from num_accepted)."""
    nodes = getattr(step, "nodes", None)
    if nodes:
        out = [ViewNode(int(n.id), int(n.parent), int(n.depth), int(n.token_id), str(n.fate), n.p, n.q, n.u,
                        getattr(n, "score", None), getattr(n, "accept_prob", None)) for n in nodes]
        return out, [int(i) for i in getattr(step, "accepted_path", [])], str(getattr(step, "tree_rule", "chain"))
    out = []
    for i, tok in enumerate(step.draft_token_ids):
        pos = step.positions[i] if i < len(step.positions) else None
        fate = "accepted" if i < step.num_accepted else ("rejected" if i == step.num_accepted else "unvisited")
        out.append(ViewNode(i, i - 1, i + 1, int(tok), fate, *((pos.p, pos.q, pos.u) if pos else (None,) * 3)))
    return out, list(range(step.num_accepted)), "chain"


def _children(nodes: list[ViewNode]) -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {ROOT: []}
    for n in nodes:
        kids.setdefault(n.id, [])
        kids.setdefault(n.parent, []).append(n.id)
    return kids


def tree_layout(nodes: list[ViewNode], path: list[int]) -> dict[int, tuple[int, float]]:
    """{node id: (depth, row)}: leaves on consecutive rows in depth-first order (children in node
    order), a parent on the middle of its children; includes ROOT and EMITTED (the step's own
    token, the last child of the last accepted node)."""
    kids = _children(nodes)
    kids.setdefault(path[-1] if path else ROOT, []).append(EMITTED)
    depth = {ROOT: 0, **{n.id: n.depth for n in nodes}, EMITTED: len(path) + 1}
    place: dict[int, tuple[int, float]] = {}
    row = 0

    def visit(u: int) -> float:
        nonlocal row
        if not kids.get(u):
            place[u] = (depth[u], float(row))
            row += 1
            return place[u][1]
        ys = [visit(c) for c in kids[u]]
        place[u] = (depth[u], (ys[0] + ys[-1]) / 2)
        return place[u][1]

    visit(ROOT)
    return place


def node_for_position(step: Step, position: int | None) -> int | None:
    """The node a (1-based) position of the accepted-path row stands for: path[position - 1],
    EMITTED for the step's own slot, None if out of range."""
    _, path, _ = step_tree(step)
    if position is None:
        return None
    if 1 <= position <= len(path):
        return path[position - 1]
    return EMITTED if position == len(path) + 1 else None


def row_rejected(step: Step) -> int | None:
    """The tree node at the end of the step's row (trace v2: the accepted path, then the last child
    tested at the node where the step stopped, rejected): that child's id, or None."""
    nodes, path, _ = step_tree(step)
    stop = path[-1] if path else ROOT
    tested = [n.id for n in nodes if n.parent == stop and n.fate == "rejected"]
    return tested[-1] if tested and len(step.draft_token_ids) > len(path) else None


def position_for_node(step: Step, node: int) -> int | None:
    """The (1-based) position of ``node`` on the step's row (the grid's row, whose positions have
    the p / q / residual panel): a node of the accepted path; the step's own token and the row's
    last rejected child (:func:`row_rejected`), both the slot after the path; in a chain every node
    i is position i + 1 (unused drafts too). None for other tree nodes and the root."""
    nodes, path, rule = step_tree(step)
    if node == EMITTED or (node >= 0 and node == row_rejected(step)):
        return len(path) + 1
    if rule == "chain" and 0 <= node < len(nodes):
        return node + 1
    return path.index(node) + 1 if node in path else None


PRUNED_ALTERNATIVES = 2  # siblings of each accepted-path node the short arrangement shows (then "+N more")


def pruned_layout(nodes: list[ViewNode], path: list[int],
                  alternatives: int = PRUNED_ALTERNATIVES) -> tuple[dict[int, tuple[int, float]], dict[int, tuple[int, int]]]:
    """The short arrangement of a step's tree (the presentation layout's lesson shows it where the whole tree does
    not fit at a readable size): (place, more). place = {node id: (depth, row)} for ROOT, the accepted path and
    EMITTED on row 0, and under each of them at most ``alternatives`` siblings (the other children of the path node
    before it: tested-and-rejected first, then in the verifier's order) on rows 1, 2, ...; more = {depth: (row, n)}:
    the n drafted nodes of that depth not placed, to be noted "+n more" at that row (the row under the depth's
    placed siblings). Every drafted node is placed or counted exactly once; rows = 1 + the largest row used."""
    kids = _children(nodes)
    kids.setdefault(path[-1] if path else ROOT, []).append(EMITTED)
    by_id = {n.id: n for n in nodes}
    place: dict[int, tuple[int, float]] = {ROOT: (0, 0.0), EMITTED: (len(path) + 1, 0.0)}
    place.update({node: (d, 0.0) for d, node in enumerate(path, start=1)})
    for parent in (ROOT, *path):
        others = [c for c in kids.get(parent, []) if c not in place]
        others.sort(key=lambda c: (by_id[c].fate != "rejected", c))  # the tested ones first, then the verifier's order
        for row, c in enumerate(others[:alternatives], start=1):
            place[c] = (by_id[c].depth, float(row))
    more: dict[int, tuple[int, int]] = {}
    for d in sorted({n.depth for n in nodes}):
        hidden = sum(1 for n in nodes if n.depth == d and n.id not in place)
        if hidden:
            used = [y for node, (x, y) in place.items() if x == d and node != EMITTED]
            more[d] = (int(max(used, default=0)) + 1, hidden)
    return place, more
