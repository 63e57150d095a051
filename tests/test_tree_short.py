"""The draft tree's short arrangement (specviz/viz/tree_short.py, tree_layout.pruned_layout): what the presentation
layout's lesson shows of a tree too tall to fit below the chapter panel with readable labels (a 31-node EAGLE-2 tree
7 deep has up to 20 rows): the accepted path on one row, two siblings a depth, "+N more" for the rest."""

from __future__ import annotations

import math

from test_tree_view import tree_trace

from specviz.viz import tree as tv
from specviz.viz.tree_layout import EMITTED, PRUNED_ALTERNATIVES, ROOT, pruned_layout, step_tree

DEPTH = 7


def big_spec() -> tuple[list, list[int]]:
    """(spec, path) of a 31-node tree 7 deep (tests/test_tree_view.py's tree_trace format): the accepted path
    0..6, three siblings under each path node's parent (the last depth's first tested and rejected), and a child
    under each of the first depth's siblings."""
    spec = [(i - 1, 20 + i, 0.9, 0.1, "accepted", math.log(0.5)) for i in range(DEPTH)]
    for d in range(DEPTH):
        parent = d - 1  # the path node above depth d + 1 (-1: the root)
        for r in range(3):
            fate = "rejected" if d == DEPTH - 1 and r == 2 else "unvisited"
            spec.append((parent, 40 + 3 * d + r, 0.01, 0.9 if fate == "rejected" else None, fate, math.log(0.1)))
    firsts = [i for i, s in enumerate(spec) if s[0] == -1 and s[4] == "unvisited"]
    spec += [(i, 70 + n, None, None, "unvisited", math.log(0.05)) for n, i in enumerate(firsts)]
    return spec, list(range(DEPTH))


def test_every_node_is_placed_or_counted_once_in_at_most_four_rows():
    spec, path = big_spec()
    assert len(spec) == 31
    nodes, path, _ = step_tree(tree_trace(spec, path).steps[0])
    place, more = pruned_layout(nodes, path)
    drafted = [n for n in place if n >= 0]
    assert len(drafted) + sum(n for _, n in more.values()) == len(nodes)
    assert all(place[n] == (d, 0.0) for d, n in enumerate(path, start=1))
    assert place[ROOT] == (0, 0.0) and place[EMITTED] == (DEPTH + 1, 0.0)
    rows = 1 + max([int(y) for _, y in place.values()] + [r for r, _ in more.values()])
    assert rows <= 2 + PRUNED_ALTERNATIVES
    rejected = next(i for i, s in enumerate(spec) if s[4] == "rejected")
    assert place[rejected] == (DEPTH, 1.0)  # a tested sibling comes before the untested ones
    for d, (row, _) in more.items():  # each note under its depth's placed boxes
        assert row == 1 + max(int(y) for n, (x, y) in place.items() if x == d and n != EMITTED)


def test_the_figure_carries_the_short_arrangement_hidden():
    spec, path = big_spec()
    fig = tv.tree_figure(tree_trace(spec, path), 0)
    m = fig.layout.meta
    assert m["tree_rows"] > m["tree_short"]["rows"] and m["tree_short"]["rows"] <= 2 + PRUNED_ALTERNATIVES
    full = [t for t in fig.data if t.meta == "tree-full"]
    short = [t for t in fig.data if t.meta == "tree-short"]
    assert full and short and all(t.visible is not False for t in full) and all(t.visible is False for t in short)
    marks = next(t for t in short if t.name == "nodes")
    at = m["tree_short"]["at"]
    assert sorted(f"node {c[0]}" for c in marks.customdata) == sorted(at)
    boxes = {a.name: a for a in fig.layout.annotations if (a.name or "").startswith("node ")}
    assert set(at) < set(boxes) and m["tree_short"]["full"] == {n: [a.x, a.y] for n, a in boxes.items()}
    notes = [a for a in fig.layout.annotations if (a.name or "").startswith("more ")]
    assert notes and all(a.visible is False for a in notes)
    counted = sum(int(a.text.split("+")[1].split(" ")[0]) for a in notes)
    assert counted + len([n for n in at if int(n.split()[1]) >= 0]) == len(spec)
    # the widest two-line box at the figure's sizes (the fit keeps the depth columns at least this wide)
    assert m["tree_box_px"] >= 0.6 * tv.NUM_FONT * len("p 0.90 · c 0.50") and m["tree_num_font"] == tv.NUM_FONT
