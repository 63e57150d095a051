"""The Compare tab's handlers: functions of plain data (the tab's state is the comparison's dict, or None) from its
controls to its views (the table, the token strips and scrubber, the same draft under every rule, the k sweep), and
export / import / open-in-the-single-run-views."""


from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Iterator

import gradio as gr

from specviz.compare import (
    comparison_from_dict,
    load_comparison,
    MAX_COMPARISON_BYTES,
    Comparison,
    ComparisonFormatError,
    iter_comparison,
    new_comparison,
    table,
    table_csv,
)
from specviz.compare.run import fitting
from specviz.trace import ACCEPTANCE_LENGTH_CONVENTIONS
from specviz.viz import compare as vc
from specviz.viz import compare_table as ct

from .cache import DecoderCache, StopSignals
from .outputs import full_outputs, md_text, new_state, upload_bytes

from .compare_config import MAX_NEW_TOKENS, _numbers, _prompts, build_configs, runnable


# ---- views ---------------------------------------------------------------------------------
TABLE_DATATYPES = ["html" if c in ct.HTML_COLUMNS else "str" for c in vc.TABLE_COLUMNS]  # ct.app_table_rows' cells
OUTPUT_NAMES = ("progress", "table", "strips", "scrub", "rules", "ksweep", "prompt", "seed", "run", "position",
                "legend")


def convention_choices() -> list[tuple[str, str]]:
    """(label with the formula, key) of every acceptance-length convention, vLLM's first."""
    return [(f"{label} = {formula}", key) for key, (label, formula, _) in ACCEPTANCE_LENGTH_CONVENTIONS.items()]


def _convention(value: Any) -> str:
    return value if value in ACCEPTANCE_LENGTH_CONVENTIONS else "vllm"


UNSURE_COLOR = "#6b7280"  # a flagged row's speedup: the near-tie badge's grey, lighter than the text, legible projected


def _table(rows: list[dict[str, Any]], convention: str):
    """The table (:func:`specviz.viz.compare_table.app_table_rows`, one line per configuration) as a pandas
    Styler: the cells keep their numbers (the columns sort numerically) and show them with a fixed number of decimals
    (1.50, not 1.5; tokens/s one decimal), empty where there is no value; the badge red (✗) or grey (near-tie), and the
    speedup grey where a flag makes it unfit to rank by (:func:`specviz.viz.compare_table.speedup_unsure`)."""
    import pandas as pd

    frame = pd.DataFrame(ct.app_table_rows(rows, convention), columns=ct.app_columns(convention))
    decimals = {c: "{:.1f}" if c == ct.APP_HEADERS["tokens/s"] else "{:.2f}" for c in frame.columns
                if c not in ("configuration", "runs") and frame[c].dtype.kind == "f"}
    colors = [vc.badge_color(row["lossless"]) for row in rows]  # the badge: red ✗, grey near-tie
    unsure = [UNSURE_COLOR if ct.speedup_unsure(row) else "" for row in rows]  # flagged: not a speedup to rank by
    badge = frame.columns[-1]
    return (frame.style.format(na_rep="").format(decimals, na_rep="")
            .apply(lambda col: [f"color: {c}" if c else "" for c in colors], subset=[badge])
            .apply(lambda col: [f"color: {c}" if c else "" for c in unsure], subset=[ct.APP_HEADERS["speedup"]]))


def _views(c: Comparison, progress: str, prompt: int = 0, seed: int | None = None, position: int = 1,
           convention: str = "vllm") -> tuple:
    """Every output of the tab except the state, in OUTPUT_NAMES order."""
    rows = table(c)
    seed = c.seeds[0] if seed is None or seed not in c.seeds else seed
    prompt = min(max(int(prompt), 0), len(c.prompts) - 1)
    n = max([len(r.trace.output_token_ids) for r in c.runs if r.prompt == prompt and r.seed == seed] or [1])
    position = min(max(int(position), 1), n)
    source = vc.rules_source(c)
    rules = vc.rules_figure(source) if source is not None else _message(  # a line, not a large empty box
        "no run at temperature > 0 verified with standard or block (greedy runs draw no uniforms):<br>"
        "try the preset “same draft, every rule”", height=90)
    prompt_dd = gr.Dropdown(choices=[(f"{i + 1}: {p.name}", i) for i, p in enumerate(c.prompts)], value=prompt)
    seed_dd = gr.Dropdown(choices=list(c.seeds), value=seed)
    run_dd = gr.Dropdown(choices=[(cfg.label, i) for i, cfg in enumerate(c.configs)],
                         value=next((r.config for r in c.runs if r.config > 0), 0))
    return (progress, _table(rows, convention), vc.strips_figure(c, prompt, seed, position),
            vc.scrub_html(c, prompt, seed, position), rules, vc.ksweep_figure(rows, convention), prompt_dd, seed_dd, run_dd,
            gr.Slider(minimum=1, maximum=max(n, 2), value=position, step=1, interactive=n > 1),
            ct.table_legend(rows, c.machine, c.baseline_timings))


