"""Lesson mode controls: Lesson / Back / Play / Next, jump to a step, the chapter panel, and the
presentation layout's switch. The chapters are :mod:`specviz.viz.lesson` (pure functions of the
trace); these handlers only move an index and select the chapter's step and position in the
existing views.

Events (api names, besides ``lesson_reset`` when a run or upload ends the lesson): ``lesson_start``, ``lesson_next``, ``lesson_back``, ``lesson_goto`` (a step
index), ``lesson_play`` (toggles Play), ``lesson_tick`` (Play's timer: the next chapter, pausing at
the last), ``lesson_brief`` (the "brief" box: steps after the first two in one chapter each). Keyboard while
a lesson runs: right arrow = Next, left arrow = Back, space = Play/Pause (ignored while typing in a field;
"jump to step" + Enter gives the focus back to the page, so the arrows move the lesson again). The
presentation layout (large type, Run and the chapter above
the fold) is on with ``?present=1`` in the URL or ``build_app(present=True)`` (``app.py --present``).
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from specviz.trace import Trace
from specviz.viz.lesson import BRIEF_FULL_STEPS, chapter_html, chapter_of_step, lesson_chapters

from .outputs import number as _number, sliders as _sliders, trace_of as _trace_of
from .views import selection_views

PLAY_SECONDS = 6.0  # Play shows the next chapter after this many seconds
PRESENT_FONT_SCALE = 1.45  # presentation layout: text inside every Plotly figure this many times larger
PRESENT_HEIGHT_SCALE = 1.15  # and each figure this many times taller, for the larger text
PRESENT_MIN_FIGURE_PX = 380  # but, while a lesson runs, no taller than the viewport below the chapter panel (>= this)
PRESENT_MAX_SHRINK = 0.25  # unless that takes more than this share of its height (the 2 x 2 statistics: left as is)
IDLE = ("<div class='sv-lesson-idle'{present}>Lesson mode: after a run (or an uploaded trace), press "
        "<b>Lesson</b> to walk through it chapter by chapter: Next / Back (→ / ←), Play (space), or jump to a step."
        "</div>")
NO_TRACE = "<div class='sv-lesson-idle'>There is no run to explain yet: press Run (or upload a trace), then Lesson.</div>"

# Highlights the view the chapter talks about, scrolls it into view below the (sticky) chapter
# panel, binds the keyboard once, and turns the presentation layout on (?present=1 or data-present).
LESSON_JS = (r"""
const params = new URLSearchParams(window.location.search);
if (['1', 'true', 'yes'].includes(params.get('present')) || element.querySelector('[data-present="1"]')) {
  document.body.classList.add('sv-present');
}
const svFocus = () => {
  const ch = element.querySelector('.sv-chapter');
  document.body.classList.toggle('sv-lesson-on', !!ch);
  if (typeof svCaptions === 'function') svCaptions();  // the residual caption: short with a lesson on, else full
  if (!ch) document.body.style.paddingTop = '';
  document.querySelectorAll('.sv-focus').forEach((e) => e.classList.remove('sv-focus'));
  if (!ch) return;
  const target = document.getElementById(ch.dataset.focus);
  if (!target) return;
  target.classList.add('sv-focus');
  if (element.svShown === ch.dataset.index) return;
  element.svShown = ch.dataset.index;
  const panel = document.getElementById('sv-lesson');
  document.body.style.paddingTop = `${panel ? panel.offsetHeight : 0}px`;  // the panel is fixed while a lesson runs
  // after the views redraw (their heights settle), put the view's top just below the panel; placed again while
  // the views may still be arriving from a slow server (up to 3 s), unless another chapter is shown by then or the
  // reader has scrolled (wheel or touch) since this chapter was shown
  const shown = ch.dataset.index, shownAt = Date.now();
  const place = () => {
    if (element.svShown !== shown || (window.svUserScrollAt || 0) > shownAt) return;
    svFit(target);
    const below = panel ? panel.offsetHeight : 0;
    const top = target.getBoundingClientRect().top + window.scrollY - below - 8;
    window.scrollTo({top: Math.max(top, 0), behavior: 'instant'});
  };
  [250, 900, 1800, 3000].forEach((ms) => setTimeout(place, ms));
};
if (!window.svScrollWatch) {  // the reader's own scrolling ends the re-placing (once per page)
  window.svScrollWatch = true;
  const mark = () => { window.svUserScrollAt = Date.now(); };
  window.addEventListener('wheel', mark, {passive: true});
  window.addEventListener('touchmove', mark, {passive: true});
}
new MutationObserver(svFocus).observe(element, {childList: true, subtree: true, characterData: true});
// presentation layout: every Plotly figure's text PRESENT_FONT_SCALE times larger (titles, captions, ticks,
// legends, cell text; not the axis titles given their own small size, which are long sentences that fill the width), re-applied after each redraw (a new layout object) and laid out again by Plotly itself,
// so margins and automargins follow the larger text
const svScale = (gd) => {
  const L = gd.layout;
  if (!document.body.classList.contains('sv-present') || !window.Plotly || !L || gd.svScaled === L) return;
  gd.svScaled = L;
  const k = %(scale)s, base = (L.font && L.font.size) || 12, up = {'font.size': Math.round(base * k)};
  const size = (f) => Math.round(((f && f.size) || base) * k);
  if (L.title && L.title.font && L.title.font.size) up['title.font.size'] = size(L.title.font);
  if (L.legend && L.legend.font && L.legend.font.size) up['legend.font.size'] = size(L.legend.font);
  (L.annotations || []).forEach((a, i) => {
    up[`annotations[${i}].font.size`] = size(a.font);
    if (typeof a.text === 'string' && a.text.includes('font-size:'))  // inline sizes of a caption's smaller lines
      up[`annotations[${i}].text`] = a.text.replace(/font-size:\s*([0-9.]+)px/g, (m, v) => `font-size:${Math.round(v * k)}px`);
  });
  if (L.margin && L.margin.t) up['margin.t'] = Math.round(L.margin.t * k);  // room for a caption written above the plot
  Object.assign(up, svCaption(gd, up['margin.t']) || {});
  for (const key of Object.keys(L).filter((key) => /^[xy]axis[0-9]*$/.test(key))) {
    const ax = L[key];
    if (ax.tickfont && ax.tickfont.size) up[`${key}.tickfont.size`] = size(ax.tickfont);
  }
  // the draft tree's rows and columns are sized for its boxes' text: they grow with it (columns up to the
  // width of the tree's panel)
  const tree = L.meta && L.meta.tree_nodes !== undefined;
  const grow = tree ? k : %(grow)s;
  if (L.height) up.height = svFitHeight(Math.round(L.height * grow));
  const panel = gd.closest('#sv-tree');
  if (tree && L.width && panel) up.width = Math.max(L.width, Math.min(Math.round(L.width * k), panel.clientWidth - 24));
  if (tree) Object.assign(up, svTreeFit(L, up['margin.t'] || (L.margin && L.margin.t) || 0, up.height, k) || {});
  const texts = (gd.data || []).map((t, i) => [i, t.textfont && t.textfont.size]).filter(([, v]) => v);
  if (texts.length) window.Plotly.restyle(gd, {'textfont.size': texts.map(([, v]) => Math.round(v * k))},
                                          texts.map(([i]) => i));
  window.Plotly.relayout(gd, up);
};
// presentation layout with a lesson on: the residual view's caption is its bold question only (the figure's
// meta.caption_head, in a top margin of meta.caption_head_px): the pinned chapter says the rest, and the caption's four
// lines at this scale took half of the figure's height from the bars; with the lesson off the full caption comes
// back. Returns the relayout to make (null: nothing to change); applied when the figure is drawn and when a chapter
// is placed or the lesson ends (a lesson may start after the figure was drawn). top: the full caption's margin now.
const svCaption = (gd, top) => {
  const L = gd.layout, head = L && L.meta && L.meta.caption_head;
  if (!head || !document.body.classList.contains('sv-present')) return null;
  const i = (L.annotations || []).findIndex((a) => a.name === 'caption');
  if (i < 0) return null;
  const on = document.body.classList.contains('sv-lesson-on'), text = L.annotations[i].text;
  if (on && text !== head) {
    gd.svCaptionFull = {text, top: top || (L.margin && L.margin.t) || 0};
    return {[`annotations[${i}].text`]: head, 'margin.t': Math.round(L.meta.caption_head_px * %(scale)s)};
  }
  if (!on && text === head && gd.svCaptionFull) {
    const full = gd.svCaptionFull;
    gd.svCaptionFull = null;
    return {[`annotations[${i}].text`]: full.text, 'margin.t': full.top};
  }
  return null;
};
const svCaptions = () => {
  for (const gd of document.querySelectorAll('#sv-residual .js-plotly-plot')) {
    const c = gd.svScaled ? svCaption(gd) : null;  // a figure not yet scaled gets it in svScale
    if (window.Plotly && c) window.Plotly.relayout(gd, c);
  }
};
// presentation layout with a lesson on: a figure is at most the viewport below the fixed chapter panel tall
// (its legend and captions included; Plotly lays the plot area out again inside), never under %(least)s px;
// one that would lose more than %(shrink)s of its height to fit is left as it is (its text would collide)
const svRoom = () => {
  const panel = document.getElementById('sv-lesson');
  const below = document.body.classList.contains('sv-lesson-on') && panel ? panel.offsetHeight : 0;
  return window.innerHeight - below - 24;
};
const svFitHeight = (h) => {
  const room = Math.max(svRoom(), %(least)s);
  return document.body.classList.contains('sv-present') && room < h && room >= h * (1 - %(shrink)s) ? room : h;
};
// presentation layout with a lesson on: a draft tree taller than the room below the chapter panel gets a row
// pitch that fits (its title, definitions, rule line and legend keep their size and place): the node boxes'
// text shrinks with the pitch (never over the layout's %(scale)sx, never under 0.9x), down to one line per box
// (the numbers stay in the hover) when two lines do not fit at 1x; a tree that does not fit even so is left as it is
// (L: the layout, its text sizes times tk; top: its top margin, height: its height, both as they will be drawn)
const svTreeFit = (L, top, height, tk) => {
  const m = L.meta || {}, on = document.body.classList;
  if (!m.tree_rows || !on.contains('sv-present') || !on.contains('sv-lesson-on')) return null;
  // the top margin as tall as its text needs: the title (8 px pad), the definitions' lines, 28 px for the rule line
  const defs = (L.annotations || []).find((a) => a.name === 'definitions'), size = (f) => ((f && f.size) || 12) * tk;
  const lines = defs ? String(defs.text).split('<br>').length : 0;
  top = Math.min(top, Math.ceil(8 + 1.3 * size(L.title && L.title.font) + 8 + 1.3 * size(defs && defs.font) * lines + 28));
  const room = svRoom(), fixed = top + ((L.margin && L.margin.b) || 0), pitch = (room - fixed) / m.tree_rows;
  let s = Math.min(%(scale)s, pitch / m.tree_row_px), compact = m.tree_compact, font = m.tree_box_font;
  if (s < 1 && !compact) [compact, font, s] = [true, 10, Math.min(%(scale)s, pitch / 22)];  // tree.py's one-line row
  if (s < 0.9 || (height <= room && s >= %(scale)s)) return null;
  // the legend pinned to the figure's bottom edge, inside the bottom margin (as a paper-anchored legend below the
  // plot area Plotly drew it over the lowest rows once the figure was shortened)
  const up = {height: Math.floor(room), 'margin.t': top, 'legend.yref': 'container', 'legend.y': 0,
              'legend.yanchor': 'bottom'};
  (L.annotations || []).forEach((a, i) => {
    if (!String(a.name || '').startsWith('node ')) return;
    up[`annotations[${i}].font.size`] = Math.round(font * s);
    if (compact && typeof a.text === 'string') up[`annotations[${i}].text`] = a.text.split('<br>')[0];
  });
  return up;
};
// presentation layout with a lesson on: the 2 x 2 statistics figure, taller than the room below the chapter panel,
// is given that height and the compact geometry of its meta.stats_fit (specviz/viz/stats.py PRESENT_FIT: pixel
// room for each row's titles, ticks and axis titles and for the legend, the text a little smaller than the layout's
// %(scale)sx); left as it is when its rows would get less than min_row_px
const svStatsFit = (L) => {
  const f = L.meta && L.meta.stats_fit, on = document.body.classList;
  if (!f || !on.contains('sv-present') || !on.contains('sv-lesson-on')) return null;
  const room = Math.floor(svRoom()), bottom = f.axis_px + f.legend_px, area = room - f.top_px - bottom;
  const gap = (f.axis_px + f.title_px) / area, row = (1 - gap) / 2;
  if (L.height <= room || row * area < f.min_row_px) return null;
  const [c1, c2] = f.columns, up = {height: room, 'font.size': f.font, 'legend.font.size': f.legend,
    'margin.t': f.top_px, 'margin.b': bottom, 'legend.yref': 'container', 'legend.y': 0, 'legend.yanchor': 'bottom'};
  [c1, c2, c1, c2].forEach((c, i) => { up[`xaxis${i ? i + 1 : ''}.domain`] = c; });
  [[1 - row, 1], [1 - row, 1], [0, row], [0, row]].forEach((d, i) => { up[`yaxis${i ? i + 1 : ''}.domain`] = d; });
  for (const key of Object.keys(L).filter((key) => /^[xy]axis[0-9]*$/.test(key)))
    Object.assign(up, {[`${key}.tickfont.size`]: f.font, [`${key}.title.font.size`]: f.font});
  (L.annotations || []).forEach((a, i) => {
    const t = /^subplot-title-([0-3])$/.exec(a.name || '');
    up[`annotations[${i}].font.size`] = t ? f.titles : f.font;
    if (!t) return;
    const c = [c1, c2][t[1] %% 2];
    up[`annotations[${i}].x`] = (c[0] + c[1]) / 2;
    up[`annotations[${i}].y`] = t[1] < 2 ? 1 : row;
  });
  return up;
};
const svFit = (view) => {
  svCaptions();
  for (const gd of view.querySelectorAll('.js-plotly-plot')) {
    const t = gd.layout && (svTreeFit(gd.layout, (gd.layout.margin && gd.layout.margin.t) || 0, gd.layout.height, 1) ||
                            svStatsFit(gd.layout));
    if (window.Plotly && t) { window.Plotly.relayout(gd, t); continue; }
    const h = gd.layout && gd.layout.height;
    if (window.Plotly && h && svFitHeight(h) < h) window.Plotly.relayout(gd, {height: svFitHeight(h)});
  }
};
const svBindPlots = () => {
  if (!document.body.classList.contains('sv-present')) return;
  for (const gd of document.querySelectorAll('.js-plotly-plot')) {
    if (!gd.svScaleBound && typeof gd.on === 'function') {
      gd.svScaleBound = true;
      gd.on('plotly_afterplot', () => svScale(gd));
    }
    svScale(gd);
  }
};
new MutationObserver(svBindPlots).observe(document.body, {childList: true, subtree: true});
svBindPlots();
if (!window.svLessonKeys) {
  window.svLessonKeys = true;
  document.addEventListener('keydown', (ev) => {
    // "jump to step" + Enter: once Gradio has read the number (its submit listens to this key), the box gives up the
    // focus, so that → / ← move the lesson again instead of the box's caret (other fields keep their arrow keys)
    const jump = ev.key === 'Enter' && ev.target && ev.target.closest && ev.target.closest('#sv-lesson-goto');
    if (jump) setTimeout(() => { if (jump.contains(document.activeElement)) document.activeElement.blur(); }, 0);
    if (!document.body.classList.contains('sv-lesson-on') || ev.ctrlKey || ev.metaKey || ev.altKey) return;
    if (ev.target && ev.target.closest && ev.target.closest('input, textarea, select, [contenteditable="true"]')) return;
    const id = {ArrowRight: 'sv-lesson-next', ArrowLeft: 'sv-lesson-back', ' ': 'sv-lesson-play'}[ev.key];
    const button = id && document.getElementById(id);
    if (!button) return;
    ev.preventDefault();
    button.click();
  });
}
""" % {"scale": PRESENT_FONT_SCALE, "grow": PRESENT_HEIGHT_SCALE, "least": PRESENT_MIN_FIGURE_PX,
                                        "shrink": PRESENT_MAX_SHRINK})


def new_lesson(full_steps: int | None = None) -> dict[str, Any]:
    """A lesson's session state: the chapter shown (-1: none), whether Play is on, and how many steps are told
    in full (None: all; the "brief" box sets :data:`~specviz.viz.lesson.BRIEF_FULL_STEPS`)."""
    return {"index": -1, "playing": False, "full_steps": full_steps}


def _chapters(trace: Trace, lesson: dict[str, Any] | None) -> list:
    return lesson_chapters(trace, (lesson or {}).get("full_steps"))


def lesson_panel(present: bool = False) -> dict[str, Any]:
    """The lesson bar and chapter panel (call inside the Blocks, where it should appear)."""
    c: dict[str, Any] = {}
    with gr.Group(elem_id="sv-lesson"):
        with gr.Row(elem_id="sv-lesson-bar", equal_height=True):
            c["start"] = gr.Button("Lesson", variant="primary", elem_id="sv-lesson-start", scale=0, min_width=110)
            c["back"] = gr.Button("◀ Back", elem_id="sv-lesson-back", scale=0, min_width=110)
            c["play"] = gr.Button("Play", elem_id="sv-lesson-play", scale=0, min_width=110)
            c["next"] = gr.Button("Next ▶", elem_id="sv-lesson-next", scale=0, min_width=110)
            c["goto"] = gr.Number(None, label="jump to step", precision=0, minimum=0, elem_id="sv-lesson-goto", scale=0,
                                  min_width=120)
            c["brief"] = gr.Checkbox(False, label=f"brief: after step {BRIEF_FULL_STEPS - 1}, one chapter a step",
                                     elem_id="sv-lesson-brief", scale=0, min_width=180)
        c["text"] = gr.HTML(IDLE.format(present=" data-present='1'" if present else ""), elem_id="sv-lesson-text",
                            js_on_load=LESSON_JS)
    c["timer"] = gr.Timer(PLAY_SECONDS, active=False)
    c["state"] = gr.State(new_lesson())
    return c


def _show(trace: Trace, lesson: dict[str, Any], index: int) -> tuple[Any, ...]:
    """(chapter html, lesson state, step slider, position slider, stream, grid, residual, match,
    trie) for chapter ``index`` (clamped). A chapter about the whole run (statistics) leaves the
    sliders and the selection views as they are."""
    chapters = _chapters(trace, lesson)
    n = min(max(int(index), 0), len(chapters) - 1)
    ch = chapters[n]
    lesson = {**lesson, "index": n}
    if ch.step is None or not trace.steps:
        return (chapter_html(chapters, n), lesson, *([gr.skip()] * 7))
    position = ch.position if ch.position is not None else trace.steps[ch.step].num_accepted + 1
    views = selection_views(trace, ch.step, position)
    return (chapter_html(chapters, n), lesson, *_sliders(trace, ch.step, position), *views)


def _skip(message: str, lesson: dict[str, Any] | None) -> tuple[Any, ...]:
    return (message, {**new_lesson(), **(lesson or {}), "index": -1}, *([gr.skip()] * 7))


def lesson_start(state: dict[str, Any] | None, lesson: dict[str, Any] | None) -> tuple[Any, ...]:
    """Lesson: the first chapter of the session's trace (a message when there is none)."""
    trace = _trace_of(state)
    if trace is None or not trace.steps:
        return _skip(NO_TRACE, lesson)
    return _show(trace, lesson or new_lesson(), 0)


