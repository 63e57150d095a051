"""The Compare tab: configurations x prompts x seeds on the loaded decoder, streamed as each run
finishes; the table, aligned token strips with a shared scrubber, the same draft under every rule,
the k sweep; export (CSV, JSON, HTML) and import. Handlers are functions of plain data.

Session state of the tab (one ``gr.State``): the comparison's dict (:meth:`Comparison.to_dict`) or None.
Every event has an api_name: compare, compare_stop, compare_preset, compare_view, compare_view_seed,
compare_scrub, compare_pick (a click on a strip cell), compare_export, compare_import, compare_open,
compare_convention (the acceptance-length convention of the table and the k sweep).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

import gradio as gr

from specviz import methods as registry
from specviz.compare import (
    comparison_from_dict,
    load_comparison,
    MAX_COMPARISON_BYTES,
    Comparison,
    ComparisonFormatError,
    Prompt,
    RunConfig,
    expand_configs,
    iter_comparison,
    new_comparison,
    table,
    table_csv,
)
from specviz.trace import ACCEPTANCE_LENGTH_CONVENTIONS
from specviz.viz import compare as vc

from .cache import DecoderCache, StopSignals
from .outputs import md_text

ROOT = Path(__file__).resolve().parents[2]
COMPARE_PROMPTS = ROOT / "assets" / "examples" / "compare_prompts.json"
EXAMPLES = ROOT / "assets" / "examples" / "prompts.json"
VERIFY_CHOICES = ("auto", "greedy", "standard", "block")
MAX_NEW_TOKENS = 256
PRESETS_PATH = ROOT / "assets" / "examples" / "compare_presets.json"


def load_presets(path: Path = PRESETS_PATH) -> dict[str, dict[str, Any]]:
    """The Compare tab's presets ({name: {"methods", "ks", "verify", "temperatures", "trees"?}}; {} when unreadable)."""
    try:
        return dict(json.loads(path.read_text(encoding="utf-8"))["presets"])
    except (OSError, ValueError, KeyError, TypeError):
        return {}


PRESETS = load_presets()


def methods() -> list[str]:
    """Speculative methods the registry has (so new ones appear), method none left out (it always runs)."""
    return [m for m in registry.names() if m != "none"]


def runnable(decoder: Any, chosen: list[str]) -> tuple[list[str], list[str]]:
    """(the chosen methods the loaded decoder can run, "method (why not)" for the others): e.g. eagle
    without a trained head for this target is left out and the progress line says so."""
    keep, skipped = [], []
    for m in chosen:
        why = registry.get(m).missing(decoder) if m in registry.names() else None
        (skipped.append(f"{m} ({why})") if why else keep.append(m))
    return keep, skipped


def prompt_choices() -> list[tuple[str, str]]:
    """(label, key) of the bundled comparison prompts ("set:i") and the app's examples ("ex:i")."""
    out = []
    for i, p in enumerate(_read(COMPARE_PROMPTS, "prompts")):
        out.append((f"{p.get('category', '')} · {p['name']}", f"set:{i}"))
    for i, e in enumerate(_read(EXAMPLES, "examples")):
        out.append((f"example · {e['name']}", f"ex:{i}"))
    return out


def _read(path: Path, key: str) -> list[dict[str, Any]]:
    try:
        return [p for p in json.loads(path.read_text(encoding="utf-8"))[key] if "name" in p]
    except (OSError, ValueError, KeyError):
        return []


def _prompts(keys: list[str] | None, own: str | None) -> list[Prompt]:
    bundled, examples = _read(COMPARE_PROMPTS, "prompts"), _read(EXAMPLES, "examples")
    out = []
    for key in keys or []:
        kind, _, idx = str(key).partition(":")
        if kind == "set" and idx.isdigit() and int(idx) < len(bundled):
            p = bundled[int(idx)]
            out.append(Prompt(p["name"], p["text"], p.get("category", "")))
        elif kind == "ex" and idx.isdigit() and int(idx) < len(examples):
            e = examples[int(idx)]
            out.append(Prompt(e["name"], e["prompt"], "example"))
        else:
            raise ValueError(f"unknown prompt {key!r}")
    if own and own.strip():
        out.append(Prompt("your prompt", own, "your own"))
    if not out:
        raise ValueError("choose at least one prompt (or type your own)")
    return out


