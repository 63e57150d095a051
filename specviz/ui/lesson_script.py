"""The lesson's page script (a Gradio HTML component's ``js_on_load``): the highlight and placement of the view a
chapter talks about, the keyboard, and the presentation layout (large type inside every Plotly figure, figures fitted
below the pinned chapter panel). Constants shared with the tests are Python; the script reads them by %-formatting."""

from __future__ import annotations

PRESENT_FONT_SCALE = 1.45  # presentation layout: text inside every Plotly figure this many times larger
PRESENT_HEIGHT_SCALE = 1.15  # and each figure this many times taller, for the larger text
PRESENT_MIN_FIGURE_PX = 380  # but, while a lesson runs, no taller than the viewport below the chapter panel (>= this)
PRESENT_MAX_SHRINK = 0.25  # unless that takes more than this share of its height (the 2 x 2 statistics: left as is)
PRESENT_MIN_LABEL_PX = 14  # a draft tree's node labels fitted below the chapter panel no smaller than this

# Highlights the view the chapter talks about, scrolls it into view below the (sticky) chapter
# panel, binds the keyboard once, and turns the presentation layout on (?present=1 or data-present).
LESSON_JS = (r"""
const params = new URLSearchParams(window.location.search);
if (['1', 'true', 'yes'].includes(params.get('present')) || element.querySelector('[data-present="1"]')) {
  document.body.classList.add('sv-present');
}
// ?present=1: the lesson is brief from the start, as with app.py --present (whose box is ticked by the server); ticked
// by a click once the page has settled, so that the box's change event tells the server (the reader may untick it)
if (['1', 'true', 'yes'].includes(params.get('present')) && !window.svBriefTicked) {
  window.svBriefTicked = true;
  const tick = (tries) => {
    const box = document.querySelector('#sv-lesson-brief input[type=checkbox]');
    if (box && document.readyState === 'complete') { if (!box.checked) box.click(); return; }
    if (tries > 0) setTimeout(() => tick(tries - 1), 250);
  };
  setTimeout(() => tick(40), 500);
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
    let top = target.getBoundingClientRect().top + window.scrollY - below - 8;
    // data-anchor="bottom": the figure's lowest rows are the chapter's subject (the block test's P_i, h_i, eta_i)
    const plot = ch.dataset.anchor === 'bottom' && target.querySelector('.js-plotly-plot');
    if (plot) top = Math.max(top, plot.getBoundingClientRect().bottom + window.scrollY - window.innerHeight + 8);
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
  // meta.tick_scale: {axis: scale} for an axis whose tick labels grow less (the residual view's ten bar labels)
  const tickScale = (L.meta && L.meta.tick_scale) || {};
  for (const key of Object.keys(L).filter((key) => /^[xy]axis[0-9]*$/.test(key))) {
    const ax = L[key];
    const own = (ax.tickfont && ax.tickfont.size) || base;
    if (tickScale[key]) up[`${key}.tickfont.size`] = Math.round(own * tickScale[key]);
    else if (ax.tickfont && ax.tickfont.size) up[`${key}.tickfont.size`] = size(ax.tickfont);
  }
  // the draft tree's rows and columns are sized for its boxes' text: they grow with it (columns up to the
  // width of the tree's panel)
  const tree = L.meta && L.meta.tree_nodes !== undefined;
  const grow = tree ? k : %(grow)s;
  if (L.height) up.height = svFitHeight(Math.round(L.height * grow));
  const panel = gd.closest('#sv-tree');
  if (tree && L.width && panel) up.width = Math.max(L.width, Math.min(Math.round(L.width * k), panel.clientWidth - 24));
  const fit = tree && svTreeFit(L, up['margin.t'] || (L.margin && L.margin.t) || 0, up.height, k, up.width || L.width);
  if (fit) { Object.assign(up, fit.layout); svTreeShow(gd, fit.short); }
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
// pitch that fits, its boxes' text as large as the pitch and the depth columns allow (never over the layout's
// %(scale)sx). In order: the whole tree with two-line boxes (token, then p and q or c); else the tree's short
// arrangement (meta.tree_short, specviz/viz/tree_short.py: the accepted path, two siblings a depth and "+N more") with
// two-line boxes, else with one-line boxes (the numbers stay in the hover); each only with labels of %(label)s px or
// more. A tree that fits none so is fitted as before that minimum (boxes down to 0.9x) or left as it is. Room for
// the rows: the definitions keep their first line (the pinned chapter and the rule line say the rest) and the legend
// moves beside the tree where its columns keep room for the boxes. L: the layout, its text sizes times tk; top,
// height, width: as they will be drawn. Returns {layout: the relayout, short: the short arrangement or not} or null
const svTreeFit = (L, top, height, tk, width) => {
  const m = L.meta || {}, on = document.body.classList;
  if (!m.tree_rows || !on.contains('sv-present') || !on.contains('sv-lesson-on')) return null;
  const anns = L.annotations || [], d = anns.findIndex((a) => a.name === 'definitions');
  const size = (f) => ((f && f.size) || 12) * tk, head = d >= 0 && m.tree_defs_head;
  // the top margin as tall as its text needs: the title (8 px pad), the definitions' line, 28 px for the rule line
  const lines = d < 0 ? 0 : head ? head.split('<br>').length : String(anns[d].text).split('<br>').length;
  top = Math.min(top, Math.ceil(8 + 1.3 * size(L.title && L.title.font) + 8 +
                                1.3 * size(d >= 0 && anns[d].font) * lines + 28));
  const room = svRoom(), legend = size(L.legend && L.legend.font), below = m.tree_margin_b + m.tree_legend_px;
  // beside: the legend a column right of the tree (its symbol, padding and longest entry)
  const besidePx = 60 + 0.55 * legend * m.tree_legend_chars, oneLinePx = 0.6 * 10 * m.tree_box_chars + 7;
  const plan = (rows, beside) => {  // the boxes' size for rows at that pitch, in columns that wide
    const pitch = (room - top - (beside ? m.tree_margin_b : below)) / rows;
    const column = (width - 20 - (beside ? besidePx : 0)) / m.tree_columns;
    let compact = m.tree_compact, font = m.tree_box_font;
    let s = Math.min(%(scale)s, pitch / m.tree_row_px, compact ? column / oneLinePx : column / (m.tree_box_px || 1));
    // two lines too small: tree.py's one-line row (22 px, 10 px text)
    if (!compact && font * s < %(label)s) [compact, font, s] = [true, 10, Math.min(%(scale)s, pitch / 22, column / oneLinePx)];
    return {rows, beside, compact, font, s, label: font * s};
  };
  const best = (rows) => [plan(rows, true), plan(rows, false)].sort((a, b) => (a.compact - b.compact) || (b.s - a.s))[0];
  const short = m.tree_short, full = best(m.tree_rows), brief = short && best(short.rows);
  const readable = (p) => p && p.label >= %(label)s - 0.5;
  let pick = full, useShort = false;
  if (!(readable(full) && (!full.compact || m.tree_compact)) && readable(brief)) [pick, useShort] = [brief, true];
  else if (!readable(full) && full.s < 0.9) return null;
  if (!useShort && height <= room && pick.s >= %(scale)s && !(short && L.yaxis && L.yaxis.range &&
                                                               L.yaxis.range[0] !== m.tree_rows - 0.5)) return null;
  const {beside, compact, font, s} = pick;
  // beside: top-aligned with the tree; under: pinned to the figure's bottom edge, inside the bottom margin (as a
  // paper-anchored legend below the plot area Plotly drew it over the lowest rows once the figure was shortened)
  const up = {height: Math.floor(room), 'margin.t': top, 'margin.b': beside ? m.tree_margin_b : below, ...(beside
    ? {'legend.orientation': 'v', 'legend.x': 1.01, 'legend.xanchor': 'left', 'legend.yref': 'paper', 'legend.y': 1,
       'legend.yanchor': 'top'}
    : {'legend.yref': 'container', 'legend.y': 0, 'legend.yanchor': 'bottom'}),
    'yaxis.range': [(useShort ? short.rows : m.tree_rows) - 0.5, -0.5]};
  if (head) up[`annotations[${d}].text`] = head;
  const at = short ? (useShort ? short.at : short.full) : null, num = Math.round((m.tree_num_font || 9) * s);
  anns.forEach((a, i) => {
    const name = String(a.name || '');
    if (name.startsWith('more ')) {
      Object.assign(up, {[`annotations[${i}].visible`]: useShort, [`annotations[${i}].font.size`]: Math.round(font * s)});
      return;
    }
    if (!name.startsWith('node ')) return;
    up[`annotations[${i}].font.size`] = Math.round(font * s);
    if (typeof a.text === 'string')
      up[`annotations[${i}].text`] = compact ? a.text.split('<br>')[0] : a.text.replace(/font-size:\s*[0-9.]+px/g, `font-size:${num}px`);
    if (!at) return;
    const xy = at[name];
    up[`annotations[${i}].visible`] = !!xy;
    if (xy) Object.assign(up, {[`annotations[${i}].x`]: xy[0], [`annotations[${i}].y`]: xy[1]});
  });
  return {layout: up, short: useShort};
};
// the traces of the tree's arrangement in use shown (meta "tree-full" or "tree-short"), the other's hidden
const svTreeShow = (gd, short) => {
  const idx = (gd.data || []).map((t, i) => [t.meta, i]).filter(([m]) => m === 'tree-full' || m === 'tree-short');
  const want = idx.map(([m]) => (m === 'tree-short') === short);
  if (window.Plotly && idx.some(([, i], n) => (gd.data[i].visible !== false) !== want[n]))
    window.Plotly.restyle(gd, {visible: want}, idx.map(([, i]) => i));
};
// presentation layout with a lesson on: the 2 x 2 statistics figure, taller than the room below the chapter panel,
// is given that height and the compact geometry of its meta.stats_fit (specviz/viz/stats.py PRESENT_FIT: pixel
// room for each row's titles, ticks and axis titles and for the legend, the text a little smaller than the layout's
// %(scale)sx). A figure at least strip.min_width px wide puts its four panels in one row (strip: each column's domain
// and short titles), whose plots are as tall as the room less the titles, axes and legend; a narrower one keeps
// two rows, left as it is when they would get less than min_row_px. width: the figure's width as drawn
const svStatsFit = (L, width) => {
  const f = L.meta && L.meta.stats_fit, on = document.body.classList;
  if (!f || !on.contains('sv-present') || !on.contains('sv-lesson-on')) return null;
  const room = Math.floor(svRoom()), bottom = f.axis_px + f.legend_px, area = room - f.top_px - bottom;
  if (L.height <= room) return null;
  const s = f.strip, strip = s && width >= s.min_width && area >= f.min_row_px;
  const gap = (f.axis_px + f.title_px) / area, row = (1 - gap) / 2;
  if (!strip && row * area < f.min_row_px) return null;
  const [c1, c2] = f.columns, cols = strip ? s.columns : [c1, c2, c1, c2], z = strip ? s : f;
  const up = {height: room, 'font.size': z.font, 'legend.font.size': z.legend, 'legend.grouptitlefont.size': z.legend,
    'margin.t': f.top_px, 'margin.b': bottom, 'legend.yref': 'container', 'legend.y': 0, 'legend.yanchor': 'bottom'};
  const rows = strip ? [[0, 1], [0, 1], [0, 1], [0, 1]] : [[1 - row, 1], [1 - row, 1], [0, row], [0, row]];
  cols.forEach((c, i) => {
    const ax = i ? i + 1 : '';
    up[`xaxis${ax}.domain`] = c;
    up[`yaxis${ax}.domain`] = rows[i];
    if (strip && s.x_titles[i]) up[`xaxis${ax}.title.text`] = s.x_titles[i];
  });
  const time = L.xaxis4 && L.xaxis4.range;
  if (strip && time) Object.assign(up, {'xaxis4.range': [time[0], time[1] * s.time_range_scale], 'xaxis4.nticks': 4});
  for (const key of Object.keys(L).filter((key) => /^[xy]axis[0-9]*$/.test(key)))
    Object.assign(up, {[`${key}.tickfont.size`]: z.font, [`${key}.title.font.size`]: z.font});
  (L.annotations || []).forEach((a, i) => {
    const t = /^subplot-title-([0-3])$/.exec(a.name || '');
    up[`annotations[${i}].font.size`] = t ? z.titles : z.font;
    if (!t) return;
    const c = cols[t[1]];
    up[`annotations[${i}].x`] = (c[0] + c[1]) / 2;
    up[`annotations[${i}].y`] = rows[t[1]][1];
    if (strip) up[`annotations[${i}].text`] = s.panel_titles[t[1]];
  });
  return up;
};
const svFit = (view) => {
  svCaptions();
  for (const gd of view.querySelectorAll('.js-plotly-plot')) {
    const stats = gd.layout && svStatsFit(gd.layout, gd.getBoundingClientRect().width);
    const fit = gd.layout && svTreeFit(gd.layout, (gd.layout.margin && gd.layout.margin.t) || 0, gd.layout.height, 1,
                                       gd.layout.width);
    if (fit) svTreeShow(gd, fit.short);
    const t = (fit && fit.layout) || stats;
    if (window.Plotly && t) {
      window.Plotly.relayout(gd, t);
      // the compact rows have no room for the star's label above it (it ran into the panel's title)
      const f = stats && gd.layout.meta.stats_fit, star = f ? (gd.data || []).findIndex((d) => d.meta === f.unlabel) : -1;
      if (star >= 0) window.Plotly.restyle(gd, {mode: 'markers'}, [star]);
      continue;
    }
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
                                        "shrink": PRESENT_MAX_SHRINK, "label": PRESENT_MIN_LABEL_PX})