def _move(state: dict[str, Any] | None, lesson: dict[str, Any] | None, delta: int) -> tuple[Any, ...]:
    trace = _trace_of(state)
    if trace is None or not trace.steps:
        return _skip(NO_TRACE, lesson)
    lesson = lesson or new_lesson()
    return _show(trace, lesson, max(int(lesson.get("index", -1)), 0 if delta > 0 else 1) + delta)


def lesson_next(state: dict[str, Any] | None, lesson: dict[str, Any] | None) -> tuple[Any, ...]:
    """Next: the following chapter (stays on the last one; starts the lesson if none is shown)."""
    if (lesson or {}).get("index", -1) < 0:
        return lesson_start(state, lesson)
    return _move(state, lesson, +1)


def lesson_back(state: dict[str, Any] | None, lesson: dict[str, Any] | None) -> tuple[Any, ...]:
    """Back: the previous chapter (stays on the first)."""
    return _move(state, lesson, -1)


def lesson_goto(state: dict[str, Any] | None, lesson: dict[str, Any] | None, step: Any) -> tuple[Any, ...]:
    """Jump to step: the first chapter of that step (clamped to the run's steps)."""
    trace = _trace_of(state)
    if trace is None or not trace.steps:
        return _skip(NO_TRACE, lesson)
    chapters = _chapters(trace, lesson)
    return _show(trace, lesson or new_lesson(), chapter_of_step(chapters, int(_number(step, 0))))


