"""The Gradio Blocks: controls on the left, the views stacked below, every event named.

Built at import of ``app.py`` without loading any model (:class:`DecoderCache` loads lazily).
"""

from __future__ import annotations

from dataclasses import fields
from functools import partial
from pathlib import Path
from typing import Any

import gradio as gr

from specviz import methods
from specviz.config import VERIFY_METHODS
from specviz.trace import MAX_TRACE_BYTES
from specviz.viz import explain
from specviz.viz.residual import message_figure

from . import compare as compare_ui
from . import handlers as h
from . import lesson as lesson_ui
from .widgets import LenientNumber, LenientSlider
from . import tree as tree_ui
from .cache import DecoderCache, StopSignals
from .run import RunRequest, option_controls
from .settings import AUTO_VERIFY, K_RANGE, MAX_UI_NEW_TOKENS, MAX_UI_PAIRS, MAX_UI_SPECULATIVE_TOKENS

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES_PATH = ROOT / "assets" / "examples" / "prompts.json"
CSS_PATH = ROOT / "assets" / "app.css"
LESSON_CSS_PATH = ROOT / "assets" / "css" / "lesson.css"
# clicking a token in the stream or a cell of the step grid sends "step,column,nonce" (column = position - 1)
# through the hidden #sv-pick box, whose change event selects that step and position. Plotly reports clicks through the graph div's own emitter,
# so every newly drawn grid is bound once.
PICK_STEP_JS = """
const svPick = (row, column) => {
  const box = document.querySelector('#sv-pick textarea, #sv-pick input');
  if (!box) return;
  box.value = `${row},${column},${Date.now()}`;
  box.dispatchEvent(new Event('input', {bubbles: true}));
};
element.addEventListener('click', (event) => {
  const token = event.target.closest('[data-step]');
  if (!token) return;
  svPick(token.dataset.step, Number(token.dataset.slot || 1) - 1);  // the token's own step and position
});
const svBindGrid = () => {
  const gd = document.querySelector('#sv-grid .js-plotly-plot');
  if (!gd || gd.svBound || typeof gd.on !== 'function') return;
  gd.svBound = true;
  gd.on('plotly_click', (ev) => {
    const pt = ev && ev.points && ev.points[0];
    if (pt && pt.data.type === 'heatmap') svPick(pt.y, pt.x);
  });
};
new MutationObserver(svBindGrid).observe(document.body, {childList: true, subtree: true});
svBindGrid();
"""

# k's and max new tokens' number boxes: the slider clamps a typed value to its range when the box loses focus,
# before Run sends it; keep the typed text (cleared by a drag of the slider) in the hidden #<slider>-typed box that
# Run also sends
K_TYPED_JS = """
if (!window.svKTyped) {
  window.svKTyped = true;
  document.addEventListener('input', (event) => {
    const t = event.target;
    const slider = t && t.closest && t.closest('#sv-k, #sv-max-new');
    if (!slider) return;
    const box = document.querySelector(`#${slider.id}-typed textarea, #${slider.id}-typed input`);
    if (!box) return;
    box.value = t.type === 'number' ? t.value : '';
    box.dispatchEvent(new Event('input', {bubbles: true}));
  }, true);
}
"""

# what each figure will show, drawn before the first run (instead of an empty box)
PLACEHOLDERS = {
    "grid": "After Run: the step grid, one row per target forward and one column per draft position, "
            "coloured by accepted / rejected / recovered / bonus.",
    "residual": "After Run: the numbers behind one decision: p vs q, the test u ≤ min(1, p/q), and the "
                "residual a recovered token was drawn from.",
    "trie": "After Run: where the draft came from (the n-gram continuation trie or the suffix tree).",
    "stats": "After Run: acceptance per position, tokens per target forward against the theory, and where "
             "the time went.",
}


# body.sv-lesson-away while the Single run tab is hidden (read after Gradio has switched the tab's display)
LESSON_AWAY_JS = """() => setTimeout(() => {
  const single = document.getElementById('sv-run');
  document.body.classList.toggle('sv-lesson-away', !single || single.offsetParent === null);
}, 50)"""