def _numbers(text: Any, cast: type, what: str) -> list[Any]:
    from specviz.compare.cli import _list

    values = _list(str(text or "").strip() or None, cast, what)
    if values == [None]:
        raise ValueError(f"{what} is empty: type e.g. {'5' if cast is int else '0'}")
    return values


def build_configs(chosen: list[str] | None, ks: Any, verifies: list[str] | None, temperatures: Any,
                  trees: Any = "") -> list[RunConfig]:
    """Checkbox and text values -> configurations (methods x k x verification x temperature as chains, plus
    the ';'-separated ``trees`` for the methods that take each, :func:`specviz.compare.expand_configs`; "auto"
    verification = greedy at T = 0, else standard). Methods with options of their own run them at the app's starting
    values (prompt lookup 2..4, as the examples).
    Raises ValueError with what to change."""
    if not chosen:
        raise ValueError("choose at least one method")
    known = methods()
    unknown = [m for m in chosen if m not in known]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; choose from {known}")
    k_values = _numbers(ks, int, "k")
    temps = _numbers(temperatures, float, "temperatures")
    rules = [None if v == "auto" else v for v in (verifies or ["auto"])]
    specs = [t.strip() for t in str(trees or "").split(";") if t.strip()]
    options = {f.name: f.metadata["ui"] for m in registry.all_methods() for f in registry.option_fields(m.options)}
    return expand_configs(chosen, k_values, rules, temps, specs, options)


def apply_preset(name: str) -> tuple[Any, ...]:
    """A preset's methods, k values, verifications, temperatures and draft trees (gr.skip() for an unknown name)."""
    p = PRESETS.get(name)
    if p is None:
        return (gr.skip(),) * 5
    chosen = methods() if p["methods"] == "all" else [m for m in p["methods"] if m in methods()]
    return chosen, p["ks"], p["verify"], p["temperatures"], p.get("trees", "")


# ---- views ---------------------------------------------------------------------------------
OUTPUT_NAMES = ("progress", "table", "strips", "scrub", "rules", "ksweep", "prompt", "seed", "run", "position")


def convention_choices() -> list[tuple[str, str]]:
    """(label with the formula, key) of every acceptance-length convention, vLLM's first."""
    return [(f"{label} = {formula}", key) for key, (label, formula, _) in ACCEPTANCE_LENGTH_CONVENTIONS.items()]


def _convention(value: Any) -> str:
    return value if value in ACCEPTANCE_LENGTH_CONVENTIONS else "vllm"


def _table(rows: list[dict[str, Any]], convention: str):
    """The table as a pandas Styler: the cells keep their numbers (the columns sort numerically) and show them
    with a fixed number of decimals (1.50, not 1.5; tokens/s one decimal), empty where there is no value."""
    import pandas as pd

    frame = pd.DataFrame(vc.table_rows(rows, convention), columns=vc.table_columns(convention))
    decimals = {c: "{:.1f}" if c == "tokens/s" else "{:.2f}" for c in frame.columns
                if c not in ("configuration", "runs") and frame[c].dtype.kind == "f"}
    return frame.style.format(na_rep="").format(decimals, na_rep="")


def _views(c: Comparison, progress: str, prompt: int = 0, seed: int | None = None, position: int = 1,
           convention: str = "vllm") -> tuple:
    """Every output of the tab except the state, in OUTPUT_NAMES order."""
    rows = table(c)
    seed = c.seeds[0] if seed is None or seed not in c.seeds else seed
    prompt = min(max(int(prompt), 0), len(c.prompts) - 1)
    n = max([len(r.trace.output_token_ids) for r in c.runs if r.prompt == prompt and r.seed == seed] or [1])
    position = min(max(int(position), 1), n)
    source = vc.rules_source(c)
    rules = vc.rules_figure(source) if source is not None else _message(
        "no run at temperature > 0 verified with standard or block (greedy runs draw no uniforms):<br>"
        "try the preset “same draft, every rule”")
    prompt_dd = gr.Dropdown(choices=[(f"{i + 1}: {p.name}", i) for i, p in enumerate(c.prompts)], value=prompt)
    seed_dd = gr.Dropdown(choices=list(c.seeds), value=seed)
    run_dd = gr.Dropdown(choices=[(cfg.label, i) for i, cfg in enumerate(c.configs)],
                         value=next((r.config for r in c.runs if r.config > 0), 0))
    return (progress, _table(rows, convention), vc.strips_figure(c, prompt, seed, position),
            vc.scrub_html(c, prompt, seed, position), rules, vc.ksweep_figure(rows, convention), prompt_dd, seed_dd, run_dd,
            gr.Slider(minimum=1, maximum=max(n, 2), value=position, step=1, interactive=n > 1))


