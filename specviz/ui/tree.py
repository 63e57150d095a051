"""The draft-tree panel of the single-run tab: the selected step's tree (:mod:`specviz.viz.tree`),
redrawn whenever the step or position changes, and clicks on its nodes.

A click on a node of the accepted path (or the step's own token) selects that position, so the
existing p / q / residual panel, grid and stream follow; a click on a node off the path keeps the
position and shows that node's p and q in the residual panel instead. The page script sends
"node,nonce" through the hidden #sv-tree-pick box (as the grid does through #sv-pick).
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from specviz.viz import tree as tree_view
from specviz.viz.residual import clamp_selection, message_figure

from .outputs import number, sliders, trace_of
from .views import selection_views

PLACEHOLDER = ("After Run: the step's draft tree (a chain for chain methods): the accepted path green, rejected "
               "nodes grey, unvisited nodes dimmed. Click a node for its p / q.")

# bound on every newly drawn tree plot (appended to the stream's js_on_load script)
TREE_PICK_JS = """
const svBindTree = () => {
  const gd = document.querySelector('#sv-tree .js-plotly-plot');
  // Plotly.newPlot purges a redrawn plot's listeners and gives it a new event emitter (gd._ev): mark that
  if (!gd || typeof gd.on !== 'function' || !gd._ev || gd._ev.svTreeBound) return;
  gd._ev.svTreeBound = true;
  gd.on('plotly_click', (ev) => {
    const pt = ev && ev.points && ev.points[0];
    if (!pt || pt.customdata === undefined) return;
    const node = Array.isArray(pt.customdata) ? pt.customdata[0] : pt.customdata;
    const box = document.querySelector('#sv-tree-pick textarea, #sv-tree-pick input');
    if (!box || node === -1) return;  // the root is no decision
    box.value = `${node},${Date.now()}`;
    box.dispatchEvent(new Event('input', {bubbles: true}));
  });
};
new MutationObserver(svBindTree).observe(document.body, {childList: true, subtree: true});
svBindTree();
"""


def tree_panel(state: dict[str, Any] | None, step: Any, position: Any) -> Any:
    """The draft tree of the selected (step, position) (clamped), that position's node outlined."""
    trace = trace_of(state)
    if trace is None or not trace.steps:
        return message_figure(PLACEHOLDER, 160)
    s, i = clamp_selection(trace, int(number(step, 0)), int(number(position, 1)))
    return tree_view.tree_figure(trace, s, tree_view.node_for_position(trace.steps[s], i))


def select_tree_node(state: dict[str, Any] | None, step: Any, pick: Any) -> tuple[Any, ...]:
    """A click on node ``pick`` ("node[,nonce]") of the selected step's tree. Outputs: step and
    position sliders, stream, grid, residual, match, trie, tree. A node on the accepted path (or
    the step's own token) moves the position there; another node keeps the sliders and shows
    :func:`specviz.viz.tree.node_figure` in the residual panel. Anything unreadable changes nothing."""
    trace = trace_of(state)
    parts = str(pick or "").split(",")
    if trace is None or not trace.steps or not parts[0].strip().lstrip("-").isdigit():
        return (gr.skip(),) * 8
    s, _ = clamp_selection(trace, int(number(step, 0)), None)
    st, node = trace.steps[s], int(parts[0])
    position = tree_view.position_for_node(st, node)
    if position is not None:
        i = clamp_selection(trace, s, position)[1]
        return (gr.skip(), sliders(trace, s, i)[1], *selection_views(trace, s, i),
                tree_view.tree_figure(trace, s, node))
    if node not in {n.id for n in tree_view.step_tree(st)[0]}:
        return (gr.skip(),) * 8
    return (gr.skip(), gr.skip(), gr.skip(), gr.skip(), tree_view.node_figure(trace, s, node), gr.skip(), gr.skip(),
            tree_view.tree_figure(trace, s, node))


def tree_views() -> dict[str, gr.components.Component]:
    """The panel's components: the plot and the hidden click box."""
    return {"tree": gr.Plot(message_figure(PLACEHOLDER, 160), label="draft tree", elem_id="sv-tree", show_label=False),
            "tree_pick": gr.Textbox(elem_id="sv-tree-pick", elem_classes="sv-hidden", show_label=False,
                                    container=False)}


def wire_tree(v: dict[str, Any], state: gr.State, finished: list[Any]) -> None:
    """Redraw the tree when the step or position changes (by the user or by an output) and after
    each event in ``finished`` (run, replay: a new trace may keep the same selection); clicks."""
    inputs, out = [state, v["step"], v["position"]], [v["tree"]]
    gr.on([v["step"].change, v["position"].change], tree_panel, inputs, out, api_name="tree_view",
          trigger_mode="always_last")
    for event in finished:
        event.then(tree_panel, inputs, out)
    v["tree_pick"].change(select_tree_node, [state, v["step"], v["tree_pick"]],
                          [v["step"], v["position"], v["stream"], v["grid"], v["residual"], v["match"], v["trie"],
                           v["tree"]], api_name="select_tree_node", trigger_mode="always_last",
                          concurrency_id="selection")
