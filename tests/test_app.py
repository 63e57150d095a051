"""The web app, launched for real on tiny models and driven through gradio_client: every event
(by api_name), bad inputs, export + replay of a trace, Stop, and two sessions at once."""

from __future__ import annotations

import html
import json
import re
import socket
import threading
import time
from pathlib import Path

import pytest

from specviz.trace.validate import check_consistency

gradio_client = pytest.importorskip("gradio_client")
from gradio_client import Client, handle_file  # noqa: E402

from specviz.trace import Trace  # noqa: E402
from specviz.ui import build_app, launch_options  # noqa: E402

PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n\ndef add(a, b):\n"
API = ("run", "measure", "stop", "select_step", "select_position", "select_cell", "replay", "replay_settings", "export",
       "load_example")
# outputs of run / stop / replay: progress, stream, summary, grid, residual, match, trie, stats, speedup,
# step slider, position slider (the session state is not part of the API)
PROGRESS, STREAM, SUMMARY, GRID, RESIDUAL, MATCH, TRIE, STATS, SPEEDUP, STEP, POSITION = range(11)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(demo):
    port = _free_port()
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, quiet=True, **launch_options())
    return f"http://127.0.0.1:{port}/"


def save_endless_models(root) -> tuple[str, str]:
    """A target and draft (Llama, hidden 512, 6 layers, context 1024) whose EOS id lies outside the
    vocabulary, so a run always lasts until max_new_tokens: 400 tokens with k = 12 take tens of
    seconds on a CPU, long enough to be stopped however busy the machine is."""
    import torch
    from tiny_models import VOCAB, build_tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM

    paths = []
    for name, seed in (("endless-target", 0), ("endless-draft", 1)):
        torch.manual_seed(seed)
        cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=512, intermediate_size=1024, num_hidden_layers=6,
                          num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=1024,
                          initializer_range=0.3, bos_token_id=0, eos_token_id=VOCAB + 100, pad_token_id=1)
        LlamaForCausalLM(cfg).eval().save_pretrained(root / name)
        build_tokenizer().save_pretrained(root / name)
        paths.append(str(root / name))
    return paths[0], paths[1]


@pytest.fixture(scope="module")
def endless_app_url(tmp_path_factory):
    demo = build_app(*save_endless_models(tmp_path_factory.mktemp("endless")), "cpu")
    url = _launch(demo)
    yield url
    demo.close()


@pytest.fixture(scope="module")
def app_url(tiny_dirs):
    target, draft = tiny_dirs["llama"]
    demo = build_app(str(target), str(draft), "cpu")
    url = _launch(demo)
    yield url
    demo.close()


def run_args(prompt=PROMPT, method="ngram", k=4, verify="auto", temperature=0.0, max_new=16, compare=True,
             top_k=0, top_p=1.0, seed=0, lookup=(1, 3), rates="", pairs=2, eagle_tree="", tree_branches=0, static_tree="",
             k_typed="", max_new_typed=""):
    """The Run event's inputs in RunRequest's order (specviz/ui/run.py), then the methods' own controls (prompt lookup's
    bounds)."""
    return (prompt, method, k, verify, temperature, top_k, top_p, max_new, seed, rates, compare, pairs, eagle_tree,
            tree_branches, static_tree, k_typed, max_new_typed, lookup[0], lookup[1])


def plot(out) -> dict:
    """A gr.Plot output as the figure dict."""
    assert out["type"] == "plotly"
    return json.loads(out["plot"])


def caption(fig: dict) -> str:
    """The residual figure's caption annotation as plain text, without its heading (the bold question asked
    about the decision, "Why was 'x' rejected ...?"): it starts with "step N, position i"."""
    text = next(a["text"] for a in fig["layout"]["annotations"] if a.get("name") == "caption")
    text = re.sub(r"<b>.*?</b>", " ", text)
    return " ".join(re.sub(r"<[^>]+>", " ", text).split())


def stream_tokens(page: str) -> list[tuple[str, int]]:
    return [(f, int(t)) for f, t in re.findall(r'data-fate="(\w+)" data-token="(\d+)"', page)]


def test_every_event_has_an_api_name(app_url):
    names = Client(app_url, verbose=False).view_api(print_info=False, return_format="dict")["named_endpoints"]
    assert {f"/{n}" for n in API} <= set(names)