def _method_info() -> str:
    """The method radio's help: every registered method's one line."""
    return "; ".join(f"{m.name} = {m.summary}" for m in methods.all_methods())


def _tree_info(form: str, what: str) -> str:
    return f"{what} ({', '.join(methods.taking(form)) or 'no method'})"


def _option_groups() -> list[tuple[str, list[Any]]]:
    """(accordion title, option fields) per distinct options class of the registered methods (a class shared by
    several methods, e.g. prompt lookup's bounds, gets one group), in registration order."""
    groups: dict[type, list[str]] = {}
    for m in methods.all_methods():
        if m.options is not None:
            groups.setdefault(m.options, []).append(m.name)
    return [(f"{(cls.__doc__ or cls.__name__).split(':')[0].strip()} ({', '.join(names)})", list(fields(cls)))
            for cls, names in groups.items()]


def _controls(examples: list[dict]) -> dict[str, gr.components.Component]:
    VERIFY_LABELS = {"typical": "typical (Medusa; lossy: not distribution-preserving)",
                     "synthetic": "synthetic (fixed acceptance rates, benchmarking; lossy: not distribution-preserving)"}

    c: dict[str, gr.components.Component] = {}
    # the controls start with the first example's prompt and settings, so the dropdown names it
    c["example"] = gr.Dropdown([e["name"] for e in examples], label="Example prompts", elem_id="sv-example",
                               value=examples[0]["name"] if examples else None)
    c["prompt"] = gr.Textbox(label="Prompt", lines=6, max_lines=14, elem_id="sv-prompt",
                             value=examples[0]["prompt"] if examples else "")
    first = (examples[0].get("settings", {}) if examples else {}).get("method", methods.names()[1])
    c["method"] = gr.Radio(list(methods.names()), value=first, label="Method (proposer)", elem_id="sv-method",
                           info=_method_info() + " (head methods need trained weights)")
    # the chosen method's session state (e.g. suffix's tree of earlier outputs) and its reset: only for such methods
    with gr.Row(equal_height=True, visible=h.state_row(first).visible, elem_id="sv-state-row") as c["state_row"]:
        c["state_info"] = gr.Markdown(h.state_status(None, first), elem_id="sv-state-info")
        c["state_reset"] = gr.Button("Reset", size="sm", scale=0, min_width=110, elem_id="sv-state-reset")
    c["k"] = LenientSlider(1, MAX_UI_SPECULATIVE_TOKENS, value=5, step=1, label="num_speculative_tokens (k)",
                           elem_id="sv-k", info=f"draft tokens per step; {K_RANGE}. Typed outside "
                                                 f"1-{MAX_UI_SPECULATIVE_TOKENS}: runs the nearest, with a note. "
                                                 "medusa drafts at most one per head, dflash at most block size − 1")
    # what was last typed into k's box (K_TYPED_JS), before the slider clamps it: the run's note says so
    c["k_typed"] = gr.Textbox("", elem_id="sv-k-typed", elem_classes="sv-hidden", show_label=False, container=False)
    c["max_new_typed"] = gr.Textbox("", elem_id="sv-max-new-typed", elem_classes="sv-hidden", show_label=False,
                                    container=False)
    c["verify"] = gr.Dropdown([AUTO_VERIFY, *[(VERIFY_LABELS.get(v, v), v) for v in VERIFY_METHODS]],
                              value=AUTO_VERIFY, label="Verification",
                              info="auto = greedy at temperature 0, else standard")
    with gr.Row():
        c["temperature"] = LenientNumber(0.0, label="temperature", minimum=0, step=0.1)
        c["top_k"] = LenientNumber(0, label="top-k (0 = off)", minimum=0, precision=0)
        c["top_p"] = LenientNumber(1.0, label="top-p (1 = off)", minimum=0.01, maximum=1.0, step=0.05)
    with gr.Row():
        c["max_new_tokens"] = LenientSlider(1, MAX_UI_NEW_TOKENS, value=96, step=1, label="max new tokens",
                                            elem_id="sv-max-new", info=f"1-{MAX_UI_NEW_TOKENS} in the app; more "
                                            "runs the cap, with a note")
        c["seed"] = LenientNumber(0, label="seed", precision=0, minimum=0)
    for title, group in _option_groups():  # each method's own settings, from its options dataclass
        with gr.Accordion(title, open=False):
            with gr.Row():
                for f in group:
                    c[f.name] = gr.Slider(f.metadata["lo"], f.metadata["hi"], value=f.metadata["ui"], step=1,
                                          label=f.metadata["label"], info=f.metadata["help"], elem_id=f"sv-{f.name}")
    with gr.Accordion("draft tree (instead of a chain)", open=False):
        with gr.Row():
            c["eagle_tree"] = gr.Textbox("", label="EAGLE-2 tree: top_k, depth, total_tokens",
                                         info=_tree_info("dynamic", "e.g. 4, 6, 32; empty = a chain of k"),
                                         elem_id="sv-eagle-tree")
            c["tree_branches"] = gr.Number(0, label="tree branches per node", precision=0, minimum=0,
                                           info=_tree_info("branches", "continuations kept per node; 0 = a chain"),
                                           elem_id="sv-tree-branches")
        c["static_tree"] = gr.Textbox("", label="static tree (speculative_token_tree)", elem_id="sv-static-tree",
                                      placeholder="empty: no static tree",  # an example here read like a value
                                      info=_tree_info("static", "rank paths of the draft's top candidates, e.g. "
                                                                "[(0,), (1,), (0, 0), (0, 1), (0, 0, 0)]; depth <= k; "
                                                                "it replaces the EAGLE-2 tree"))
    with gr.Accordion("advanced", open=False):
        c["synthetic_rates"] = gr.Textbox("0.8, 0.6, 0.4, 0.3, 0.2",
                                          label="synthetic rates a_1, a_2, … (verify = synthetic)")
        c["compare"] = gr.Checkbox(True, label='compare with method "none": measured beside every run '
                                               '(short segments of both methods, interleaved)')
        c["pairs"] = LenientSlider(0, MAX_UI_PAIRS, value=h.DEFAULT_PAIRS, step=1, label="comparison pairs",
                                   info=f"pairs of segments (the run's first {h.DEFAULT_SEGMENT_TOKENS} tokens at "
                                        f"most, this method and method none) timed after the run is drawn: more "
                                        f"pairs = a steadier median, a longer wait (no pair starts after "
                                        f"{h.DEFAULT_BUDGET_S:.0f} s); 0 = no comparison")
    return c


