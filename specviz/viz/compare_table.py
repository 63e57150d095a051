"""The Compare tab's table, one line per configuration on a projector: short headers (the full name and formula on
hover, and a legend line under the table), configuration names without what every row shares (the legend names it),
the speedup range and the time split as short text with a flag icon, the losslessness badge cut short, and the
conditional acceptance c_i as tiny bars; everything left out of a cell is in its hover. Numbers are those of
:func:`specviz.viz.compare.table_rows`, rounded alike. Pure functions of :func:`specviz.compare.table` rows.
"""

from __future__ import annotations

import html
import re
from typing import Any

from specviz.compare.stats import CELL_TIPS, prompt_gap
from specviz.speedup import NOISY_IQR, crosses_one
from specviz.trace import ACCEPTANCE_LENGTH_CONVENTIONS
from specviz.trace.metrics import convention_label

from .compare import (COLUMN_FORMULAS, TABLE_COLUMNS, _conditional, _spread, conditional_compact, table_columns,
                      table_rows)

APP_HEADERS = {  # TABLE_COLUMNS -> the app's header (the acceptance-length column keeps its convention's label)
    "configuration": "configuration", "runs": "runs", "tokens / forward": "tok/fwd", "coverage": "cov.",
    "accept rate": "accept", "tokens/s": "tok/s", "speedup": "speedup", "speedup range (n)": "range",
    "speedup (model)": "model", "ms/step: draft / verify / sample": "ms d·v·s",
    "c_i (Wilson 95%, n), i = 1..k": "c_i", "lossless": "lossless",
}
# one line per row in the 1214 px the table gets at 1280 px and wider (14 px cells, 12 px headers, app.css): a
# 15-character name, "0.16–13.28 ⚠", "36.2·391.7·22.9 ⚠", 8 bars and "✓ equal (3/3)" each fit their column
APP_COLUMN_WIDTHS = ("13.5%", "4.5%", "6.5%", "8%", "4.5%", "5.5%", "5.5%", "6.5%", "10.5%", "5%", "13.5%", "5.5%",
                     "11%")
HTML_COLUMNS = ("speedup range (n)", "ms/step: draft / verify / sample", "c_i (Wilson 95%, n), i = 1..k", "lossless")
GLYPHS = "✓✗≈⚠"  # drawn in a font whose ✓ is a check (the table's monospace one draws it as √): app.css .sv-glyph
BADGE_MAX = 16  # a longer losslessness badge is cut (its whole text is in the hover)
CPU_SPREAD_NOTE = ("compare them only within one comparison: on a busy CPU identical comparisons have moved by 15-35 "
                   "%, so rank methods here by tokens per forward, not by these speedups")


def app_columns(convention: str = "vllm") -> list[str]:
    """The app table's headers in TABLE_COLUMNS order (the acceptance length named for ``convention``; ValueError
    for an unknown one)."""
    return [APP_HEADERS.get(c, c) for c in table_columns(convention)]


def app_formulas() -> dict[str, str]:
    """Each app header's hover: the column's full name and formula (COLUMN_FORMULAS), every convention's AL too."""
    out = {APP_HEADERS[c]: (COLUMN_FORMULAS[c] if APP_HEADERS[c] == c else f"{c}: {COLUMN_FORMULAS[c]}")
           for c in TABLE_COLUMNS if c in APP_HEADERS}
    out.update({label: COLUMN_FORMULAS[label] for label, _, _ in ACCEPTANCE_LENGTH_CONVENTIONS.values()})
    return out


def glyphs(text: str) -> str:
    """``text`` HTML-escaped, each of GLYPHS in a ``sv-glyph`` span."""
    return "".join(f"<span class='sv-glyph'>{ch}</span>" if ch in GLYPHS else html.escape(ch) for ch in text)


def _tip(text: str, body: str, cls: str = "") -> str:
    """``body`` (HTML) in a span whose hover is ``text``."""
    return f"<span{f' class={cls!r}' if cls else ''} title='{html.escape(text)}'>{body}</span>"


def _flag(text: str) -> str:
    return _tip(text, "⚠", "sv-glyph sv-flag")


