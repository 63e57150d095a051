"""MTP view: the chain of MTP steps at one verification step, and what each one read.

Reads only the trace: a step's ``match`` holds what :class:`specviz.methods.mtp.proposer.MtpProposer`
records: every draft step m ran at the same position (n - 1 for specviz's head, the root's n for Gemma 4's
assistant), with its queries over the target's cached K/V (``kv_reads``: per layer type the target layer and the key
positions; older traces: ``kv_layer`` at 0..n-1; no draft KV), the hidden state fed (the target's f_t for m = 1,
else the head's own h_{m-1}), the input token (the root for m = 1, else d_{m-1}), and its confidence (q of the head's
top token and of the drafted one). The run's ``config["head"]`` says which head was loaded (its layout and source);
``real_logits`` marks centroid-masked logits, ``one_hot_draft`` argmax drafts at every temperature.
"""

from __future__ import annotations

import html
from typing import Any

import plotly.graph_objects as go

from specviz.trace import Step, Trace

from specviz.viz.common import (ONE_HOT_NOTE, as_trace, fmt_prob, label, nothing_drafted, quoted, token_code,
                                 verified_q, verified_q_cell)
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
    """HTML table of one MTP chain: per draft pass m its position, the target K/V it attended (layer,
    positions), the hidden state and token fed, the drafted token, its confidence and the target's
    decision. ``position`` (1-based draft position) is highlighted. Raises IndexError for a bad step."""
    trace = as_trace(trace)
    st = trace.steps[step]
    m = st.match
    if m.get("kind") != "mtp" or not m.get("steps") or not st.draft_token_ids:
        return nothing_drafted(st.index, "the MTP head")
    reads = _reads(m)
    rows = []
    for s, tok in zip(m["steps"], st.draft_token_ids):
        i = s["step"]
        fate = _fate(st, i)
        cells = (str(i), str(s["position"]), "<br>".join(f"L{r['layer']} {r['positions'][0]}..{r['positions'][1]}"
                                                        for r in reads),
                 html.escape(s["hidden"].split()[-1]), _code(trace, s.get("input_token_id")), _code(trace, tok),
                 f"{verified_q_cell(verified_q(st, i))} / {_num(s.get('head_top_prob'))}",
                 f"<span style='color:{FATE_COLOUR[fate]}'>{fate}</span>")
        style = "background:#e0f2fe;font-weight:bold" if position == i else ""
        rows.append(f"<tr data-mtp-step='{i}' style='{style}'>" + "".join(f"<td {CELL}>{c}</td>" for c in cells)
                    + "</tr>")
    head = "<tr>" + "".join(f"<th {CELL}>{h}</th>" for h in ("m", "pos.", "K/V read", "h fed", "token fed", "drafted",
                                                              "q (as verified) / confidence", "target")) + "</tr>"
    q_name = "softmax(head logits)" if m.get("greedy") else "q"
    where = "; ".join(f"{r['type'].replace('_attention', '')} layers: target layer {r['layer']}, positions "
                      f"{r['positions'][0]}..{r['positions'][1]}" for r in reads)
    note = (f"<p style='font-size:13px;color:#374151'>{html.escape(m.get('label', 'MTP'))}{_source(trace)}. Every "
            f"pass runs at the same position {m['steps'][0]['position']} and its queries read the target's own "
            f"cached keys and values ({html.escape(where)}); the head writes no KV cache, so only the target's cache "
            "is rolled back. Per pass m: the query's position, the K/V it read (L = target layer, key positions), the "
            "hidden state fed (f_t = the target's final-norm feature, h_m = the head's own output of pass m), the "
            "token fed, the drafted token, the q the verifier used for it / the confidence "
            f"({q_name} of the head's top token), and the target's decision. {ONE_HOT_NOTE}</p>"
            + _logits_note(m))
    # wraps inside the half-page panel (at 1024 px it scrolled sideways, hiding the last columns)
    return (f"<div class='sv-match sv-mtp'>{note}<table style='font-size:13px;border-collapse:collapse;"
            f"width:100%' cellpadding='3'>{head}{''.join(rows)}</table></div>")


def _reads(m: dict[str, Any]) -> list[dict[str, Any]]:
    """What the round read: ``kv_reads``, or from an older trace's ``kv_layer`` (one full-attention layer, 0..n-1)."""
    if m.get("kv_reads"):
        return m["kv_reads"]
    return [{"type": "full_attention", "layer": m.get("kv_layer", "?"), "positions": [0, m["root_position"] - 1]}]


def _reads_title(reads: list[dict[str, Any]]) -> str:
    """"target layer 19" for one read, "target layers 3 (sliding) and 2 (full)" for one per attention type."""
    if len(reads) == 1:
        return f"target layer {reads[0]['layer']}"
    named = [f"{r['layer']} ({str(r.get('type', '')).removesuffix('_attention')})" for r in reads]
    return "target layers " + ", ".join(named[:-1]) + " and " + named[-1]


