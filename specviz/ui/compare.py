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
from typing import Any

import gradio as gr

from specviz import methods as registry
from specviz.compare import (
    MAX_COMPARISON_BYTES,
)
from specviz.viz import compare as vc
from specviz.viz import compare_table as ct

from .cache import DecoderCache
from .widgets import LenientSlider

from .compare_config import MAX_NEW_TOKENS, PRESETS, VERIFY_CHOICES, apply_preset, methods, prompt_choices
from .compare_handlers import (OUTPUT_NAMES, TABLE_DATATYPES, CompareHandlers, convention_choices, convention_view, export,
                               import_comparison, open_run, pick_cell, view)

# presentation layout: a comparison done or stopped brings its table to the top, a refused one its message
SHOW_RESULTS_JS = ("() => { const p = document.getElementById('sv-compare-progress'); "
                   "if (!p || !document.body.classList.contains('sv-present')) return; "
                   "if (!/^(done|stopped) ·/.test(p.innerText.trim())) "
                   "{ p.scrollIntoView({block: 'center'}); return; } "
                   "document.getElementById('sv-compare-table')?.scrollIntoView({block: 'start'}); "
                   "window.scrollBy(0, -16); }")  # -16: the table's label above its frame stays in view
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
""" % json.dumps(ct.app_formulas(), ensure_ascii=False)

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
                with gr.Row():  # under the presets: a preset and Run without scrolling, in the presentation layout too
                    run_btn = gr.Button("Run comparison", variant="primary", elem_id="sv-compare-run")
                    stop_btn = gr.Button("Stop", variant="stop", elem_id="sv-compare-stop")
                u["methods"] = gr.CheckboxGroup(methods(), value=methods(), label="methods (method none is always run)")
                with gr.Row():
                    u["ks"] = gr.Textbox("5", label="k (comma-separated)")
                    u["temperatures"] = gr.Textbox("0", label="temperatures")
                    u["seeds"] = gr.Textbox("0", label="seeds (e.g. 0,1,2 or 0-4)")
                u["verify"] = gr.CheckboxGroup(list(VERIFY_CHOICES), value=["auto"],
                                               label="verification (auto = greedy at T = 0, else standard)")
                u["trees"] = gr.Textbox("", label="draft trees beside the chains (';'-separated, optional)",
                                        # a grey example in the box read like a value: the box says it is empty
                                        placeholder="empty: chains only", elem_id="sv-compare-trees",
                                        info=f"e.g. 4,5,24; 4,6,32 · "
                                             f"EAGLE-2 top_k,depth,total_tokens ({', '.join(registry.taking('dynamic'))}) "
                                             f"· a static tree [(0,), (1,), (0, 0)] ({', '.join(registry.taking('static'))}) "
                                             f"· branches per node, e.g. 2 ({', '.join(registry.taking('branches'))}); "
                                             "each runs for the chosen methods that take it, at k = its depth")
                choices = prompt_choices()
                first = [k for k in ("set:0", "set:3", "set:6") if k in dict((k, n) for n, k in choices)]
                u["prompts"] = gr.Dropdown(choices, value=first, multiselect=True,
                                           label="prompts (bundled set by category, and the examples)")
                u["own"] = gr.Textbox("", lines=3, label="your own prompt (optional)")
                u["max_new"] = gr.Slider(1, MAX_NEW_TOKENS, value=64, step=1, label="max new tokens")
            with gr.Column(scale=5, min_width=500):
                u["progress"] = gr.Markdown("Pick a preset (or configurations and prompts below it), then press Run "
                                            "comparison.",
                                            elem_id="sv-compare-progress")
                gr.Markdown(vc.TABLE_HELP, elem_classes="sv-explain")
        u["convention"] = gr.Radio(convention_choices(), value="vllm", label="mean acceptance length (AL) convention",
                                   info="vLLM, llama.cpp, AIPerf: only steps with a draft count · per forward: "
                                        "SGLang, EAGLE's τ, Spec-Bench (every step counts) · drafts only: vLLM's "
                                        "AL − 1. Hover the AL header for the full definition.",
                                   elem_id="sv-compare-convention")
        u["table"] = gr.Dataframe(headers=ct.app_columns(), interactive=False, wrap=True, max_height=1000,
                                  datatype=TABLE_DATATYPES,
                                  column_widths=list(ct.APP_COLUMN_WIDTHS), elem_id="sv-compare-table",
                                  label="one row per configuration, pooled over prompts and seeds (hover a header for its formula, "
                                        "click it to sort)")
        u["legend"] = gr.Markdown("", elem_id="sv-compare-legend")
        gr.Markdown("### Token strips: where each method drafted, was rejected, got a bonus")
        with gr.Row():
            u["prompt"] = gr.Dropdown([], label="prompt", elem_id="sv-compare-prompt")
            u["seed"] = gr.Dropdown([], label="seed")
            u["position"] = LenientSlider(1, 2, value=1, step=1, label="output position (shared scrubber)",
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
        gr.Markdown(vc.RULES_VS_TABLE, elem_id="sv-compare-rules-note")
        u["rules"] = gr.Plot(elem_id="sv-compare-rules", show_label=False)
        gr.Markdown("### Tokens per forward and speedup, by configuration (across k when several are run)")
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
    event.then(None, js=SHOW_RESULTS_JS)  # on a projector the controls fill the screen: bring the table up
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