# ---- what every row shares ------------------------------------------------------------------
def shared(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What every row has alike and its name can leave out: {"k", "verify"} over the rows that draft (when there are
    some), "temperature" over all rows; a key is absent where rows differ."""
    drafting = [r for r in rows if r["method"] != "none"]
    out: dict[str, Any] = {}
    for key in ("k", "verify"):
        if drafting and len({r[key] for r in drafting}) == 1:
            out[key] = drafting[0][key]
    if rows and len({r["temperature"] for r in rows}) == 1:
        out["temperature"] = rows[0]["temperature"]
    return out


def short_label(row: dict[str, Any], common: dict[str, Any]) -> str:
    """The row's configuration name (:attr:`specviz.compare.RunConfig.label`'s parts) without the parts in
    ``common`` (:func:`shared`): "M k=5 greedy T=0" is "M" when every row has k = 5, greedy, T = 0."""
    parts = [row["method"]]
    if row["method"] != "none":
        parts += [row["tree_label"]] if row.get("tree_label") else []
        parts += [] if "k" in common else [f"k={row['k']}"]
        parts += [] if "verify" in common else [row["verify"]]
    parts += [] if "temperature" in common else [f"T={row['temperature']:g}"]
    return " ".join(parts)


# ---- cells ---------------------------------------------------------------------------------
def range_cell(row: dict[str, Any]) -> str | None:
    """The speedup range as "0.90–1.19" (n in the hover), a ⚠ after a noisy one or a single sample; method none's
    row: its own timings' spread. None without a spread."""
    s = row.get("speedup_spread")
    text = _spread(s)
    if text is None:
        return None
    if row["method"] == "none":
        why = ("method none's timings (several per prompt and seed, spread over the comparison) ÷ that prompt and "
               "seed's median one: how far the baseline's speed moved while the comparison ran")
    else:
        why = "lowest–highest of the per-(prompt, seed) ratios tokens/s ÷ method none's, and n"
    by_prompt = s.get("by_prompt") or []
    tip = f"{text}: {why}" + (f"; by prompt: {', '.join(f'{p + 1}: {m:.2f}' for p, m, _ in by_prompt)}"
                              if len(by_prompt) > 1 else "")
    if s["n"] == 1:
        return _tip(tip, "n 1") + " " + _flag("one sample, unchecked: add seeds or prompts before reading it")
    shown = _tip(tip, f"{s['low']:.2f}–{s['high']:.2f}")
    if s["noisy"] and s.get("noise_known") is False:
        return shown + " " + _flag(f"spread {s['low']:.2f}–{s['high']:.2f} (n {s['n']}): the prompts differ or the "
                                   "machine is noisy, and one timing per request cannot tell which; add seeds (at "
                                   "T = 0 they time the same request again)")
    if s["noisy"] and s.get("unexplained"):
        speed_gap, tpf_gap = s["unexplained"]
        return shown + " " + _flag(f"noisy: the prompts' speedups differ by {100 * speed_gap:.0f} % but their tokens "
                                   f"per forward by {100 * tpf_gap:.0f} %: the timing moved, not the acceptance, so "
                                   "the speedups are not readable on this machine now")
    if s["noisy"]:
        noise = (f"method none's timings of one request ranged over {100 * s['noise']:.0f} % of their median while "
                 "the comparison ran" if s.get("noise") is not None else
                 f"the middle half of these ratios spans more than a quarter of their median (all of them "
                 f"{s['low']:.2f}–{s['high']:.2f}, n {s['n']})")
        return shown + " " + _flag(f"noisy: {noise}, so the speedups are not readable on this machine now")
    if row["method"] != "none" and crosses_one(s):
        return shown + " " + _flag(f"crosses 1×: on one prompt or seed slower than method none, on another faster "
                                   f"({s['low']:.2f}–{s['high']:.2f}): this speedup does not say which")
    return shown


def time_cell(row: dict[str, Any]) -> str:
    """ms per step as "0.4·25.9·1.4" (draft · verify · sample), a ⚠ with the timing check's detail after it when a
    timed run held a one-time cost (:func:`specviz.compare.stats.timing_check`)."""
    ms = row["ms_per_step"]
    text = f"{ms['draft']:.1f}·{ms['verify']:.1f}·{ms['sample']:.1f}"
    cell = _tip(f"ms per step: draft {ms['draft']:.1f} / verify {ms['verify']:.1f} / sample {ms['sample']:.1f}", text)
    timing = row.get("timing") or {}
    if not timing.get("mark"):
        return cell
    tips = [tip for key, tip in CELL_TIPS.items() if key in timing["mark"]]
    return cell + " " + _flag(f"{timing['mark']}: {timing.get('detail', '')}. {' '.join(tips)}".strip())


