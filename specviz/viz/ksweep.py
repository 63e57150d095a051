"""The k sweep of a comparison (:mod:`specviz.compare`): tokens per target forward against num_speculative_tokens,
one colour and marker per configuration, with the i.i.d. theory curve (1 - g) + g E, E = (1 - a^(k+1)) / (1 - a),
for chains, and the measured speedup. Pure functions of table rows; plotly only."""

from __future__ import annotations

import html
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from specviz import methods
from specviz.speedup import crosses_one
from specviz.trace.metrics import convention_label

from .common import MODEBAR_PX
from .stats import expected_tokens_per_step

# ---- the k sweep ----------------------------------------------------------------------------
# One colour and one marker per method (its registry entry's ``style``): no two built-in methods share either, and a
# method keeps them whatever else is in the sweep (the k sweep is the only Compare figure coloured by method; strips
# and rules are coloured by fate / count). Tableau 10 colours.
# methods without a style of their own: colours and markers no built-in method uses, in order of first use
EXTRA_STYLES = (("#111827", "x"), ("#0f766e", "star-square"), ("#a16207", "hourglass"), ("#4338ca", "bowtie"))
_extra: dict[str, tuple[str, str]] = {}
VARIANT_DASHES = ("solid", "dot", "dashdot", "longdashdot")  # a method's 2nd, 3rd ... verification / temperature
# a method's 2nd, 3rd ... verification / temperature: a marker no method has, and a shade of the method's colour
VARIANT_SYMBOLS = ("triangle-left", "triangle-right", "diamond-wide", "star-triangle-up", "square-x", "circle-x",
                   "hexagram", "octagon", "diamond-tall", "star-diamond", "triangle-ne", "triangle-sw")
VARIANT_SHADES = (-0.45, 0.4, -0.7, 0.6, -0.25, 0.25)  # < 0: towards black, > 0: towards white, by this share
TREE_SYMBOLS = ("diamond-open", "square-open", "triangle-up-open", "star-open", "hexagon-open")  # a method's trees
ONE_K_LEGEND_PX = 130  # px under the plots at one k: the slanted configuration names, then the legend under them
DODGE = 0.07  # k units between the markers of neighbouring configurations at one k (equal values stay apart)


def method_style(method: str) -> tuple[str, str]:
    """(colour, marker symbol) of ``method``: its registry style, else the next unused EXTRA_STYLES entry."""
    if method in methods.names() and methods.get(method).style is not None:
        return methods.get(method).style
    if method not in _extra:
        _extra[method] = EXTRA_STYLES[len(_extra) % len(EXTRA_STYLES)]
    return _extra[method]


def _shade(colour: str, share: float) -> str:
    """``colour`` (#rrggbb) mixed with black (share < 0) or white (share > 0) by |share|."""
    rgb = [int(colour[i:i + 2], 16) for i in (1, 3, 5)]
    end = 255 if share > 0 else 0
    return "#" + "".join(f"{round(c + (end - c) * abs(share)):02x}" for c in rgb)


def configuration_styles(groups: list[tuple[str, bool]]) -> list[tuple[str, str]]:
    """(colour, marker symbol) per configuration group ``(method, is_tree)`` in drawing order, each colour and each
    symbol used once: a method's first chain group gets its registry style (:func:`method_style`), its later ones
    (another verification or temperature) a shade of its colour and a VARIANT_SYMBOLS marker, its trees the
    TREE_SYMBOLS (hollow) in a shade when the plain colour is taken."""
    used_colours: set[str] = set()
    used_symbols: set[str] = {style[1] for m in methods.names() if (style := methods.get(m).style) is not None}
    out, variants = [], iter(VARIANT_SYMBOLS)
    trees: dict[str, int] = {}
    for method, tree in groups:
        colour, symbol = method_style(method)
        if tree:
            n = trees[method] = trees.get(method, -1) + 1
            symbol = TREE_SYMBOLS[n % len(TREE_SYMBOLS)]
        elif any(o == (colour, symbol) for o in out):  # the method's style is taken: a variant marker
            symbol = next((v for v in variants if v not in used_symbols), "circle-dot")
        if colour in used_colours:  # (past len(VARIANT_SHADES) + 1 groups of one method a colour repeats)
            colour = next((c for c in (_shade(colour, share) for share in VARIANT_SHADES) if c not in used_colours),
                          colour)
        used_colours.add(colour)
        used_symbols.add(symbol)
        out.append((colour, symbol))
    return out


