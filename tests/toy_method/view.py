"""repeat_last's "where the draft came from" view: each drafted token beside the position it was copied from."""

from __future__ import annotations

from specviz.viz.common import as_trace, token_code
from specviz.viz.residual import message_figure

LESSON_FOCUS = "match"


def panel_html(trace, step: int, position: int | None = None) -> str:
    trace = as_trace(trace)
    st = trace.steps[step]
    sources = (st.match or {}).get("copied_from", [])
    rows = "".join(f"<tr><td>x{i}</td><td>{token_code(trace, t)}</td><td>position {s}</td></tr>"
                   for i, (t, s) in enumerate(zip(st.draft_token_ids, sources), start=1))
    return (f"<div class='sv-match'><p>Step {st.index}: copied with lag {(st.match or {}).get('repeat_lag', '?')}"
            f"</p><table><tr><th>i</th><th>x_i</th><th>copied from</th></tr>{rows}</table></div>")


def panel_figure(trace, step: int):
    return message_figure(f"step {as_trace(trace).steps[step].index}: the copied positions are in the table at left",
                          height=160)


def draft_why(trace, st) -> str | None:
    m = st.match or {}
    return f"The rule copied positions {m.get('copied_from')} (lag {m.get('repeat_lag')})."
