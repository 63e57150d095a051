"""Measured layout checks for the browser tests: what a class would see as clipped or overlapping, read from the
page's own boxes (no pixels compared). Each check is a script run in the page by ``page.evaluate`` that returns a
list of findings, empty when the layout is clean, so a test asserts ``== []`` and its failure says what collides.

- :data:`OVERLAPS_JS` (argument: a CSS selector of a view): inside each Plotly figure of the view, pairs of texts
  whose drawn boxes intersect (a rotated tick label is its rotated rectangle, not its axis-aligned hull), markers
  that cover a text other than their own label, and lines that run through a text (sampled along the path, inside
  the line's own plot area, where it is drawn).
- :data:`CLIPPED_JS` (argument: a CSS selector): elements matching it whose content is taller or wider than their
  box (clipped or scrolled away, as a chapter text under a max-height is).
"""

from __future__ import annotations

# a text's box is shrunk by this share of its height on each side before comparing: the font box holds the line
# gap as well as the glyphs, so touching line boxes of stacked text are no collision
_SHRINK = 0.18

OVERLAPS_JS = """(sel) => {
  const SHRINK = %(shrink)s, out = [];
  const quad = (el, shrink) => {
    let b; try { b = el.getBBox(); } catch (e) { return null; }
    const m = el.getScreenCTM();
    if (!m || !b || b.width <= 0 || b.height <= 0) return null;
    const dy = b.height * shrink, dx = Math.min(dy, b.width / 4);
    return [[b.x + dx, b.y + dy], [b.x + b.width - dx, b.y + dy], [b.x + b.width - dx, b.y + b.height - dy],
            [b.x + dx, b.y + b.height - dy]].map(([x, y]) => { const p = new DOMPoint(x, y).matrixTransform(m);
                                                                 return [p.x, p.y]; });
  };
  // separating axis test of two convex quadrilaterals (screen coordinates)
  const apart = (a, b) => {
    for (const poly of [a, b]) for (let i = 0; i < 4; i++) {
      const [x1, y1] = poly[i], [x2, y2] = poly[(i + 1) %% 4], nx = y2 - y1, ny = x1 - x2;
      const pa = a.map(([x, y]) => x * nx + y * ny), pb = b.map(([x, y]) => x * nx + y * ny);
      if (Math.max(...pa) <= Math.min(...pb) || Math.max(...pb) <= Math.min(...pa)) return true;
    }
    return false;
  };
  const inside = (q, [x, y]) => {
    let sign = 0;
    for (let i = 0; i < 4; i++) {
      const [x1, y1] = q[i], [x2, y2] = q[(i + 1) %% 4], c = (x2 - x1) * (y - y1) - (y2 - y1) * (x - x1);
      if (c !== 0) { if (sign && Math.sign(c) !== sign) return false; sign = Math.sign(c); }
    }
    return true;
  };
  const name = (el) => (el.textContent || el.getAttribute('class') || el.tagName).trim().slice(0, 40);
  for (const gd of document.querySelectorAll(sel + ' .js-plotly-plot')) {
    const texts = [...gd.querySelectorAll('.main-svg text')]
      .filter((t) => t.textContent.trim() && !t.closest('.hoverlayer') && getComputedStyle(t).visibility !== 'hidden'
                     && t.getAttribute('opacity') !== '0')
      .map((t) => ({el: t, q: quad(t, SHRINK), trace: t.closest('.trace')})).filter((t) => t.q);
    for (let i = 0; i < texts.length; i++) for (let j = i + 1; j < texts.length; j++) {
      const a = texts[i], b = texts[j];
      if (a.el.contains(b.el) || b.el.contains(a.el) || apart(a.q, b.q)) continue;
      out.push(`text '${name(a.el)}' overlaps text '${name(b.el)}'`);
    }
    for (const pt of gd.querySelectorAll('.cartesianlayer .scatterlayer .point')) {
      const q = quad(pt, 0.1), own = pt.closest('.trace');
      if (!q) continue;
      for (const t of texts) if (t.trace !== own && !apart(q, t.q)) out.push(`marker overlaps text '${name(t.el)}'`);
    }
    const svg = gd.querySelector('.main-svg').getBoundingClientRect(), fl = gd._fullLayout;
    for (const line of gd.querySelectorAll('.cartesianlayer .scatterlayer .js-line')) {
      // the line is drawn clipped to its own plot area (its axes' offsets and lengths)
      const tr = line.closest('.trace'), d = tr && tr.__data__ && tr.__data__[0] && tr.__data__[0].trace;
      const xa = d && fl['xaxis' + (d.xaxis || 'x').slice(1)], ya = d && fl['yaxis' + (d.yaxis || 'y').slice(1)];
      const frame = xa && ya ? {left: svg.left + xa._offset, right: svg.left + xa._offset + xa._length,
                                top: svg.top + ya._offset, bottom: svg.top + ya._offset + ya._length} : null;
      const m = line.getScreenCTM();
      let length = 0; try { length = line.getTotalLength(); } catch (e) { continue; }
      const hit = new Set();
      for (let s = 0; s <= length && m; s += 2) {
        const p = new DOMPoint(line.getPointAtLength(s).x, line.getPointAtLength(s).y).matrixTransform(m);
        if (frame && (p.x < frame.left || p.x > frame.right || p.y < frame.top || p.y > frame.bottom)) continue;
        for (const t of texts) if (!hit.has(t) && !t.el.closest('.legend') && inside(t.q, [p.x, p.y])) hit.add(t);
      }
      for (const t of hit) out.push(`a line runs through text '${name(t.el)}'`);
    }
  }
  return out;
}""" % {"shrink": _SHRINK}

CLIPPED_JS = """(sel) => [...document.querySelectorAll(sel)]
  .filter((e) => e.scrollHeight > e.clientHeight + 1 || e.scrollWidth > e.clientWidth + 1)
  .map((e) => `${e.className || e.id}: content ${e.scrollWidth}x${e.scrollHeight} in a box ${e.clientWidth}x${e.clientHeight}` +
              ` ('${e.innerText.trim().slice(-60)}')`)"""