def _message(text: str, height: int = 260):
    from specviz.viz import message_figure

    return message_figure(text, height)


def _error(message: str, note: str = "the views below are unchanged") -> tuple:
    gr.Warning(message)
    return (f"**error** · {md_text(message)} · _{note}_", *([gr.skip()] * (len(OUTPUT_NAMES) - 1)), gr.skip())


def _progress(c: Comparison, total: int, last: str) -> str:
    return f"**running** · {len(c.runs)}/{total} runs · last: {last}"


class CompareHandlers:
    """The model cache and this tab's stop signals bound to the handlers that need them."""

    def __init__(self, cache: DecoderCache, signals: StopSignals | None = None):
        self.cache, self.signals = cache, signals or StopSignals()

    def run(self, chosen: list[str], ks: Any, verifies: list[str], temperatures: Any, prompt_keys: list[str],
            own: str, seeds: Any, max_new_tokens: Any, convention: str = "vllm", trees: Any = "",
            request: gr.Request = None) -> Iterator[tuple]:
        """Run the comparison, yielding every view after each finished run (the table and the k sweep
        in the acceptance-length ``convention``; ``trees``: the ';'-separated draft trees run beside the
        chains). Bad input -> the message in the progress line, the views unchanged."""
        convention = _convention(convention)
        try:
            n_new = int(float(max_new_tokens))
            if not 1 <= n_new <= MAX_NEW_TOKENS:
                raise ValueError(f"max new tokens must be in 1..{MAX_NEW_TOKENS}, got {max_new_tokens}")
            decoder = self.cache.get()
            chosen, skipped = runnable(decoder, chosen)
            prompts, too_long = fitting(decoder, _prompts(prompt_keys, own), n_new)
            skipped += too_long
            c = new_comparison(build_configs(chosen, ks, verifies, temperatures, trees), prompts,
                               _numbers(seeds, int, "seeds"), n_new)
        except (ValueError, TypeError) as exc:
            yield _error(str(exc))
            return
        session = getattr(request, "session_hash", None) or "default"
        flag = self.signals.start(session)
        total = len(c.configs) * len(c.prompts) * len(c.seeds)
        note = "; skipped: " + "; ".join(skipped) if skipped else ""
        try:
            with self.cache.in_use():  # the background warm-up waits until the comparison has ended
                for r in iter_comparison(decoder, c, flag):
                    label = (f"{c.configs[r.config].label}, {md_text(vc.prompt_label(c, r.prompt))}, seed {r.seed} "
                             f"({r.wall_s:.1f} s)")
                    yield (*_views(c, _progress(c, total, label) + note, convention=convention), c.to_dict())
        except ValueError as exc:
            yield _error(str(exc), f"the views below show the {len(c.runs)} runs before it" if c.runs else
                         "the views below are unchanged")
            return
        finally:
            self.signals.finish(session, flag)
        done = "stopped" if len(c.runs) < total else "done"
        yield (*_views(c, f"**{done}** · {len(c.runs)}/{total} runs{note}", convention=convention), c.to_dict())

    def stop(self, request: gr.Request = None) -> str:
        """End this session's comparison after the current run."""
        running = self.signals.stop(getattr(request, "session_hash", None) or "default")
        return "**stopping** after the current run…" if running else "Nothing is running."


def _comparison(state: dict[str, Any] | None) -> Comparison | None:
    return comparison_from_dict(state) if state else None