# the left panel: tokens per target forward (every step counts), whatever acceptance-length convention the table
# shows: vLLM's AL counts only the steps that drafted, so a method that rarely drafts (ngram: 19 % of the steps in a
# lecturer's sweep, AL 4.45 against draft_model's 3.29 at 1.66 against 3.25 tokens per forward) topped the sweep
KSWEEP_Y = ("tokens per target forward", "tokens per forward", "i.i.d. theory")  # axis, title, theory
# the theory in words a hover can hold (the title's "g·E" named an E nowhere defined)
THEORY = "(1 − g) + g·(1 − a^(k+1))/(1 − a): coverage g, acceptance a"


def _theory(a: float, k: int, g: float) -> float:
    return (1 - g) + g * expected_tokens_per_step(a, k)


def category_names(groups: list[str]) -> dict[str, str]:
    """Each k-sweep group's name ("method [tree] verify T=t") without the verification and temperature when every
    group has the same ones: the x axis's categories when a comparison has one k."""
    split = [g.rsplit(" ", 2) for g in groups]
    keep_verify = len({v for _, v, _ in split}) > 1
    keep_t = len({t for _, _, t in split}) > 1
    return {g: " ".join([m] + ([v] if keep_verify else []) + ([t] if keep_t else [])) for g, (m, v, t) in zip(groups, split)}


# the speedup panel's title: each point is the comparison's speedup, its bar the range the table's "range" column gives
SPEEDUP_TITLE = "measured speedup over none{} (bar: range)"  # {}: " vs k" in a sweep; as long as the AL panel's


SINGLE_NOTE = "one sample each (n = 1), no range: not comparable; add prompts or seeds"
FEW_SAMPLES = 5  # fewer per-(prompt, seed) ratios per point: the note calls them few
OVERLAP_NOTE = "overlapping bars do not rank the methods"


NOISY_NOTE = "faded, unjoined: noisy or across 1×, not readable"


def _overlap_note(rows: list[dict[str, Any]]) -> str:
    """The speedup panel's note for the drawn points with a range (method none's row is not drawn): overlapping bars
    do not rank, n when it is small, and that faded points are noisy; two lines, so that it fits a half-width panel
    in the presentation layout's type."""
    drawn = [s for r in rows if r["method"] != "none" and (s := r.get("speedup_spread")) and s.get("n", 0) > 1]
    ns = sorted({s["n"] for s in drawn})
    few = "" if not ns or ns[0] >= FEW_SAMPLES else (f"n = {ns[0]}" if len(ns) == 1 else f"n = {ns[0]}–{ns[-1]}")
    faded = any(s["noisy"] or crosses_one(s) for s in drawn)
    # one clause a line: in the presentation layout's type a joined line ran past the half-width panel over its ticks
    return "<br>".join(([f"{few} per point (few)"] if few else []) + ([NOISY_NOTE] if faded else []) + [OVERLAP_NOTE])


def _speed_span(rows: list[dict[str, Any]], note_lines: int = 2) -> tuple[float, float] | None:
    """The speedup axis's range: every drawn point and range bar and 1x, with 8 % room below and, for the panel's
    note of ``note_lines`` lines, 12.5 % a line above. None when no row is drawn."""
    drawn = [r for r in rows if r["method"] != "none" and r.get("speedup") is not None]
    if not drawn:
        return None
    values = [1.0] + [r["speedup"] for r in drawn]
    values += [v for r in drawn if (s := r.get("speedup_spread")) and s.get("n") for v in (s["low"], s["high"])]
    lo, hi = min(values), max(values)
    pad = (hi - lo) or 0.5
    return lo - 0.08 * pad, hi + 0.125 * max(note_lines, 2) * pad