@pytest.mark.parametrize("method", ["ngram", "draft_model", "none"])
def test_run_draws_every_view(app_url, method):
    client = Client(app_url, verbose=False)
    out = client.predict(*run_args(method=method), api_name="/run")
    assert out[PROGRESS].startswith("**done** · 16 tokens")
    tokens = stream_tokens(out[STREAM])
    assert len([t for f, t in tokens if f != "rejected"]) == 16
    grid = plot(out[GRID])
    steps = len(grid["data"][0]["z"])
    assert out[STEP]["maximum"] == max(steps - 1, 1)
    assert "mean acceptance length" in out[SUMMARY]
    assert caption(plot(out[RESIDUAL])).startswith("step ")
    stats = plot(out[STATS])
    drafting_rows = sum(1 for row in grid["data"][0]["z"] if any(v is not None for v in row[:-1]))
    assert sum(stats["data"][0]["y"]) == drafting_rows  # histogram over drafting steps
    assert (drafting_rows == 0) == (method == "none")
    assert "method none" in out[SPEEDUP] and "tokens per target forward" in out[SPEEDUP]
    measured = client.predict(api_name="/measure")  # the event after Run: the run's views did not wait for it
    if method == "none":
        assert "This run is method none itself" in out[SPEEDUP]
        assert measured[SPEEDUP].get("__type__") == "update" and "value" not in measured[SPEEDUP]  # unchanged
    else:  # measured after the run was drawn: 2 interleaved pairs of 16-token segments, with their range
        assert "Measuring the speedup over method none" in out[SPEEDUP] and "Measured beside" not in out[SPEEDUP]
        assert out[PROGRESS].endswith("measuring the speedup over method none…")
        assert measured[PROGRESS].startswith("**done** · 16 tokens") and "speedup measured" in measured[PROGRESS]
        assert "Measured beside this run" in measured[SPEEDUP]
        assert "median of 2 interleaved pairs of 16-token" in measured[SPEEDUP]
        assert re.search(r"range \d+\.\d\d–\d+\.\d\d× over the 2 pairs", measured[SPEEDUP])
        assert "What the segments time: the request's first 16 tokens (of the 16 this run generated)" in \
            re.sub(r"<[^>]+>", "", measured[SPEEDUP])
    if method == "ngram":
        assert 'data-role="suffix"' in out[MATCH]
        assert plot(out[TRIE])["data"], "the trie figure has traces"


def test_zero_comparison_pairs_is_no_comparison(app_url):
    from specviz.ui.outputs import NO_PAIRS

    client = Client(app_url, verbose=False)
    out = client.predict(*run_args(method="draft_model", max_new=8, pairs=0), api_name="/run")
    assert out[PROGRESS].startswith("**done**") and "measuring" not in out[PROGRESS]
    assert NO_PAIRS in html.unescape(out[SPEEDUP])
    assert client.predict(api_name="/measure")[SPEEDUP].get("__type__") == "update"  # nothing to measure


def test_select_step_and_position_follow_the_session(app_url):
    client = Client(app_url, verbose=False)
    out = client.predict(*run_args(method="draft_model", verify="standard", temperature=1.0), api_name="/run")
    steps = len(plot(out[GRID])["data"][0]["z"])
    assert steps >= 2
    pos, stream, grid, residual, match, trie, step = client.predict(1, api_name="/select_step")
    assert caption(plot(residual)).startswith("step 1")
    assert pos["value"] >= 1 and pos["maximum"] >= 2
    assert 'outline:2px solid #111827' in stream  # the selected step's tokens are outlined
    stream2, grid2, residual2, match2, trie2 = client.predict(1, 1, api_name="/select_position")
    assert caption(plot(residual2)).startswith("step 1, position 1")
    # a click on grid cell (row 1, column 0), as the page's script sends it
    step_sl, pos_sl, stream3, grid3, residual3, match3, trie3 = client.predict("1,0,123", api_name="/select_cell")
    assert (step_sl["value"], pos_sl["value"]) == (1, 1)
    assert caption(plot(residual3)).startswith("step 1, position 1")
    unreadable = client.predict("nonsense", api_name="/select_cell")  # changes nothing, raises nothing
    assert len(unreadable) == 7


