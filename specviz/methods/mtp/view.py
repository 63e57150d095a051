"""MTP view: the chain of Gemma-4-style MTP steps at one verification step, and what each one read.

Reads only the trace: a step's ``match`` holds what :class:`specviz.methods.mtp.proposer.MtpProposer`
records: every draft step m ran at the same position t = n-1 (the last committed position), with
its queries over target layer ``kv_layer``'s cached K/V at positions 0..t (no draft KV), the hidden
state fed (the target's f_t for m = 1, else the head's own h_{m-1}), the input token (the root for
m = 1, else d_{m-1}), and its confidence (q of the head's top token and of the drafted one).
"""

from __future__ import annotations

import html
from typing import Any

import plotly.graph_objects as go

from specviz.trace import Step, Trace

from specviz.viz.common import ONE_HOT_NOTE, as_trace, label, nothing_drafted, token_code, verified_q, verified_q_cell
from specviz.methods.eagle.view import CELL, FATE_COLOUR
from specviz.viz.residual import message_figure


def _fate(step: Step, m: int) -> str:
    if m <= step.num_accepted:
        return "accepted"
    return "rejected" if m == step.num_accepted + 1 else "not verified"


def _code(trace: Trace, token_id: Any) -> str:
    return token_code(trace, token_id)


def _num(x: Any) -> str:
    return f"{x:.2f}" if isinstance(x, (int, float)) else "—"


def mtp_html(trace: Trace | dict[str, Any], step: int, position: int | None = None) -> str:
    """HTML table of one MTP chain: per draft step m its position, the target K/V it attended (layer,
    positions), the hidden state and token fed, the drafted token, its confidence and the target's
    decision. ``position`` (1-based draft position) is highlighted. Raises IndexError for a bad step."""
    trace = as_trace(trace)
    st = trace.steps[step]
    m = st.match
    if m.get("kind") != "mtp" or not m.get("steps") or not st.draft_token_ids:
        return nothing_drafted(st.index, "the MTP head")
    rows = []
    for s, tok in zip(m["steps"], st.draft_token_ids):
        i = s["step"]
        fate = _fate(st, i)
        lo, hi = s["attended_positions"]
        cells = (str(i), str(s["position"]), f"L{m['kv_layer']} {lo}..{hi}", html.escape(s["hidden"].split()[-1]),
                 _code(trace, s.get("input_token_id")), _code(trace, tok),
                 f"{verified_q_cell(verified_q(st, i))} / {_num(s.get('head_top_prob'))}",
                 f"<span style='color:{FATE_COLOUR[fate]}'>{fate}</span>")
        style = "background:#e0f2fe;font-weight:bold" if position == i else ""
        rows.append(f"<tr data-mtp-step='{i}' style='{style}'>" + "".join(f"<td {CELL}>{c}</td>" for c in cells)
                    + "</tr>")
    head = "<tr>" + "".join(f"<th {CELL}>{h}</th>" for h in ("m", "pos.", "K/V read", "h fed", "token fed", "drafted",
                                                              "q (as verified) / confidence", "target")) + "</tr>"
    q_name = "softmax(head logits)" if m.get("greedy") else "q"
    note = (f"<p style='font-size:13px;color:#374151'>{html.escape(m.get('label', 'MTP'))}. Every step runs at the "
            f"same position {m['root_position'] - 1} and its queries read the target's own cached keys and values "
            f"of layer {m['kv_layer']} (positions 0..{m['root_position'] - 1}); the head writes no KV cache, so "
            f"only the target's cache is rolled back. Per step m: the query's position, the K/V it read (L = target "
            "layer, key positions), the hidden state fed (f_t = the target's final-norm feature, h_m = the head's own "
            f"output of step m), the token fed, the drafted token, the q the verifier used for it / the confidence "
            f"({q_name} of the head's top token), and the target's decision. {ONE_HOT_NOTE}</p>")
    # wraps inside the half-page panel (at 1024 px it scrolled sideways, hiding the last columns)
    return (f"<div class='sv-match sv-mtp'>{note}<table style='font-size:13px;border-collapse:collapse;"
            f"width:100%' cellpadding='3'>{head}{''.join(rows)}</table></div>")


def mtp_figure(trace: Trace | dict[str, Any], step: int, height: int = 300) -> go.Figure:
    """Bars: the head's confidence (its probability) in each step's drafted token (the q the verifier used is in
    the table: 1 for an argmax draft), coloured by the target's decision, with the head's top
    probability as a line; the x labels name the step and its (constant) position."""
    trace = as_trace(trace)
    st = trace.steps[step]
    m = st.match
    if m.get("kind") != "mtp" or not m.get("steps") or not st.draft_token_ids:
        return message_figure("no MTP draft at this step", height=160)
    steps = m["steps"][: len(st.draft_token_ids)]
    xs = [f"step {s['step']} @ {s['position']}" for s in steps]
    fates = [_fate(st, s["step"]) for s in steps]
    fig = go.Figure()
    fig.add_trace(go.Bar(x=xs, y=[s.get("draft_prob") for s in steps], name="confidence in the drafted token",
                         marker={"color": [FATE_COLOUR[f] for f in fates]},
                         text=[label(trace, int(t), 8) for t in st.draft_token_ids], textposition="outside",
                         cliponaxis=False, hovertemplate="%{text}: %{y:.3f}<extra>%{x}</extra>"))
    fig.add_trace(go.Scatter(x=xs, y=[s.get("head_top_prob") for s in steps], mode="lines+markers",
                             name="confidence in the head's top token", line={"dash": "dot", "color": "#6b7280"}))
    fig.update_layout(height=height, margin={"l": 50, "r": 20, "t": 50, "b": 40}, plot_bgcolor="#ffffff",
                      title={"text": f"MTP chain: every step at position {steps[0]['position']}, reading target "
                                     f"layer {m['kv_layer']} K/V", "font": {"size": 13}},
                      yaxis={"range": [0, 1.15], "title": "probability"}, legend={"orientation": "h", "y": -0.25})
    return fig


panel_html, panel_figure = mtp_html, mtp_figure  # the view contract (specviz.methods.base)