FADED = 0.3  # a faded point's opacity: 0.45 read like a solid one on a projector


def _faded(rows: list[dict[str, Any]]) -> list[float]:
    """Marker opacity per speedup point: faded (FADED) where its ratios are noisy, cross 1x or are a single sample."""
    return [FADED if (s := r.get("speedup_spread")) and (s.get("noisy") or s.get("n") == 1 or crosses_one(s)) else 1.0
            for r in rows]


def _single(rows: list[dict[str, Any]]) -> bool:
    """Whether every row's speedup rests on one per-(prompt, seed) ratio (no range to draw)."""
    return all(r.get("speedup_spread") and r["speedup_spread"].get("n", 0) == 1 for r in rows)


def _range_bars(rows: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, list[str]]:
    """Error bars from each row's speedup_spread (lowest to highest per-(prompt, seed) ratio, as the table's range
    column) and per row the hover's note: the range and n, "noisy" as the table flags it. None: no row has a spread."""
    up, down, notes = [], [], []
    for r in rows:
        s, v = r.get("speedup_spread"), r["speedup"]
        if not s or not s.get("n"):
            up.append(0.0), down.append(0.0), notes.append(" (no range)")
            continue
        if s["n"] < 2:
            up.append(0.0), down.append(0.0), notes.append(f" ({SINGLE_NOTE})")
            continue
        up.append(max(s["high"] - v, 0.0)), down.append(max(v - s["low"], 0.0))
        flag = ", ⚠ noisy: not readable on this machine now" if s["noisy"] else ""
        notes.append(f" (range {s['low']:.2f}–{s['high']:.2f}, n {s['n']}{flag})")
    if not any(up) and not any(down):
        return None, notes
    return {"type": "data", "symmetric": False, "array": up, "arrayminus": down, "thickness": 1.5, "width": 5}, notes


def _al_note(row: dict[str, Any], label: str, convention: str) -> str:
    """The hover's line: the table's acceptance length in ``convention`` and the share of steps that drafted ("" for
    a row with neither yet, e.g. mid-run)."""
    al, steps = row["acceptance_length"].get(convention), row.get("steps")
    parts = ([f"{label} {al:.2f}"] if al is not None else []) + (
        [f"drafted at {row['num_drafts'] / steps:.0%} of steps"] if steps else [])
    return "<br>" + ", ".join(parts) if parts else ""