def conditional_bars(row: dict[str, Any]) -> str:
    """c_1 … c_k as tiny bars (height = rate; a position no step verified: a hollow bar), the rates, their Wilson
    95 % intervals and n in the hover; "—" without drafts."""
    if not row["conditional"]:
        return "—"
    bars = "".join("<i class='sv-ci-none'></i>" if c["rate"] is None else
                   f"<i style='height:{max(100 * c['rate'], 6):.0f}%'></i>" for c in row["conditional"])
    return _tip(f"c_i = {conditional_compact(row)}\n{_conditional(row)}", bars, "sv-ci")


def short_badge(badge: str) -> str:
    """The losslessness badge in at most BADGE_MAX characters: "≈ near-tie" for a 16-bit near-tie, "≈ χ² p=0.34"
    for the distribution test, "few seeds" for too few samples, "✗ synthetic", else cut with "…"."""
    if badge.startswith("≈ equal:"):
        return "≈ near-tie"
    if badge.startswith("not lossless (synthetic)"):
        return "✗ synthetic"
    if badge.startswith("not enough samples"):
        return "few seeds"
    test = re.match(r"^(\S) χ² per position (p=\S+)", badge)
    if test:
        return f"{test.group(1)} χ² {test.group(2)}"
    return badge if len(badge) <= BADGE_MAX else badge[:BADGE_MAX - 1] + "…"


def badge_cell(row: dict[str, Any]) -> str:
    """:func:`short_badge` with the whole badge, its detail and what its mark means in the hover."""
    badge, detail = row["lossless"]["badge"], row["lossless"].get("detail", "")
    tips = [tip for key, tip in CELL_TIPS.items() if key in badge]
    return _tip(" ".join([f"{badge}: {detail}", *tips]), glyphs(short_badge(badge)))


def app_table_rows(rows: list[dict[str, Any]], convention: str = "vllm") -> list[list[Any]]:
    """The app table's rows in :func:`app_columns` order: the numbers of :func:`specviz.viz.compare.table_rows`
    (numbers stay numbers, so the columns sort), a short name (:func:`short_label`) and HTML cells for the columns
    of HTML_COLUMNS (:func:`range_cell`, :func:`time_cell`, :func:`conditional_bars`, :func:`badge_cell`)."""
    common = shared(rows)
    cells = {"speedup range (n)": range_cell, "ms/step: draft / verify / sample": time_cell,
             "c_i (Wilson 95%, n), i = 1..k": conditional_bars, "lossless": badge_cell}
    out = []
    for row, values in zip(rows, table_rows(rows, convention)):
        values[0] = short_label(row, common)
        for col, cell in cells.items():
            values[TABLE_COLUMNS.index(col)] = cell(row)
        out.append(values)
    return out


def table_legend(rows: list[dict[str, Any]], machine: dict[str, Any] | None = None, baseline_timings: int = 1) -> str:
    """The line under the app table (Markdown): what every row shares (:func:`shared`), the short headers spelt out,
    and how far its measured speedups can be compared: against method none timed ``baseline_timings`` times per
    prompt and seed on ``machine``'s device, within this comparison only. "" without rows."""
    if not rows:
        return ""
    common = shared(rows)
    alike = [f"k = {common['k']}"] if "k" in common else []
    alike += [f"{common['verify']} verification"] if "verify" in common else []
    alike += [f"T = {common['temperature']:g}"] if "temperature" in common else []
    device = str((machine or {}).get("device", "this machine"))
    timed = (f"timed {baseline_timings}× per prompt and seed, spread over the comparison (the median counts)"
             if baseline_timings > 1 else "timed once per prompt and seed")
    where = f"on {device}, now: {CPU_SPREAD_NOTE}" if device.startswith("cpu") else f"on {device}, now"
    return ((f"**Every row:** {', '.join(alike)}. " if alike else "")
            + "**tok/fwd** tokens per target forward · **cov.** draft coverage · **accept** draft acceptance rate · "
              "**range** lowest–highest speedup over the prompts and seeds · **model** Leviathan et al.'s predicted "
              "speedup · **ms d·v·s** ms per step: draft · verify · sample · **c_i** acceptance at draft position i "
              "given 1..i-1 (bars, i = 1..k) · ⚠ a flag, spelt out under **Flags** below · hover a header or a cell "
              "for the rest.  \n"
            + f"**Speedups** are tokens/s ÷ method none's, {timed}, {where}."
            + (" A grey speedup carries a flag below: do not rank by it." if any(map(speedup_unsure, rows)) else "")
            + flags_line(rows, common) + heads_line(rows, common))