@pytest.mark.parametrize("args, message", [
    (run_args(prompt="   "), "prompt is empty"),
    # k outside the app's range (the browser clamps a typed one first; a script's reaches the handler)
    (run_args(k=0), "num_speculative_tokens (k) = 0 is outside this app: 1-12; the engine itself (Python API, CLI) "
                    "takes 1-32"),
    (run_args(k=40), "num_speculative_tokens (k) = 40 is outside this app: 1-12; the engine itself"),
    (run_args(prompt="def f(x):\n    return x\n" * 60, max_new=64), "exceeds the model's context"),
    (run_args(verify="greedy", temperature=1.0), "verify='greedy' needs temperature 0"),
    (run_args(lookup=(4, 2)), "prompt_lookup_min (4) must be <= prompt_lookup_max (2)"),
    (run_args(max_new=0), "Value 0 is less than minimum value 1"),
    (run_args(verify="synthetic", rates="0.8, x"), "synthetic rates must be comma-separated numbers"),
    (run_args(verify="synthetic", rates="0.5, 0.9, 0.1, 0.1"), "non-increasing"),
])
def test_bad_input_gives_a_message_and_the_app_stays_up(app_url, args, message):
    client = Client(app_url, verbose=False)
    first = client.predict(*run_args(max_new=8, compare=False), api_name="/run")
    out = client.predict(*args, api_name="/run")  # no exception: the message is in the progress line
    # the line is Markdown with the message HTML-escaped (so "<" and ">" show): compare what the page shows
    assert out[PROGRESS].startswith("**error** · ") and message in html.unescape(out[PROGRESS])
    # the session keeps the trace drawn before: the selection views still draw it
    stream = client.predict(0, api_name="/select_step")[1]
    assert stream_tokens(stream) == stream_tokens(first[STREAM])
    assert client.predict(*run_args(max_new=4, compare=False), api_name="/run")[PROGRESS].startswith("**done**")



def test_unknown_model_gives_a_message(tmp_path):
    demo = build_app(str(tmp_path / "no-such-model"), None, "cpu")
    url = _launch(demo)
    try:
        out = Client(url, verbose=False).predict(*run_args(), api_name="/run")
        assert "could not load model" in out[PROGRESS] and "no such directory" in out[PROGRESS]
    finally:
        demo.close()


def test_export_then_replay_without_a_model(app_url, tmp_path):
    client = Client(app_url, verbose=False)
    with pytest.raises(Exception, match="nothing to export yet"):
        client.predict(0, 1, api_name="/export")
    out = client.predict(*run_args(method="ngram"), api_name="/run")
    client.predict(api_name="/measure")
    files = client.predict(0, 1, api_name="/export")
    by_name = {p.replace("\\", "/").rsplit("/", 1)[-1]: p for p in files}
    # named after the run, a short hash of its prompt and the time, so compared runs do not collide
    stem = next(n for n in by_name if n.endswith(".trace.json"))[: -len(".trace.json")]
    assert re.fullmatch(r"specviz-ngram-k4-greedy-T0\.0-seed0-p[0-9a-f]{6}-\d{8}T\d{6}Z", stem), stem
    assert {f"{stem}.trace.json", f"{stem}.report.html"} <= set(by_name)
    by_name["trace.json"], by_name["report.html"] = by_name[f"{stem}.trace.json"], by_name[f"{stem}.report.html"]
    text = open(by_name["trace.json"], encoding="utf-8").read()
    trace = Trace.from_json(text)
    assert len(trace.output_token_ids) == 16
    assert "<h2>Token stream</h2>" in open(by_name["report.html"], encoding="utf-8").read()
    # a fresh session replays the uploaded trace and sees the same token stream
    other = Client(app_url, verbose=False)
    replayed = other.predict(handle_file(by_name["trace.json"]), api_name="/replay")
    assert replayed[PROGRESS].startswith("**replay**")
    assert stream_tokens(replayed[STREAM]) == stream_tokens(out[STREAM])
    assert plot(replayed[GRID])["data"][0]["z"] == plot(out[GRID])["data"][0]["z"]
    # the method-none comparison travels in the file, so the replay shows the speedup too
    assert "baseline_none" in json.loads(text)["metrics"]
    assert "Measured beside this run" in replayed[SPEEDUP] and "method none" in replayed[SPEEDUP]
    assert "median of 2 interleaved pairs" in replayed[SPEEDUP]  # with its spread
    saved = json.loads(text)["metrics"]["baseline_none"]["measurement"]
    assert saved["n"] == 2 and len(saved["ratios"]) == 2 and saved["low"] <= saved["median"] <= saved["high"]
    # a malformed comparison is refused like any malformed trace
    data = json.loads(text)
    data["metrics"]["baseline_none"]["decode_s"] = "fast"
    bad = tmp_path / "bad-baseline.json"
    bad.write_text(json.dumps(data))
    refused = other.predict(handle_file(str(bad)), api_name="/replay")
    assert refused[PROGRESS].startswith("**error** · this specviz trace was edited or damaged")  # a trace, not other
    assert "decode_s" in refused[PROGRESS]
    # ... and its controls are refilled from the trace, so Run repeats the request live
    settings = other.predict(api_name="/replay_settings")
    want = trace.config
    assert settings[0] == trace.prompt_text and settings[1] == "ngram"
    assert settings[2:5] == (want["num_speculative_tokens"], want["verify"], want["temperature"])
    assert settings[7] == want["max_new_tokens"] and settings[9:11] == (want["prompt_lookup_min"], want["prompt_lookup_max"])
    assert __import__("specviz.ui.handlers", fromlist=["x"]).replay_fields()[9:11] == ("prompt_lookup_min", "prompt_lookup_max")
    assert settings[11] is None  # the example dropdown no longer names an example
    again = other.predict(*run_args(method="ngram"), api_name="/run")
    assert stream_tokens(again[STREAM]) == stream_tokens(out[STREAM])