def _message(text: str):
    from specviz.viz import message_figure

    return message_figure(text)


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
            c = new_comparison(build_configs(chosen, ks, verifies, temperatures, trees), _prompts(prompt_keys, own),
                               _numbers(seeds, int, "seeds"), n_new)
        except (ValueError, TypeError) as exc:
            yield _error(str(exc))
            return
        session = getattr(request, "session_hash", None) or "default"
        flag = self.signals.start(session)
        total = len(c.configs) * len(c.prompts) * len(c.seeds)
        try:
            for r in iter_comparison(decoder, c, flag):
                label = (f"{c.configs[r.config].label}, {md_text(vc.prompt_label(c, r.prompt))}, seed {r.seed} "
                         f"({r.wall_s:.1f} s)")
                yield (*_views(c, _progress(c, total, label), convention=convention), c.to_dict())
        except ValueError as exc:
            yield _error(str(exc), f"the views below show the {len(c.runs)} runs before it" if c.runs else
                         "the views below are unchanged")
            return
        finally:
            self.signals.finish(session, flag)
        done = "stopped" if len(c.runs) < total else "done"
        note = "; skipped: " + "; ".join(skipped) if skipped else ""
        yield (*_views(c, f"**{done}** · {len(c.runs)}/{total} runs{note}", convention=convention), c.to_dict())

    def stop(self, request: gr.Request = None) -> str:
        """End this session's comparison after the current run."""
        running = self.signals.stop(getattr(request, "session_hash", None) or "default")
        return "**stopping** after the current run…" if running else "Nothing is running."


def _comparison(state: dict[str, Any] | None) -> Comparison | None:
    return comparison_from_dict(state) if state else None


def view(state: dict[str, Any] | None, prompt: Any, seed: Any, position: Any) -> tuple:
    """Redraw the strips and the scrubber for another prompt / seed / output position."""
    c = _comparison(state)
    if c is None or not c.runs:
        return (gr.skip(),) * 3
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
    if not path:
        return _error("no file received")
    size = os.path.getsize(path)
    if size > MAX_COMPARISON_BYTES:
        return _error(f"the file is {size / 2**20:.1f} MB; comparisons up to {MAX_COMPARISON_BYTES // 2**20} MB "
                      "are accepted")
    try:
        c = load_comparison(Path(path).read_bytes())
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

    from . import handlers as h

    c = _comparison(state)
    r = c.find(int(config or 0), int(prompt or 0), int(seed)) if c is not None and seed is not None else None
    if r is None:
        gr.Warning("no such run in the comparison yet")
        return (gr.skip(),) * 13
    base = c.baseline_of(r.config)
    b = c.find(base, r.prompt, r.seed) if base is not None else None
    main = dict(main_state or h.new_state(), trace=r.trace.to_dict(), baseline=run_summary(b.trace) if b else None,
                streamed=False)  # a comparison's run: not streamed, no redraws in its wall time
    progress = (f"**from the comparison** · {c.configs[r.config].label}, {md_text(vc.prompt_label(c, r.prompt))}, "
                f"seed {r.seed} · _the controls above keep your own settings: Run runs those, not this configuration_")
    return (*h._full_outputs(progress, r.trace, main), gr.Tabs(selected="single"))


# a click on a strip cell sends "row label|position|nonce" through the hidden #sv-compare-pick box, whose change
# event moves the scrubber there and picks that configuration for "open"; every newly drawn strip is bound once
PICK_CELL_JS = """
const svBindStrips = () => {
  const gd = document.querySelector('#sv-compare-strips .js-plotly-plot');
  if (!gd || gd.svBound || typeof gd.on !== 'function') return;
  gd.svBound = true;
  gd.on('plotly_click', (ev) => {
    const pt = ev && ev.points && ev.points[0];
    const box = document.querySelector('#sv-compare-pick textarea, #sv-compare-pick input');
    if (!pt || pt.data.type !== 'heatmap' || !box) return;
    box.value = `${pt.y}|${pt.x}|${Date.now()}`;
    box.dispatchEvent(new Event('input', {bubbles: true}));
  });
};
new MutationObserver(svBindStrips).observe(document.body, {childList: true, subtree: true});
svBindStrips();
"""