def heads_line(rows: list[dict[str, Any]], common: dict[str, Any]) -> str:
    """"  \n**Heads given:** eagle3 k=5: eagle3-specforge /path · ...": the heads that are not the bundled ones (a
    ``--head`` replaces a bundled head; the table's names do not show it), "" when every head is bundled (the trace's
    head record says; a trace that does not is judged by its path)."""
    from specviz.models import ASSETS_MODELS

    def not_bundled(row: dict[str, Any]) -> bool:
        bundled = row.get("head_bundled")
        return bundled is False or (bundled is None and str(ASSETS_MODELS) not in row["head"])

    given = [f"{short_label(row, common)}: {row['head']}" for row in rows if row.get("head") and not_bundled(row)]
    return f"  \n**Heads given:** {' · '.join(given)}" if given else ""


# what each flag of the table means, in the words the line under it uses (the cells' hovers say more)
FLAG_WORDS = {"crosses 1×": "slower than method none on one prompt or seed, faster on another: no verdict",
              "noisy": "the speedups spread too far to read on this machine now",
              "one sample": "one prompt and seed only, unchecked",
              "varies by prompt": "the machine was steady and the prompts' tokens per forward differ too; speedup per "
                                  "prompt 1, 2, …",
              "⚠ capture": "a timed step captured a CUDA graph (kept out of the step times)",
              "slow step": "a timed step over 10x the median: a one-time cost inside the speedup",
              "runners differ": "its runs replayed compiled and uncompiled graphs (torch.compile swapped in part way)",
              "≈ near-tie": "differs from method none only at a 16-bit near-tie (numerics, not a bug)",
              "✗": "differs from method none where rounding cannot explain it: a bug to look for"}


def varies_by_prompt(s: dict[str, Any]) -> bool:
    """Whether a steady row's per-prompt median speedups differ by more than NOISY_IQR of their median and by more
    than twice the machine's own noise (:func:`specviz.compare.stats.speedup_spread`, which calls a gap its tokens per
    forward do not explain noisy): a finding about the prompts (a repetitive one against a docstring), not noise."""
    medians = [m for _, m, _ in s.get("by_prompt") or []]
    if len(medians) < 2 or s.get("noisy") or not s.get("noise_known", True):
        return False
    return prompt_gap(medians) > max(NOISY_IQR, 2 * (s.get("noise") or 0.0))


def row_flags(row: dict[str, Any]) -> list[str]:
    """The keys of :data:`FLAG_WORDS` that ``row``'s cells carry."""
    s, flags = row.get("speedup_spread") or {}, []
    if s.get("n") == 1:
        flags.append("one sample")
    elif s.get("noisy"):
        flags.append("noisy")
    elif s.get("n") and row["method"] != "none" and crosses_one(s):
        flags.append("crosses 1×")
    elif varies_by_prompt(s):
        flags.append("varies by prompt")
    mark = (row.get("timing") or {}).get("mark", "")
    flags += [k for k in ("⚠ capture", "slow step", "runners differ") if k in mark]
    badge = short_badge(row["lossless"]["badge"])
    flags += ["≈ near-tie"] if badge == "≈ near-tie" else ["✗"] if badge.startswith("✗") else []
    return flags


# flags that make a row's measured speedup unfit to rank by (its cell is greyed); "varies by prompt" is a finding
UNSURE_SPEEDUP = ("one sample", "noisy", "crosses 1×", "⚠ capture", "slow step", "runners differ")


def speedup_unsure(row: dict[str, Any]) -> bool:
    """Whether ``row`` carries a flag of :data:`UNSURE_SPEEDUP` (the app greys its speedup cell)."""
    return any(flag in UNSURE_SPEEDUP for flag in row_flags(row))


def flags_line(rows: list[dict[str, Any]], common: dict[str, Any]) -> str:
    """"  \n**Flags:** crosses 1× (meaning): ngram_gpu, suffix · ...": each flag the table shows, what it means and
    its rows, so a projected table needs no hover; "" without flags."""
    by_flag: dict[str, list[str]] = {}
    for row in rows:
        for flag in row_flags(row):
            name = short_label(row, common)
            if flag == "varies by prompt":
                spread_ = row["speedup_spread"]
                name += " " + "/".join(f"{m:.2f}" for _, m, _ in spread_["by_prompt"])
                if spread_.get("tpf_by_prompt"):
                    name += " (tok/fwd " + "/".join(f"{t:.2f}" for _, t in spread_["tpf_by_prompt"]) + ")"
            by_flag.setdefault(flag, []).append(name)
    if not by_flag:
        return ""
    items = [f"**{flag}** ({FLAG_WORDS[flag]}): {', '.join(names)}" for flag, names in by_flag.items()]
    return "  \n**Flags:** " + " · ".join(items)