def test_replay_settings_change_nothing_without_a_successful_replay():
    from specviz.ui import handlers as h

    import gradio as gr

    for state in (None, h.new_state(), {**h.new_state(), "replayed": False}):  # e.g. after a refused upload
        out = h.replay_settings(state)
        assert len(out) == len(h.replay_fields()) + 1 and all(v == gr.skip() for v in out)


def test_replay_refuses_what_is_not_a_trace(app_url, tmp_path):
    client = Client(app_url, verbose=False)
    bad = tmp_path / "bad.json"
    for content in ("not json at all", json.dumps({"version": 1, "config": {}}), json.dumps([1, 2, 3])):
        bad.write_text(content)
        out = client.predict(handle_file(str(bad)), api_name="/replay")
        assert out[PROGRESS].startswith("**error** · this is not a specviz trace")


def test_load_example_fills_the_controls(app_url):
    client = Client(app_url, verbose=False)
    first = json.loads((Path(__file__).resolve().parent.parent / "assets/examples/prompts.json").read_text())["examples"][0]
    prompt, method, *_ = client.predict(first["name"], api_name="/load_example")
    assert prompt == first["prompt"] and method == first["settings"]["method"]


def test_closing_the_example_dropdown_without_a_pick_changes_nothing(app_url):
    client = Client(app_url, verbose=False)
    out = client.predict(None, api_name="/load_example")  # used to raise "unknown example None"
    from specviz.ui.handlers import example_fields
    assert len(out) == 2 + len(example_fields())  # the prompt, the settings, the progress line
    # an update that changes nothing: the prompt box keeps its text (the client reads the default)
    assert out[0] != "" and "unknown example" not in str(out)


def test_an_out_of_range_step_is_clamped_not_an_error(app_url):
    client = Client(app_url, verbose=False)
    out = client.predict(*run_args(method="draft_model", verify="standard", temperature=1.0), api_name="/run")
    last = len(plot(out[GRID])["data"][0]["z"]) - 1
    pos, stream, grid, residual, match, trie, step = client.predict(999, api_name="/select_step")
    assert caption(plot(residual)).startswith(f"step {last}")
    assert step["value"] == last and step["maximum"] == max(last, 1)  # the slider shows the clamped step
    *_, residual_neg, _, _, step_neg = client.predict(-5, api_name="/select_step")
    assert caption(plot(residual_neg)).startswith("step 0") and step_neg["value"] == 0
    residual_pos = client.predict(last, 999, api_name="/select_position")[2]
    assert caption(plot(residual_pos)).startswith(f"step {last}")


def test_an_in_range_step_leaves_the_step_slider_alone(app_url):
    from specviz.ui import handlers

    client = Client(app_url, verbose=False)
    client.predict(*run_args(method="draft_model", verify="standard", temperature=1.0), api_name="/run")
    state = {"trace": Trace.from_json(open(client.predict(0, 1, api_name="/export")[0], encoding="utf-8").read())
             .to_dict()}
    assert isinstance(handlers.select_step(state, 1)[-1], type(handlers.gr.skip()))
    assert not isinstance(handlers.select_step(state, 999)[-1], type(handlers.gr.skip()))


