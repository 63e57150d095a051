"""The draft tree's short arrangement: the accepted path on one row, at most
:data:`~specviz.viz.tree_layout.PRUNED_ALTERNATIVES` siblings under each of its nodes and a "+N more" note per
depth for the nodes left out (:func:`~specviz.viz.tree_layout.pruned_layout`).

The tree figure carries it hidden: edge and click-marker traces (``meta`` "tree-short", ``visible`` False, beside
the full tree's, ``meta`` "tree-full"), the notes as hidden annotations named "more <depth>", and in the layout's
``meta.tree_short`` each node box's place there. The presentation layout's lesson script (specviz/ui/lesson_script.py
svTreeFit) switches to it where the whole tree does not fit below the chapter panel with readable labels; nothing
else reads it."""

from __future__ import annotations

from typing import Callable

import plotly.graph_objects as go

from .tree_layout import ViewNode, pruned_layout

MORE_COLOUR = "#6b7280"
BOX_BORDER_PX = 7  # a box's width beyond its text: 2 x (borderpad 2 + border 1.5)
MONO_EM = 0.6  # a monospace character's width in em


def box_px(lines: list[tuple[str, float]]) -> float:
    """The width (px) of a node box holding ``lines`` (text, font px), in monospace."""
    return max(MONO_EM * size * len(text) for text, size in lines) + BOX_BORDER_PX


def add_short(fig: go.Figure, nodes: list[ViewNode], path: list[int], emitted: ViewNode, boxes: list[ViewNode],
              hovers: list[str], edges: Callable[..., None], full_place: dict[int, tuple[int, float]]) -> dict:
    """Add the short arrangement of the tree (nodes, accepted path, the step's own token ``emitted``) to ``fig``,
    hidden: its edges (drawn by ``edges(fig, place, nodes, emitted, meta=..., visible=...)``), its click markers for
    the placed ``boxes`` (hover texts ``hovers``, in ``boxes``' order) and its "+N more" notes. Returns the layout meta
    entry: {"rows": rows, "at": {annotation name: [x, y]} for every placed box, "full": the same for every box in the
    full arrangement ``full_place`` (to switch back)}."""
    place, more = pruned_layout(nodes, path)
    shown = [n for n in nodes if n.id in place]
    edges(fig, place, shown, emitted, meta="tree-short", visible=False)
    kept = [(n, h) for n, h in zip(boxes, hovers) if n.id in place]
    fig.add_trace(go.Scatter(
        x=[place[n.id][0] for n, _ in kept], y=[place[n.id][1] for n, _ in kept], mode="markers", name="nodes",
        showlegend=False, customdata=[[n.id] for n, _ in kept], hoverinfo="text", hovertext=[h for _, h in kept],
        marker={"size": 34, "color": "rgba(0,0,0,0)", "symbol": "square"}, meta="tree-short", visible=False))
    for depth, (row, count) in more.items():
        fig.add_annotation(name=f"more {depth}", text=f"<i>+{count} more node{'s' if count > 1 else ''}</i>", x=depth, y=row, showarrow=False,
                           visible=False, font={"size": 11, "color": MORE_COLOUR}, xanchor="center")
    rows = 1 + max([int(y) for _, y in place.values()] + [r for r, _ in more.values()])
    return {"rows": rows, "at": {f"node {i}": [x, y] for i, (x, y) in place.items()},
            "full": {f"node {n.id}": list(full_place[n.id]) for n in boxes}}