def lesson_play(lesson: dict[str, Any] | None) -> tuple[Any, ...]:
    """Play / Pause: (timer, button, lesson state); Play advances every PLAY_SECONDS."""
    playing = not (lesson or {}).get("playing", False)
    return (gr.Timer(active=playing), gr.Button("Pause" if playing else "Play"),
            {**new_lesson(), **(lesson or {}), "playing": playing})


def lesson_tick(state: dict[str, Any] | None, lesson: dict[str, Any] | None) -> tuple[Any, ...]:
    """Play's timer: the next chapter; at the last chapter (or without a trace) Play pauses.
    Returns :func:`lesson_next`'s outputs, then the timer and the Play button."""
    trace = _trace_of(state)
    lesson = lesson or new_lesson()
    out = lesson_next(state, lesson)
    count = len(_chapters(trace, lesson)) if trace is not None and trace.steps else 0
    if out[1]["index"] < 0 or out[1]["index"] >= count - 1:
        return (*out[:1], {**out[1], "playing": False}, *out[2:], gr.Timer(active=False), gr.Button("Play"))
    return (*out, gr.skip(), gr.skip())


def lesson_brief(state: dict[str, Any] | None, lesson: dict[str, Any] | None, brief: Any) -> tuple[Any, ...]:
    """The "brief" box: tell only the first BRIEF_FULL_STEPS steps in full, every later one in one chapter. A lesson
    being shown stays where it was in the new form (the first chapter of the step it was on; the introduction and
    the closing statistics stay themselves); otherwise only the setting is kept."""
    old = {**new_lesson(), **(lesson or {})}
    lesson = {**old, "full_steps": BRIEF_FULL_STEPS if brief else None}
    trace = _trace_of(state)
    if lesson["index"] < 0 or trace is None or not trace.steps:
        return (gr.skip(), lesson, *([gr.skip()] * 7))
    before, after = _chapters(trace, old), _chapters(trace, lesson)
    here = before[min(int(old["index"]), len(before) - 1)]
    if here.step is not None and here.kind != "intro":
        index = chapter_of_step(after, here.step)
    else:  # the introduction (first) or the statistics (last)
        index = 0 if int(old["index"]) == 0 else len(after) - 1
    return _show(trace, lesson, index)