def _tampered(trace: Trace, how: str) -> dict:
    data = trace.to_dict()
    if how == "output":
        data["output_token_ids"] = data["output_token_ids"][:3]
    elif how == "positions":
        step = next(s for s in data["steps"] if s["positions"])
        step["positions"] = step["positions"][:-1]
    elif how == "accepted":
        step = next(s for s in data["steps"] if s["draft_token_ids"])
        step["num_accepted"] = len(step["draft_token_ids"]) + 1
    elif how == "index":
        data["steps"][-1]["index"] = 0
    return data


@pytest.mark.parametrize("how, message", [
    ("output", "output_token_ids has 3 tokens but the steps commit"),
    ("positions", "positions for"),
    ("accepted", "num_accepted is"),
    ("index", "steps must be numbered 0, 1, 2"),
])
def test_replay_refuses_an_inconsistent_trace(app_url, tmp_path, how, message):
    client = Client(app_url, verbose=False)
    client.predict(*run_args(method="draft_model", verify="standard", temperature=1.0, compare=False),
                   api_name="/run")
    path = [p for p in client.predict(0, 1, api_name="/export") if p.endswith("trace.json")][0]
    trace = Trace.from_json(open(path, encoding="utf-8").read())
    assert len(trace.steps) >= 2
    bad = tmp_path / f"{how}.json"
    bad.write_text(json.dumps(_tampered(trace, how)))
    out = client.predict(handle_file(str(bad)), api_name="/replay")
    assert out[PROGRESS].startswith("**error** · this specviz trace was edited or damaged, so it is not drawn")
    assert message in html.unescape(out[PROGRESS])
    # the session still holds its own run: the selection views draw it
    assert client.predict(0, api_name="/select_step")[1] != ""


def _wait_for_update(job, seconds=60):
    """Wait for the run's first streamed step (the progress line says "running")."""
    deadline = time.time() + seconds
    while not (job.outputs() and job.outputs()[-1][PROGRESS].startswith("**running**")) and time.time() < deadline:
        time.sleep(0.05)
    assert job.outputs() and job.outputs()[-1][PROGRESS].startswith("**running**"), \
        f"the run streamed no step within {seconds} s"


def test_stop_ends_the_run_cleanly(endless_app_url):
    client = Client(endless_app_url, verbose=False)
    job = client.submit(*run_args(method="draft_model", k=12, max_new=400, compare=False,
                                  prompt="for i in range(10):\n"), api_name="/run")
    _wait_for_update(job)
    out = client.predict(api_name="/stop")
    assert out[PROGRESS].startswith("**stopped** · after")
    assert 0 < len([t for f, t in stream_tokens(out[STREAM]) if f != "rejected"]) < 400
    final = job.result(timeout=60)  # the run ends after its current step, with the stopped trace drawn
    assert final[PROGRESS].startswith("**stopped** · after")
    shown = [t for f, t in stream_tokens(final[STREAM]) if f != "rejected"]
    assert 0 < len(shown) < 400
    assert client.predict(api_name="/stop")[PROGRESS] == "Nothing is running."
    # the stopped trace is consistent: its export replays (output_token_ids = the committed tokens)
    path = [p for p in client.predict(0, 1, api_name="/export") if p.endswith("trace.json")][0]
    replayed = Client(endless_app_url, verbose=False).predict(handle_file(path), api_name="/replay")
    assert replayed[PROGRESS].startswith("**replay**")


def test_stop_in_one_session_does_not_stop_another(endless_app_url):
    a, b = Client(endless_app_url, verbose=False), Client(endless_app_url, verbose=False)
    job_a = a.submit(*run_args(method="draft_model", k=4, max_new=120, compare=False), api_name="/run")
    job_b = b.submit(*run_args(method="ngram", k=12, max_new=400, compare=False, prompt="while True:\n"),
                     api_name="/run")
    _wait_for_update(job_a)
    _wait_for_update(job_b)  # both sessions are running now
    assert not job_a.done() and not job_b.done()
    stopped = b.predict(api_name="/stop")  # b stops its own run ...
    assert stopped[PROGRESS].startswith("**stopped** · after")
    final_b = job_b.result(timeout=120)
    assert final_b[PROGRESS].startswith("**stopped** · after")
    assert 0 < len([t for f, t in stream_tokens(final_b[STREAM]) if f != "rejected"]) < 400
    # ... and a's run, which was streaming when b pressed Stop, goes on to its end
    final_a = job_a.result(timeout=180)
    assert final_a[PROGRESS].startswith("**done** · 120 tokens")
    assert len([t for f, t in stream_tokens(final_a[STREAM]) if f != "rejected"]) == 120