def _stream_views() -> dict[str, gr.components.Component]:
    v: dict[str, gr.components.Component] = {}
    gr.Markdown("## 1 · Token stream")
    v["progress"] = gr.Markdown("Ready: pick an example or type a prompt, then press Run.", elem_id="sv-progress")
    v["stream"] = gr.HTML(elem_id="sv-stream", js_on_load=PICK_STEP_JS + tree_ui.TREE_PICK_JS + K_TYPED_JS)
    v["summary"] = gr.Markdown(elem_id="sv-summary")
    gr.Markdown(explain.STREAM, elem_classes="sv-explain")
    return v


def _detail_views() -> dict[str, gr.components.Component]:
    v: dict[str, gr.components.Component] = {}
    gr.Markdown("## 2 · Steps and the numbers behind each decision")
    with gr.Row():
        gr.Markdown(explain.GRID, elem_classes="sv-explain")
        gr.Markdown(explain.RESIDUAL, elem_classes="sv-explain")
    with gr.Row():
        v["step"] = LenientSlider(0, 1, value=0, step=1, label="step", interactive=False, elem_id="sv-step")
        v["position"] = LenientSlider(1, 2, value=1, step=1, label="position in the step (k'+1 = bonus slot)",
                                  interactive=False, elem_id="sv-position")
    # filled by the grid's click handler (PICK_STEP_JS); hidden by app.css
    v["pick"] = gr.Textbox(elem_id="sv-pick", elem_classes="sv-hidden", show_label=False, container=False)
    with gr.Row(equal_height=False):
        v["grid"] = gr.Plot(message_figure(PLACEHOLDERS["grid"]), label="step grid", elem_id="sv-grid",
                            show_label=False)
        v["residual"] = gr.Plot(message_figure(PLACEHOLDERS["residual"]), label="residual view",
                                elem_id="sv-residual", show_label=False)
    v.update(tree_ui.tree_views())  # the step's draft tree, full width (a chain for chain methods)
    # named for the method that ran (h.source_texts, after run / stop / upload)
    v["source_heading"] = gr.Markdown(explain.source_heading(None), elem_id="sv-source-heading")
    v["source_explain"] = gr.Markdown(explain.source_explain(None), elem_classes="sv-explain", elem_id="sv-source-explain")
    with gr.Row(equal_height=False):
        v["match"] = gr.HTML(elem_id="sv-match")
        v["trie"] = gr.Plot(message_figure(PLACEHOLDERS["trie"], 200), label="continuation trie", elem_id="sv-trie",
                            show_label=False)
    gr.Markdown("## 4 · Run statistics")
    gr.Markdown(explain.STATS, elem_classes="sv-explain")
    v["speedup"] = gr.HTML(elem_id="sv-speedup")
    v["stats"] = gr.Plot(message_figure(PLACEHOLDERS["stats"]), label="run statistics", elem_id="sv-stats",
                         show_label=False)
    return v


