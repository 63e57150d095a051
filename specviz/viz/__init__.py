"""Figures of a trace: pure functions from a :class:`~specviz.trace.Trace` (or its dict) to Plotly figures or HTML
strings; each method's own view lives in its folder (:mod:`specviz.viz.source` finds it). Imports plotly, never
gradio; loads no model."""

from specviz.viz.common import FATE_STYLE, FATES, as_trace, token_events
from specviz.viz.export import figure_png, figures, report_html
from specviz.viz.grid import grid_cells, step_grid_figure
from specviz.viz.residual import clamp_selection, message_figure, residual_figure
from specviz.viz.speed import speedup_html, step_costs
from specviz.viz.stats import estimated_alpha, expected_tokens_per_step, run_summary, stats_figure
from specviz.viz.stream import legend_html, token_stream_html

__all__ = [
    "FATES", "FATE_STYLE", "as_trace", "clamp_selection", "estimated_alpha", "expected_tokens_per_step",
    "figure_png", "figures", "grid_cells", "legend_html", "message_figure", "report_html",
    "residual_figure", "run_summary", "speedup_html", "stats_figure", "step_costs", "step_grid_figure", "token_events",
    "token_stream_html",
]