# every header of the table gets its formula as a tooltip (gr.Dataframe has no header tooltips of its own);
# the headers are re-rendered on every update, so each new header cell is titled once
HEADER_TIPS_JS = """
const svTips = %s;
const svTitleHeaders = () => {
  for (const th of document.querySelectorAll('#sv-compare-table th')) {
    const name = (th.innerText || '').trim();
    const tip = svTips[name];
    if (tip && th.title !== tip) {
      th.title = tip;
      th.querySelectorAll('*').forEach((e) => { e.title = tip; });
    }
  }
};
new MutationObserver(svTitleHeaders).observe(document.body, {childList: true, subtree: true});
svTitleHeaders();
""" % json.dumps(vc.COLUMN_FORMULAS, ensure_ascii=False)


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


# ---- layout --------------------------------------------------------------------------------
def compare_tab(cache: DecoderCache, main_state: gr.State, main_outputs: list, tabs: gr.Tabs) -> dict[str, Any]:
    """The Compare tab inside ``tabs``; ``main_outputs``: the single-run tab's full outputs (for
    "open in the single-run views"). Returns the tab's components by name."""
    handlers = CompareHandlers(cache)
    u: dict[str, Any] = {}
    with gr.Tab("Compare", id="compare", elem_id="sv-compare-tab"):
        gr.Markdown("## Compare methods on the same prompts\nEvery configuration runs on every prompt and seed, one "
                    "after another on the loaded models; method none runs in the same comparison at every "
                    "temperature, so each speedup is measured side by side. Every run starts from the same state: a method's "
                    "state across requests (suffix decoding's tree of earlier outputs) is empty at each run, whatever "
                    "ran before.", elem_classes="sv-explain")
        with gr.Row(equal_height=False):
            with gr.Column(scale=2, min_width=340):
                u["preset"] = gr.Dropdown(list(PRESETS), value=None, label="Presets")
                u["methods"] = gr.CheckboxGroup(methods(), value=methods(), label="methods (method none is always run)")
                with gr.Row():
                    u["ks"] = gr.Textbox("5", label="k (comma-separated)")
                    u["temperatures"] = gr.Textbox("0", label="temperatures")
                    u["seeds"] = gr.Textbox("0", label="seeds (e.g. 0,1,2 or 0-4)")
                u["verify"] = gr.CheckboxGroup(list(VERIFY_CHOICES), value=["auto"],
                                               label="verification (auto = greedy at T = 0, else standard)")
                u["trees"] = gr.Textbox("", label="draft trees beside the chains (';'-separated, optional)",
                                        placeholder="4,5,24; 4,6,32", elem_id="sv-compare-trees",
                                        info=f"EAGLE-2 top_k,depth,total_tokens ({', '.join(registry.taking('dynamic'))}) "
                                             f"· a static tree [(0,), (1,), (0, 0)] ({', '.join(registry.taking('static'))}) "
                                             f"· branches per node, e.g. 2 ({', '.join(registry.taking('branches'))}); "
                                             "each runs for the chosen methods that take it, at k = its depth")
                choices = prompt_choices()
                first = [k for k in ("set:0", "set:3", "set:6") if k in dict((k, n) for n, k in choices)]
                u["prompts"] = gr.Dropdown(choices, value=first, multiselect=True,
                                           label="prompts (bundled set by category, and the examples)")
                u["own"] = gr.Textbox("", lines=3, label="your own prompt (optional)")
                u["max_new"] = gr.Slider(1, MAX_NEW_TOKENS, value=64, step=1, label="max new tokens")
                with gr.Row():
                    run_btn = gr.Button("Run comparison", variant="primary", elem_id="sv-compare-run")
                    stop_btn = gr.Button("Stop", variant="stop", elem_id="sv-compare-stop")
            with gr.Column(scale=5, min_width=500):
                u["progress"] = gr.Markdown("Pick a preset or configurations and prompts, then press Run comparison.",
                                            elem_id="sv-compare-progress")
                gr.Markdown(vc.TABLE_HELP, elem_classes="sv-explain")
        u["convention"] = gr.Radio(convention_choices(), value="vllm", label="mean acceptance length (AL) convention",
                                   info="vLLM, llama.cpp, AIPerf: only steps with a draft count · per forward: "
                                        "SGLang, EAGLE's τ, Spec-Bench (every step counts) · drafts only: vLLM's "
                                        "AL − 1. Hover the AL header for the full definition.",
                                   elem_id="sv-compare-convention")
        u["table"] = gr.Dataframe(headers=list(vc.TABLE_COLUMNS), interactive=False, wrap=True, max_height=1000,
                                  column_widths=list(vc.COLUMN_WIDTHS), elem_id="sv-compare-table",
                                  label="one row per configuration, pooled over prompts and seeds (hover a header for its formula, "
                                        "click it to sort)")
        gr.Markdown("### Token strips: where each method drafted, was rejected, got a bonus")
        with gr.Row():
            u["prompt"] = gr.Dropdown([], label="prompt", elem_id="sv-compare-prompt")
            u["seed"] = gr.Dropdown([], label="seed")
            u["position"] = gr.Slider(1, 2, value=1, step=1, label="output position (shared scrubber)",
                                      elem_id="sv-compare-position")
        u["strips"] = gr.Plot(elem_id="sv-compare-strips", show_label=False)
        u["pick"] = gr.Textbox(elem_id="sv-compare-pick", elem_classes="sv-hidden", show_label=False, container=False)
        u["scrub"] = gr.HTML(elem_id="sv-compare-scrub", js_on_load=PICK_CELL_JS + HEADER_TIPS_JS)
        with gr.Row():
            u["run"] = gr.Dropdown([], label="configuration to open")
            open_btn = gr.Button("Open this run in the single-run views", elem_id="sv-compare-open")
        gr.Markdown("### The same draft, every rule\nOne recorded run's drafts and uniforms, decided by greedy, "
                    "standard and block verification step by step (each step keeps the recorded context: a replay "
                    "of one draft stream, not three decodes). Taken from the first run at T > 0 verified with block "
                    "(whose h is recorded) or standard; greedy runs record no uniforms.", elem_classes="sv-explain")
        u["rules"] = gr.Plot(elem_id="sv-compare-rules", show_label=False)
        gr.Markdown("### k sweep")
        u["ksweep"] = gr.Plot(elem_id="sv-compare-ksweep", show_label=False)
        with gr.Row():
            with gr.Column():
                exp_btn = gr.Button("Export CSV + JSON + HTML report", elem_id="sv-compare-export")
                u["files"] = gr.File(label="downloads", file_count="multiple", interactive=False)
            u["upload"] = gr.File(label=f"import a compare.json (max {MAX_COMPARISON_BYTES // 2**20} MB)",
                                  file_types=[".json"], type="filepath", elem_id="sv-compare-upload")
        state = gr.State(None)
    outputs = [u[n] for n in OUTPUT_NAMES] + [state]
    inputs = [u["methods"], u["ks"], u["verify"], u["temperatures"], u["prompts"], u["own"], u["seeds"], u["max_new"],
              u["convention"], u["trees"]]
    event = run_btn.click(handlers.run, inputs, outputs, api_name="compare", concurrency_limit=2)
    stop_btn.click(handlers.stop, None, [u["progress"]], api_name="compare_stop")
    u["preset"].input(apply_preset, [u["preset"]], [u["methods"], u["ks"], u["verify"], u["temperatures"], u["trees"]],
                      api_name="compare_preset")
    for comp in (u["prompt"], u["seed"]):
        comp.input(view, [state, u["prompt"], u["seed"], u["position"]], [u["strips"], u["scrub"], u["position"]],
                   api_name="compare_view" if comp is u["prompt"] else "compare_view_seed")
    u["position"].input(view, [state, u["prompt"], u["seed"], u["position"]], [u["strips"], u["scrub"], u["position"]],
                        api_name="compare_scrub", trigger_mode="always_last")
    u["pick"].change(pick_cell, [state, u["pick"], u["prompt"], u["seed"]],
                     [u["strips"], u["scrub"], u["position"], u["run"]], api_name="compare_pick",
                     trigger_mode="always_last")
    exp_btn.click(export, [state, u["convention"]], [u["files"]], api_name="compare_export")
    u["upload"].upload(import_comparison, [u["upload"], u["convention"]], outputs, api_name="compare_import")
    u["convention"].input(convention_view, [state, u["convention"]], [u["table"], u["ksweep"]],
                          api_name="compare_convention")
    open_btn.click(open_run, [state, u["run"], u["prompt"], u["seed"], main_state], [*main_outputs, tabs],
                   api_name="compare_open")
    u["state"], u["event"] = state, event
    return u