def _source(trace: Trace) -> str:
    """", loaded from <layout> (<source>)" from the run's head record, or ""."""
    head = (trace.config or {}).get("head") or {}
    if not head.get("format"):
        return ""
    src = f" ({html.escape(str(head['source']))})" if head.get("source") else ""
    return f", loaded from the {html.escape(str(head['format']))} layout{src}"


def _logits_note(m: dict[str, Any]) -> str:
    """What the logits are and how T > 0 is verified: centroid masking and one-hot drafts, when the head does so."""
    parts = []
    if m.get("real_logits"):
        parts.append(f"Centroid-masked logits: only the tokens of the top-k centroid clusters ({m['real_logits']} of "
                     f"{m.get('vocab_size', '?')}) get real logits; every other token's logit is a constant (-inf "
                     "here), so the head's q is not a real distribution outside the clusters.")
    if m.get("one_hot_draft"):
        parts.append("The head drafts its argmax at every temperature and the target verifies it as a deterministic "
                     "draft (q one-hot, as vLLM treats greedy drafters): at T > 0 a draft x is accepted with "
                     "probability p(x) and a rejection draws from p without x, so the output still follows the "
                     "target exactly.")
    return "".join(f"<p style='font-size:13px;color:#374151' class='sv-mtp-logits'>{html.escape(t)}</p>" for t in parts)


def mtp_figure(trace: Trace | dict[str, Any], step: int, height: int = 300) -> go.Figure:
    """Bars: the head's confidence (its probability) in each pass's drafted token (the q the verifier used is in
    the table: 1 for an argmax draft), coloured by the target's decision, with the head's top
    probability as a line; the x labels name the pass and its (constant) position."""
    trace = as_trace(trace)
    st = trace.steps[step]
    m = st.match
    if m.get("kind") != "mtp" or not m.get("steps") or not st.draft_token_ids:
        return message_figure("no MTP draft at this step", height=160)
    steps = m["steps"][: len(st.draft_token_ids)]
    xs = [f"pass {s['step']} @ {s['position']}" for s in steps]
    fates = [_fate(st, s["step"]) for s in steps]
    fig = go.Figure()
    fig.add_trace(go.Bar(x=xs, y=[s.get("draft_prob") for s in steps],
                         name="the head's probability of the drafted token",
                         marker={"color": [FATE_COLOUR[f] for f in fates]},
                         text=[label(trace, int(t), 8) for t in st.draft_token_ids], textposition="outside",
                         cliponaxis=False, hovertemplate="%{text}: %{y:.3f}<extra>%{x}</extra>", showlegend=False))
    for fate in dict.fromkeys(fates):  # one legend entry per colour the bars use
        fig.add_trace(go.Bar(x=[None], y=[None], name=f"probability of the drafted token: {fate}",
                             marker={"color": FATE_COLOUR[fate]}))
    fig.add_trace(go.Scatter(x=xs, y=[s.get("head_top_prob") for s in steps], mode="lines+markers",
                             name="probability of the head's top token", line={"dash": "dot", "color": "#6b7280"}))
    fig.update_layout(height=height, margin={"l": 50, "r": 20, "t": 60, "b": 40}, plot_bgcolor="#ffffff",
                      title={"text": f"MTP chain: every pass at position {steps[0]['position']},<br>reading the K/V "
                                     f"of {_reads_title(_reads(m))}",  # two lines: one ran past a half-page panel
                             "font": {"size": 13}},
                      yaxis={"range": [0, 1.15], "title": "probability"}, legend={"orientation": "h", "y": -0.25})
    return fig


def draft_why(trace: Trace, st: Step) -> str | None:
    """The lesson's sentences: every step of the head ran at the same position, on the target's own K/V."""
    m, k = st.match or {}, len(st.draft_token_ids)
    steps = (m.get("steps") or [])[:k]
    if m.get("kind") != "mtp" or len(steps) < k or not k:
        return None
    per = "; ".join(f"pass {s['step']} → {quoted(trace, t)}"
                    + (f" (the head's probability of it {fmt_prob(s['draft_prob'])})"
                       if s.get("draft_prob") is not None else "")
                    for s, t in zip(steps, st.draft_token_ids))
    return (f"The MTP head ran {k} pass(es), every one at the same position {steps[0]['position']}, reading the keys "
            f"and values of {_reads_title(_reads(m))} from the target's own cache (it has none of its own). Pass 1 "
            "took the target's last hidden state and the last committed token, each later pass its own hidden state "
            "and its previous draft: " + per + ".")


panel_html, panel_figure = mtp_html, mtp_figure  # the view contract (specviz.methods.base)