def view(state: dict[str, Any] | None, prompt: Any, seed: Any, position: Any) -> tuple:
    """Redraw the strips and the scrubber for another prompt / seed / output position (a typed position outside
    the outputs is clamped to them; before any comparison the scrubber goes back to 1)."""
    c = _comparison(state)
    if c is None or not c.runs:
        return gr.skip(), gr.skip(), gr.Slider(value=1)
    out = _views(c, "", int(prompt or 0), None if seed is None else int(seed), int(position or 1))
    return out[2], out[3], out[9]


def convention_view(state: dict[str, Any] | None, convention: Any) -> tuple:
    """The table and the k sweep again, in another acceptance-length convention."""
    c = _comparison(state)
    if c is None or not c.runs:
        return gr.skip(), gr.skip()
    rows = table(c)
    return _table(rows, _convention(convention)), vc.ksweep_figure(rows, _convention(convention))


def export(state: dict[str, Any] | None, convention: str = "vllm") -> list[str]:
    """compare.csv, compare.json and compare.html (offline; its table in the acceptance-length
    ``convention``) of the comparison. gr.Error when empty."""
    c = _comparison(state)
    if c is None or not c.runs:
        raise gr.Error("nothing to export yet: run a comparison or import one first")
    out = Path(tempfile.mkdtemp(prefix="specviz-compare-"))
    (out / "compare.csv").write_text(table_csv(c), encoding="utf-8")
    (out / "compare.json").write_text(c.to_json(), encoding="utf-8")
    (out / "compare.html").write_text(vc.report_html(c, _convention(convention)), encoding="utf-8")
    return [str(out / n) for n in ("compare.csv", "compare.json", "compare.html")]


def import_comparison(path: str | None, convention: str = "vllm") -> tuple:
    """Upload: a saved compare.json (size-capped, validated as data, never executed) drawn again."""
    try:
        data = upload_bytes(path, MAX_COMPARISON_BYTES, "comparisons")
    except ValueError as exc:
        return _error(str(exc))
    try:
        c = load_comparison(data)
    except ComparisonFormatError as exc:
        return _error(f"this is not a specviz comparison: {exc}")
    if not c.runs:
        return _error("the comparison has no runs")
    return (*_views(c, f"**imported** · {len(c.runs)} runs, {len(c.configs)} configurations (no model needed)",
                    convention=_convention(convention)), c.to_dict())


def open_run(state: dict[str, Any] | None, config: Any, prompt: Any, seed: Any, main_state: dict[str, Any] | None):
    """The chosen configuration's run of the shown prompt and seed, drawn in the single-run views
    (with method none's run of the same prompt and seed as its baseline); switches to that tab."""
    from specviz.viz import run_summary

    c = _comparison(state)
    r = c.find(int(config or 0), int(prompt or 0), int(seed)) if c is not None and seed is not None else None
    if r is None:
        gr.Warning("no such run in the comparison yet")
        return (gr.skip(),) * 13
    base = c.baseline_of(r.config)
    b = c.find(base, r.prompt, r.seed) if base is not None else None
    main = dict(main_state or new_state(), trace=r.trace.to_dict(), baseline=run_summary(b.trace) if b else None,
                streamed=False)  # a comparison's run: not streamed, no redraws in its wall time
    progress = (f"**from the comparison** · {c.configs[r.config].label}, {md_text(vc.prompt_label(c, r.prompt))}, "
                f"seed {r.seed} · _the controls above keep your own settings: Run runs those, not this configuration_")
    return (*full_outputs(progress, r.trace, main), gr.Tabs(selected="single"))


# a click on a strip cell sends "row label|position|nonce" through the hidden #sv-compare-pick box, whose change
# event moves the scrubber there and picks that configuration for "open"; every newly drawn strip is bound once
def pick_cell(state: dict[str, Any] | None, cell: Any, prompt: Any, seed: Any) -> tuple:
    """A click on a strip cell ("label|position[|nonce]"): the scrubber moves to that output position
    and the configuration to open becomes that row's. Anything unreadable changes nothing."""
    c = _comparison(state)
    parts = str(cell or "").split("|")
    if c is None or not c.runs or len(parts) < 2:
        return (gr.skip(),) * 4
    config = next((i for i, cfg in enumerate(c.configs) if cfg.label == parts[0]), None)
    try:
        position = int(float(parts[1]))
    except ValueError:
        return (gr.skip(),) * 4
    strips, scrub, slider = view(state, prompt, seed, position)
    return strips, scrub, slider, gr.skip() if config is None else config