def test_two_sessions_run_at_once_and_keep_their_own_traces(app_url):
    a, b = Client(app_url, verbose=False), Client(app_url, verbose=False)
    results = {}

    def go(name, client, prompt, method):
        results[name] = client.predict(*run_args(prompt=prompt, method=method, compare=False), api_name="/run")

    threads = [threading.Thread(target=go, args=("a", a, PROMPT, "ngram")),
               threading.Thread(target=go, args=("b", b, "class Point:\n    def __init__(self, x, y):\n",
                                                 "draft_model"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert results["a"][PROGRESS].startswith("**done**") and results["b"][PROGRESS].startswith("**done**")
    assert "def add" in results["a"][STREAM] and "class Point" in results["b"][STREAM]
    # each session's selection views are drawn from its own trace
    stream_a = a.predict(0, api_name="/select_step")[1]
    stream_b = b.predict(0, api_name="/select_step")[1]
    assert "def add" in stream_a and "class Point" not in stream_a
    assert "class Point" in stream_b and "def add" not in stream_b


def test_importing_app_builds_the_ui_without_loading_a_model(monkeypatch):
    import importlib

    import gradio as gr

    from specviz.engine import SpecDecoder

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded at import")

    monkeypatch.setattr(SpecDecoder, "from_pretrained", refuse)
    app = importlib.import_module("app")
    app = importlib.reload(app)
    assert isinstance(app.demo, gr.Blocks)
    args = app.parse_args([])
    assert (args.host, args.port, args.share, args.target, args.draft, args.device) == (
        "127.0.0.1", 7860, False, None, None, None)
    with pytest.raises(SystemExit) as exc:  # a model directory that does not exist fails at startup
        app.parse_args(["--target", "/nonexistent/model"])
    assert exc.value.code == 2
    assert app.parse_args(["--draft", "org/model-name"]).draft == "org/model-name"  # a hub id passes through


class _OOMDecoder:
    """Stands in for a decoder whose first step runs out of GPU memory."""

    tokenizer = None

    def iter_generate(self, prompt, **settings):
        import torch

        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        yield  # pragma: no cover  (makes this a generator like the real one)


class _FakeCache:
    def get(self):
        return _OOMDecoder()

    def loaded(self):
        return True


def test_gpu_out_of_memory_becomes_a_message():
    import gradio as gr

    from specviz.ui import handlers
    from specviz.ui.cache import StopSignals
    from specviz.ui.run import STARTING

    gen = handlers.run(_FakeCache(), StopSignals(), None, *run_args())
    assert next(gen)[PROGRESS] == STARTING
    out = next(gen)  # the message in the progress line, every other output skipped
    assert out[PROGRESS].startswith("**error** · ") and "ran out of memory" in out[PROGRESS]
    assert all(isinstance(o, type(gr.skip())) for o in out[1:])


class _CountingCache(_FakeCache):
    """A loaded cache that counts the decoders asked for."""

    def __init__(self):
        self.gets = 0

    def get(self):
        self.gets += 1
        return _OOMDecoder()


def test_run_says_starting_at_once():
    """The run's first update, before any model work, replaces the previous run's "done · …" line
    with "starting · …" (every other output, the state included, left as it is)."""
    import gradio as gr

    from specviz.ui import handlers
    from specviz.ui.cache import StopSignals

    cache = _CountingCache()
    gen = handlers.run(cache, StopSignals(), handlers.new_state(), *run_args())
    out = next(gen)
    assert cache.gets == 0 and out[PROGRESS].startswith("**starting** · ") and "done" not in out[PROGRESS]
    assert len(out) == 12 and all(isinstance(o, type(gr.skip())) for o in out[1:])


def test_suffix_cache_line_shows_only_for_method_suffix(tmp_path):
    """The line "Method suffix drafts from this request …" and its reset button sat under the method list
    whatever the method; their row is now hidden unless a method that keeps state across requests (suffix) is chosen
    (the method's change event)."""
    from specviz.ui import handlers

    assert handlers.state_row("suffix").visible is True
    assert all(handlers.state_row(m).visible is False for m in ("ngram", "draft_model", "none"))
    assert "Method suffix drafts from this request" in handlers.state_status(None, "suffix")
    assert handlers.state_status(None, "ngram") == ""
    demo = build_app(str(tmp_path / "no-such-model"), None, "cpu")
    by_id = {getattr(b, "elem_id", None): b for b in demo.blocks.values()}
    row, method = by_id["sv-state-row"], next(b for b in demo.blocks.values() if getattr(b, "label", "") ==
                                                "Method (proposer)")
    assert row.visible is False and method.value != "suffix"
    assert {by_id["sv-state-info"]._id, by_id["sv-state-reset"]._id} <= {b._id for b in row.children}
    dep = [d for d in demo.config["dependencies"] if d["outputs"] == [row._id]]
    assert len(dep) == 1 and dep[0]["targets"] == [(method._id, "change")] and dep[0]["inputs"] == [method._id]


LOOKUP_2_4 = {"prompt_lookup_min": 2, "prompt_lookup_max": 4}  # prompt lookup's own controls


def test_engine_settings_conversion():
    from specviz.ui.settings import engine_settings

    s = engine_settings("ngram", 5.0, "auto", "0.7", 0, 1.0, 64.0, 3, LOOKUP_2_4, "")
    assert s == {"method": "ngram", "num_speculative_tokens": 5, "verify": None, "temperature": 0.7, "top_k": None,
                 "top_p": None, "max_new_tokens": 64, "seed": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    s2 = engine_settings("draft_model", 4, "synthetic", 1.0, 40, 0.9, 32, 0, LOOKUP_2_4, "0.8, 0.5, 0.5, 0.1")
    assert s2["synthetic_rates"] == (0.8, 0.5, 0.5, 0.1) and s2["top_k"] == 40 and s2["top_p"] == 0.9
    assert "prompt_lookup_min" not in s2
    with pytest.raises(ValueError, match="num_speculative_tokens must be a whole number between 1 and 12"):
        engine_settings("ngram", 2.5, "auto", 0, 0, 1, 8, 0, {"prompt_lookup_min": 1, "prompt_lookup_max": 1})


@pytest.mark.parametrize("rates, problem", [
    ("1.5, 0.5", "must lie in [0, 1]"),
    ("0.5, 0.9, 0.1", "must be non-increasing"),
    ("0.8, 0.5", "2 given for k = 5 draft positions"),
    ("0.8, fast", "must be comma-separated numbers"),
])
def test_the_ui_says_what_a_synthetic_rate_is(rates, problem):
    from specviz.ui.settings import engine_settings

    with pytest.raises(ValueError) as exc:
        engine_settings("ngram", 5, "synthetic", 0.0, 0, 1.0, 16, 0, LOOKUP_2_4, rates)
    message = str(exc.value)
    assert problem in message
    # every message says what a rate is, its range, the order and how many are needed
    for part in ("the chance that a step accepts at least i draft tokens", "[0, 1]", "non-increasing",
                 "k = 5: at least 5"):
        assert part in message, (part, message)


def test_missing_bundled_models_are_explained(monkeypatch, tmp_path):
    from specviz.models import ModelLoadError
    from specviz.ui import cache as cache_module

    monkeypatch.setattr(cache_module, "DEFAULT_TARGET", tmp_path / "specviz-target")
    monkeypatch.setattr(cache_module, "DEFAULT_DRAFT", tmp_path / "specviz-draft")
    cache = cache_module.DecoderCache()
    assert "bundled demo models are not in `assets/models/` yet" in cache.describe()
    assert "upload a trace JSON" in cache.describe()
    with pytest.raises(ModelLoadError, match="bundled demo model is missing"):
        cache.get()
    assert not cache.loaded()


def test_load_example_without_a_choice_is_a_no_op():
    import gradio as gr

    from specviz.ui import handlers

    examples = [{"name": "a", "prompt": "x = 1\n", "settings": {"method": "none"}}]
    for choice in (None, "", "no such example"):
        out = handlers.load_example(examples, choice)
        assert len(out) == 2 + len(handlers.example_fields())
        assert all(isinstance(o, type(gr.skip())) for o in out)
    assert handlers.load_example(examples, "a")[:2] == ("x = 1\n", "none")


def test_an_example_clears_the_draft_tree_fields_and_shows_its_note():
    from specviz.ui import handlers

    examples = [{"name": "tree", "prompt": "x", "settings": {"method": "eagle3", "eagle_tree": "4, 6, 32"}},
                {"name": "chain", "prompt": "y", "settings": {"method": "ngram"}, "note": "One draw."}]
    fields = handlers.example_fields()
    tree = dict(zip(fields, handlers.load_example(examples, "tree")[1:]))
    assert tree["eagle_tree"] == "4, 6, 32" and tree["static_tree"] == "" and tree["tree_branches"] == 0
    out = handlers.load_example(examples, "chain")
    chain = dict(zip(fields, out[1:]))
    assert (chain["method"], chain["eagle_tree"], chain["tree_branches"], chain["static_tree"]) == ("ngram", "", 0, "")
    assert out[-1].endswith("One draw.")
    # trial 8: a greedy example at T = 0 shows verification "auto", so raising T samples instead of failing with
    # "verify='greedy' needs temperature 0"; an explicit rule at T > 0 stays as it is
    greedy = [{"name": "g", "prompt": "z", "settings": {"method": "eagle3", "verify": "greedy", "temperature": 0.0}},
              {"name": "s", "prompt": "z", "settings": {"method": "ngram", "verify": "block", "temperature": 0.8}}]
    assert dict(zip(fields, handlers.load_example(greedy, "g")[1:]))["verify"] == "auto"
    assert dict(zip(fields, handlers.load_example(greedy, "s")[1:]))["verify"] == "block"
    bundled = handlers.load_examples(Path(__file__).resolve().parent.parent / "assets/examples/prompts.json")
    for ex in bundled:  # every bundled example names only settings the controls have
        assert set(ex["settings"]) <= set(fields), ex["name"]


def test_stop_on_a_partial_snapshot_keeps_the_trace_consistent(app_url):
    from specviz.ui import handlers
    from specviz.ui.cache import StopSignals

    client = Client(app_url, verbose=False)
    client.predict(*run_args(method="draft_model", compare=False), api_name="/run")
    path = [p for p in client.predict(0, 1, api_name="/export") if p.endswith("trace.json")][0]
    snapshot = json.loads(open(path, encoding="utf-8").read())
    snapshot.update(output_token_ids=[], stop_reason="")  # what a streamed snapshot holds mid-run
    out = handlers.stop(StopSignals(), {"trace": snapshot, "baselines": {}, "baseline": None})
    assert out[PROGRESS].startswith("**stopped**")
    stopped = Trace.from_dict(out[-1]["trace"])
    check_consistency(stopped)  # raises if output_token_ids disagrees with the steps
    assert stopped.output_token_ids == [t for s in stopped.steps for t in s.committed_token_ids]


def test_wall_time_row_says_where_the_trace_came_from(decoders, tmp_path):
    """A CLI trace uploaded into the app had its wall time labelled "incl. … the app's redraws",
    though nothing redrew during it. The redraws are named only for a run just streamed into the app; an upload (the
    CLI's or an export), a comparison's run and the HTML report say "as recorded"."""
    from specviz.ui import handlers as h
    from specviz.ui.outputs import full_outputs
    from specviz.viz.speed import WALL_TIME_RECORDED, WALL_TIME_STREAMED, speedup_html
    from specviz.viz.stats import run_summary

    trace = decoders["llama"].generate(PROMPT, method="ngram", num_speculative_tokens=3, max_new_tokens=4,
                                       prompt_lookup_min=1)
    assert "redraws" in WALL_TIME_STREAMED and "redraws" not in WALL_TIME_RECORDED
    assert WALL_TIME_RECORDED in speedup_html(run_summary(trace), None) and "redraws" not in speedup_html(
        run_summary(trace), None)
    assert WALL_TIME_STREAMED in speedup_html(run_summary(trace), None, streamed=True)
    path = tmp_path / "cli.trace.json"
    path.write_text(trace.to_json())
    out = h.replay(h.new_state(), str(path))
    assert out[PROGRESS].startswith("**replay**") and WALL_TIME_RECORDED in out[SPEEDUP] and "redraws" not in out[SPEEDUP]
    live = full_outputs("**done**", trace, {**h.new_state(), "trace": trace.to_dict(), "streamed": True})
    assert WALL_TIME_STREAMED in live[SPEEDUP]
    from specviz.ui.cache import StopSignals

    class Cache(_FakeCache):
        def get(self):
            return decoders["llama"]

    final = list(h.run(Cache(), StopSignals(), out[-1], *run_args(max_new=4, compare=False)))[-1]  # a live run after it
    assert final[PROGRESS].startswith("**done**") and final[-1]["streamed"] is True
    assert WALL_TIME_STREAMED in final[SPEEDUP]