def _export_replay() -> dict[str, gr.components.Component]:
    e: dict[str, gr.components.Component] = {}
    gr.Markdown("## 5 · Export and replay")
    gr.Markdown("Download the trace (JSON) and a report with every view (HTML, opens offline), or upload a "
                "trace JSON saved earlier to explore it again without any model. Uploads are read as data "
                "and validated; nothing in them is executed.", elem_classes="sv-explain")
    with gr.Row():
        with gr.Column():
            e["export"] = gr.Button("Export trace + figures", elem_id="sv-export")
            e["files"] = gr.File(label="downloads", file_count="multiple", interactive=False, elem_id="sv-files")
        e["upload"] = gr.File(label=f"upload a trace JSON to replay it (max {MAX_TRACE_BYTES // 2**20} MB)",
                              file_types=[".json"], type="filepath", elem_id="sv-upload")
    return e


def build_app(target: str | None = None, draft: str | None = None, device: str | None = None,
              examples_path: str | Path = EXAMPLES_PATH, cache: DecoderCache | None = None,
              present: bool = False) -> gr.Blocks:
    """The app's Blocks. Loads no model: the first Run loads (target, draft) on ``device``.

    Args:
        target / draft: model directories (or hub ids); None -> the bundled demo models.
        device: "cpu", "cuda", ... or None (CUDA when available).
        examples_path: JSON file of example prompts.
        cache: the decoders to use (default: a new :class:`DecoderCache` of target, draft, device),
            e.g. one already warming up (:meth:`DecoderCache.start_warm_up`).
        present: open in the presentation layout (large type, Run and the lesson chapter above the
            fold); any page also gets it with ``?present=1`` in its URL.
    Returns:
        gr.Blocks; launch it with ``demo.launch(**launch_options())``.
    """
    session = h.SessionHandlers(cache or DecoderCache(target, draft, device), StopSignals())
    examples = h.load_examples(examples_path)
    with gr.Blocks(title="specviz: speculative decoding, visualised", analytics_enabled=False) as demo:
        state = gr.State(h.new_state())
        gr.Markdown("# specviz · speculative decoding, step by step")
        lesson = lesson_ui.lesson_panel(present)
        gr.Markdown(explain.INTRO, elem_classes="sv-explain")
        gr.Markdown(session.cache.describe(), elem_id="sv-models")
        warm = gr.Markdown("", elem_id="sv-warmup")
        warm_timer = gr.Timer(1.0, active=False)
        with gr.Tabs() as tabs:
            with gr.Tab("Single run", id="single"):
                with gr.Row(equal_height=False):
                    with gr.Column(scale=2, min_width=340):
                        c = _controls(examples)
                        with gr.Row(elem_id="sv-run-row"):
                            run_btn = gr.Button("Run", variant="primary", elem_id="sv-run")
                            stop_btn = gr.Button("Stop", variant="stop", elem_id="sv-stop")
                    with gr.Column(scale=3, min_width=400):
                        v = _stream_views()
                v.update(_detail_views())
                e = _export_replay()
                progress = v["progress"]
                views = [v[n] for n in ("stream", "summary", "grid", "residual", "match", "trie", "stats", "speedup")]
                full = [progress, *views, v["step"], v["position"], state]
            compare_ui.compare_tab(session.cache, state, full, tabs)
        # the pinned lesson chapter belongs to the Single run tab: hidden while another tab is shown
        tabs.change(None, None, None, js=LESSON_AWAY_JS)
        controls = {**c, "num_speculative_tokens": c["k"]}  # RunRequest's field names
        inputs = [state, *(controls[name] for name in RunRequest.fields()), *(c[name] for name in option_controls())]
        run_event = run_btn.click(session.run, inputs, full, api_name="run", concurrency_limit=4)
        source = [v["source_heading"], v["source_explain"]]
        # the speedup over method none, measured after the run's views are drawn (they never wait for it); its
        # progress is the progress line's own text, so no loading overlay covers the views meanwhile
        measure_event = run_event.then(session.measure, [state], full, api_name="measure", concurrency_limit=4,
                                       show_progress="hidden")
        run_btn.click(None, None, None, cancels=[measure_event], queue=False)  # a new Run ends the old measurement
        run_event.then(h.state_status, [state, c["method"]], [c["state_info"]], api_name="method_state")
        run_event.then(h.source_texts, [state], source, api_name="source_texts")
        stop_event = stop_btn.click(session.stop, [state], full, cancels=[run_event], api_name="stop")
        stop_event.then(h.state_status, [state, c["method"]], [c["state_info"]])
        stop_event.then(h.source_texts, [state], source)
        c["method"].change(h.state_row, [c["method"]], [c["state_row"]], api_name="method_state_row", queue=False,
                           show_progress="hidden")
        c["method"].change(h.state_status, [state, c["method"]], [c["state_info"]], queue=False, show_progress="hidden")
        c["state_reset"].click(h.reset_state, [state, c["method"]], [c["state_info"], state], api_name="reset_method_state")
        demo.load(session.warm_up_status, None, [warm, warm_timer], api_name="warm_up_status")
        warm_timer.tick(session.warm_up_status, None, [warm, warm_timer])
        sel = [v["stream"], v["grid"], v["residual"], v["match"], v["trie"]]
        # a drag fires many input events: "always_last" runs the latest value after the pending one
        # (the default "once" drops it, leaving the views on an older step); one concurrency group
        # keeps step and position events in order
        v["step"].input(h.select_step, [state, v["step"]], [v["position"], *sel, v["step"]], api_name="select_step",
                        trigger_mode="always_last", concurrency_id="selection")
        v["pick"].change(h.select_cell, [state, v["pick"]], [v["step"], v["position"], *sel], api_name="select_cell",
                        trigger_mode="always_last", concurrency_id="selection")
        v["position"].input(h.select_position, [state, v["step"], v["position"]], sel, api_name="select_position",
                            trigger_mode="always_last", concurrency_id="selection")
        replay_event = e["upload"].upload(h.replay, [state, e["upload"]], full, api_name="replay")
        replay_event.then(h.source_texts, [state], source)
        replay_event.then(h.replay_settings, [state], [controls[name] for name in h.replay_fields()] + [state],
                          api_name="replay_settings")
        lesson_ui.wire_lesson(lesson, state, v, resets=[run_btn.click, e["upload"].upload])
        tree_ui.wire_tree(v, state, [run_event, replay_event])
        e["export"].click(h.export, [state, v["step"], v["position"]], [e["files"]], api_name="export")
        c["example"].input(partial(h.load_example, examples), [c["example"]],
                           [c["prompt"], *(controls[name] for name in h.example_fields()), v["progress"]],
                           api_name="load_example")
    return demo


def launch_options() -> dict:
    """Keyword arguments every launch should pass: the stylesheet and the upload size cap."""
    css = [str(p) for p in (CSS_PATH, LESSON_CSS_PATH) if p.exists()]
    return {"css_paths": css or None, "max_file_size": MAX_TRACE_BYTES}