def ksweep_figure(rows: list[dict[str, Any]], convention: str = "vllm") -> go.Figure:
    """Per method (and verification, temperature): tokens per target forward vs k (every step counts: AL per forward)
    with the i.i.d. theory (1 - g) + g E, E = (1 - a^(k+1)) / (1 - a), at the method's pooled a (accepted / verified
    positions over every k) and draft coverage g; the hover adds the table's acceptance length in ``convention`` (a
    key of specviz.trace.ACCEPTANCE_LENGTH_CONVENTIONS) and the coverage; and the measured speedup vs k, each point
    with a bar from the lowest to the highest per-(prompt, seed) ratio (the table's range column; the hover gives n
    and the table's noisy flag; a configuration of one sample per point drawn faded, without lines, with a note;
    otherwise a note that overlapping bars do not rank, saying when n < :data:`FEW_SAMPLES`). A draft tree's rows
    are their own group, drawn as a hollow symbol (one per tree of
    a method: TREE_SYMBOLS) at k = the tree's depth, with no theory curve (the i.i.d. chain model does not
    describe a tree). When every row has the same k, the x axes are the configurations instead
    (:func:`category_names`), one marker each, the theory a dash beside a chain's marker: one k spread over an axis
    read as several k. ValueError for an unknown convention."""
    label = convention_label(convention)  # the table's acceptance-length column header: in the hover
    y_title, short, formula = KSWEEP_Y
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12, subplot_titles=(
        f"{short} vs k (dashed: {formula})", SPEEDUP_TITLE.format(" vs k")))
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:  # a draft tree is its own group, drawn at k = its depth without the chain's i.i.d. theory
        if r["method"] != "none":
            tree = f" {r['tree_label']}" if r.get("tree_label") else ""
            groups.setdefault(f"{r['method']}{tree} {r['verify']} T={r['temperature']:g}", []).append(r)
    variants: dict[str, int] = {}  # method -> chain groups of it drawn so far (another verification / temperature)
    styles = configuration_styles([(rs[0]["method"], bool(rs[0].get("tree_label"))) for rs in groups.values()])
    one_k = {r["k"] for rs in groups.values() for r in rs}
    one_k = one_k.pop() if len(one_k) == 1 else None  # a single k: one category per configuration, no k axis
    names = category_names(list(groups))
    single_any = False
    for g, ((name, rs), (colour, symbol)) in enumerate(zip(groups.items(), styles)):
        rs = sorted(rs, key=lambda r: r["k"])
        tree = bool(rs[0].get("tree_label"))
        if not tree:
            variants[rs[0]["method"]] = variants.get(rs[0]["method"], -1) + 1
        v = 0 if tree else variants[rs[0]["method"]]
        line = {"color": colour, "dash": VARIANT_DASHES[v % len(VARIANT_DASHES)]}
        # a white outline: markers drawn at one place stay told apart
        marker = {"symbol": symbol, "size": 13, "color": colour, "line": {"width": 1, "color": "#ffffff"}}
        ks = [r["k"] for r in rs]
        if tree:  # a tree: a hollow symbol per k (one per tree of the method), no line to the chain's
            marker = {"symbol": symbol, "size": 14, "color": colour, "line": {"width": 2}}
        mode = "markers" if tree else "lines+markers"
        # each configuration a little beside k (DODGE apart, centred on k): equal values (ngram and ngram_gpu
        # draft the same tokens) are drawn side by side, not on top of each other; the hover gives the real k
        xs = [names[name]] * len(ks) if one_k is not None else [k + (g - (len(groups) - 1) / 2) * DODGE for k in ks]
        # the table's convention and the coverage ride in text: a rarely drafting method's vLLM AL is high
        al_text = [_al_note(r, label, convention) for r in rs]
        hover = {"customdata": ks, "text": al_text, "hovertemplate": f"{html.escape(name)}<br>k = %{{customdata}}: "
                 "%{y:.2f} tokens per forward%{text}<extra></extra>"}
        # one k: a marker alone, named as its category (a legend line through one point read as a trend)
        fig.add_trace(go.Scatter(x=xs, y=[r["acceptance_length"]["per_forward"] for r in rs],
                                 mode=mode if one_k is None else "markers", name=name if one_k is None else names[name],
                                 line=line, marker=marker, legendgroup=name, **hover), row=1, col=1)
        offered = sum(sum(c["n"] for c in r["conditional"]) for r in rs)
        a = sum(r["num_accepted_tokens"] for r in rs) / offered if offered else None
        steps = sum(r["steps"] for r in rs)
        g = sum(r["num_drafts"] for r in rs) / steps if steps else 0.0
        if a is not None and one_k is not None and not tree:  # the theory at k: a dash beside the marker
            extra = f", g = {g:.2f}"
            fig.add_trace(go.Scatter(x=[names[name]], y=[_theory(a, one_k, g)], mode="markers",
                                     marker={"symbol": "line-ew", "size": 26, "line": {"width": 2, "color": colour}},
                                     name=f"theory a = {a:.2f}{extra}", legendgroup=name, showlegend=False,
                                     hovertemplate=f"{THEORY}<br>a = {a:.2f}{extra}, k = {one_k}: %{{y:.2f}}"
                                                   "<extra>theory</extra>"),
                          row=1, col=1)
        elif a is not None and len(ks) > 0 and not tree:
            grid = list(range(1, max(ks) + 1))
            extra = f", g = {g:.2f}"
            fig.add_trace(go.Scatter(x=grid, y=[_theory(a, k, g) for k in grid], mode="lines",
                                     line={"color": colour, "dash": "dash"}, name=f"theory a = {a:.2f}{extra}",
                                     legendgroup=name, showlegend=False,
                                     hovertemplate=f"{THEORY}<br>a = {a:.2f}{extra} (one a and g for the method, "
                                                   "pooled over its runs at every k), k = %{x}: %{y:.2f}"
                                                   "<extra>theory</extra>"), row=1, col=1)
        bars, noisy = _range_bars(rs)
        # the range note rides in text (the mode draws no text): customdata stays each point's k
        speed_hover = {"customdata": ks, "text": noisy,
                       "hovertemplate": f"{html.escape(name)}<br>k = %{{customdata}}: %{{y:.2f}}×%{{text}}"
                                        "<extra></extra>"}
        single = _single(rs)  # one sample a point: faded markers and no line, which would draw a ranking
        single_any = single_any or single
        opacity = _faded(rs)
        unread = single or min(opacity) < 1.0  # a line through points that cannot be read draws a ranking too
        if bars is not None and unread and colour.startswith("#") and len(colour) == 7:  # its bars faded as well
            bars = {**bars, "color": f"rgba({int(colour[1:3], 16)}, {int(colour[3:5], 16)}, {int(colour[5:7], 16)}, "
                                     f"{FADED})"}
        fig.add_trace(go.Scatter(x=xs, y=[r["speedup"] for r in rs], mode="markers" if unread else mode, name=name,
                                 line=line, marker={**marker, "opacity": opacity},
                                 legendgroup=name, showlegend=False, error_y=bars, **speed_hover), row=1, col=2)
    note = f"faded: {SINGLE_NOTE}" if single_any else _overlap_note(rows) if groups else ""
    if note:
        fig.add_annotation(text=note, name="single-sample" if single_any else "overlap-note", showarrow=False,
                           xref="x2 domain", yref="y2 domain", x=0.5, y=1.0, yanchor="top",
                           font={"size": 11, "color": "#b45309"}, bgcolor="rgba(255,255,255,0.85)")
    fig.add_hline(y=1.0, line={"color": "#6b7280", "width": 1}, row=1, col=2)
    span = _speed_span(rows, note.count("<br>") + 1)
    if span is not None:  # the whole range bars, 1x and room for the note under the title (autorange cut whiskers)
        fig.update_yaxes(range=list(span), row=1, col=2)
    left = [y for t in fig.data if t.xaxis in (None, "x") and t.y is not None for y in t.y if y is not None]
    if left:  # tokens per forward from 1 (method none's), so the sweep's heights read against plain decoding
        lo, hi = min([1.0] + left), max(left)
        fig.update_yaxes(range=[lo - 0.08 * ((hi - lo) or 0.5), hi + 0.1 * ((hi - lo) or 0.5)], row=1, col=1)
    fig.update_yaxes(title_text=y_title, row=1, col=1)
    fig.update_yaxes(title_text="× method none tokens/s", row=1, col=2)
    fig.update_layout(height=380 + MODEBAR_PX, plot_bgcolor="#ffffff",
                      margin={"l": 60, "r": 20, "t": 40 + MODEBAR_PX, "b": 60},
                      legend={"orientation": "h", "y": -0.25, "font": {"size": 11}})
    if one_k is not None:  # the axis names every configuration, k in the titles, the legend its marker
        # half a category of room at each end: autorange put the first and last marker on the edges, half clipped
        fig.update_xaxes(type="category", categoryorder="array", categoryarray=list(names.values()), tickangle=-30,
                         range=[-0.5, len(names) - 0.5])
        fig.layout.annotations[0].text = f"{short} at k = {one_k} (dash: {formula})"
        fig.layout.annotations[1].text = SPEEDUP_TITLE.format("")
        fig.update_layout(margin={"b": ONE_K_LEGEND_PX}, legend={"y": 0, "yref": "container", "yanchor": "bottom"})
    else:
        fig.update_xaxes(title_text="k (num_speculative_tokens)", dtick=1)
    if not groups:
        fig.add_annotation(text="run a k sweep (several k per method) to draw this", showarrow=False, xref="paper",
                           yref="paper", x=0.5, y=0.5, font={"color": "#6b7280"})
    return fig