def lesson_reset(lesson: dict[str, Any] | None) -> tuple[Any, ...]:
    """A new run or upload ends the lesson: (idle panel, lesson state, timer off, Play button); the brief setting
    stays."""
    return (IDLE.format(present=""), new_lesson((lesson or {}).get("full_steps")), gr.Timer(active=False),
            gr.Button("Play"))


def wire_lesson(c: dict[str, Any], state: gr.State, views: dict[str, Any], resets: list[Any] = ()) -> None:
    """Connect the lesson controls ``c`` (from :func:`lesson_panel`) to the session ``state``
    and the views (``views`` holds step, position, stream, grid, residual, match, trie);
    ``resets``: event triggers (e.g. ``run_button.click``) that end a running lesson."""
    outs = [c["text"], c["state"], views["step"], views["position"],
            *(views[n] for n in ("stream", "grid", "residual", "match", "trie"))]
    common = {"concurrency_id": "selection", "trigger_mode": "always_last"}
    c["start"].click(lesson_start, [state, c["state"]], outs, api_name="lesson_start", **common)
    c["next"].click(lesson_next, [state, c["state"]], outs, api_name="lesson_next", **common)
    c["back"].click(lesson_back, [state, c["state"]], outs, api_name="lesson_back", **common)
    c["goto"].submit(lesson_goto, [state, c["state"], c["goto"]], outs, api_name="lesson_goto", **common)
    c["brief"].change(lesson_brief, [state, c["state"], c["brief"]], outs, api_name="lesson_brief", **common)
    c["play"].click(lesson_play, [c["state"]], [c["timer"], c["play"], c["state"]], api_name="lesson_play")
    if resets:
        gr.on(list(resets), lesson_reset, [c["state"]], [c["text"], c["state"], c["timer"], c["play"]],
              api_name="lesson_reset")
    c["timer"].tick(lesson_tick, [state, c["state"]], [*outs, c["timer"], c["play"]], api_name="lesson_tick",
                    **common)
