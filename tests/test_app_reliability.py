"""The app's reliability: a GPU out-of-memory mid-run, the
speedup measured beside each run, Stop's comparison note, the per-session suffix cache, export
names, and one-time capture kept out of a run's timings (CPU: a mocked capture)."""

from __future__ import annotations

import re
import threading
import time

import pytest
import torch

gradio_client = pytest.importorskip("gradio_client")
from gradio_client import Client  # noqa: E402

from test_app import (  # noqa: E402,F401  (app_url, endless_app_url: fixtures)
    GRID, PROGRESS, PROMPT, SPEEDUP, STREAM, _launch, app_url, endless_app_url, plot, run_args, stream_tokens)

from specviz import SpecDecoder  # noqa: E402
from specviz.runner import EagerRunner  # noqa: E402
from specviz.trace import Trace  # noqa: E402
from specviz.ui import build_app  # noqa: E402
from specviz.ui.cache import DecoderCache  # noqa: E402


class _FaultyRunner(EagerRunner):
    """An eager runner whose forward can be armed to raise torch.OutOfMemoryError at the n-th
    forward of a request (each forward first sleeps a little, so the run streams before it fails)."""

    armed: dict = {"after": None, "sleep": 0.0}

    def reset(self) -> None:
        super().reset()
        self.calls = 0

    def forward_features(self, token_ids, taps=(), parents=None):  # forward() calls it too: every forward comes through here
        self.calls = getattr(self, "calls", 0) + 1
        time.sleep(self.armed["sleep"])
        after = self.armed["after"]
        if after is not None and self.calls > after:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")
        return super().forward_features(token_ids, taps, parents=parents)


@pytest.fixture()
def faulty_app(tiny_dirs):
    target, draft = tiny_dirs["llama"]
    cache = DecoderCache(str(target), str(draft), "cpu")
    decoder = cache.get()
    decoder.runner_factory = _FaultyRunner  # every runner from now on can fail
    decoder.pool.clear()
    demo = build_app(str(target), str(draft), "cpu", cache=cache)
    url = _launch(demo)
    yield url
    _FaultyRunner.armed.update(after=None, sleep=0.0)
    demo.close()


def _exported_trace(client) -> Trace:
    path = [p for p in client.predict(0, 1, api_name="/export") if p.endswith("trace.json")][0]
    return Trace.from_json(open(path, encoding="utf-8").read())


def test_out_of_memory_mid_run_keeps_the_app_up_and_the_previous_trace(faulty_app):
    client = Client(faulty_app, verbose=False)
    first = client.predict(*run_args(method="draft_model", max_new=16, compare=False), api_name="/run")
    assert first[PROGRESS].startswith("**done**")
    _FaultyRunner.armed.update(after=6, sleep=0.3)  # the target's 7th forward (6th step) runs out of memory
    other = "class Point:\n    def __init__(self, x, y):\n        self.x = x\n"
    job = client.submit(*run_args(prompt=other, method="ngram", max_new=40, compare=False), api_name="/run")
    failed = job.result(timeout=120)
    updates = [o[PROGRESS] for o in job.outputs()]
    assert any(u.startswith("**running**") for u in updates), "the run failed before it streamed (not mid-run)"
    assert failed[PROGRESS].startswith("**error** · the GPU ran out of memory")
    assert "previous run" in failed[PROGRESS] and "Export still saves it" in failed[PROGRESS]
    # the views and the session are back on the previous run, and its export is whole
    assert stream_tokens(failed[STREAM]) == stream_tokens(first[STREAM])
    saved = _exported_trace(client)
    assert saved.prompt_text == PROMPT and saved.config["method"] == "draft_model" and saved.stop_reason
    assert len(saved.output_token_ids) == 16
    # the app is still up, and its pooled runners were not poisoned: the same request gives the same tokens
    _FaultyRunner.armed.update(after=None, sleep=0.0)
    again = client.predict(*run_args(method="draft_model", max_new=16, compare=False), api_name="/run")
    assert again[PROGRESS].startswith("**done**") and stream_tokens(again[STREAM]) == stream_tokens(first[STREAM])


def test_out_of_memory_before_any_update_changes_nothing(faulty_app):
    client = Client(faulty_app, verbose=False)
    first = client.predict(*run_args(method="ngram", max_new=8, compare=False), api_name="/run")
    _FaultyRunner.armed.update(after=0, sleep=0.0)  # the prefill fails
    out = client.predict(*run_args(method="none", max_new=8, compare=False), api_name="/run")
    assert out[PROGRESS].startswith("**error** · the GPU ran out of memory")
    _FaultyRunner.armed.update(after=None)
    assert stream_tokens(client.predict(0, api_name="/select_step")[1]) == stream_tokens(first[STREAM])
    assert _exported_trace(client).config["method"] == "ngram"


def test_stop_with_compare_ticked_says_the_comparison_was_not_made(endless_app_url):
    client = Client(endless_app_url, verbose=False)
    job = client.submit(*run_args(method="draft_model", k=12, max_new=400, compare=True, prompt="x = [\n"),
                        api_name="/run")
    deadline = time.time() + 60
    while not (job.outputs() and job.outputs()[-1][PROGRESS].startswith("**running**")) and time.time() < deadline:
        time.sleep(0.05)
    out = client.predict(api_name="/stop")
    final = job.result(timeout=120)
    for panel in (out[SPEEDUP], final[SPEEDUP]):
        assert "This run was stopped, so its comparison with method none was not made" in panel
        assert "tick" not in panel  # it does not tell the user to tick a box that is ticked


def test_unticked_compare_says_how_to_get_one(app_url):
    out = Client(app_url, verbose=False).predict(*run_args(max_new=8, compare=False), api_name="/run")
    assert "Not compared with method none: tick" in out[SPEEDUP]


def test_the_measurement_is_made_beside_each_run_not_cached(app_url):
    client = Client(app_url, verbose=False)
    client.predict(*run_args(method="draft_model", max_new=12, pairs=3), api_name="/run")
    one = client.predict(api_name="/measure")
    m1 = _exported_trace(client).metrics["baseline_none"]["measurement"]
    client.predict(*run_args(method="draft_model", max_new=12, pairs=3), api_name="/run")
    two = client.predict(api_name="/measure")
    m2 = _exported_trace(client).metrics["baseline_none"]["measurement"]
    assert "median of 3 interleaved pairs of 12-token segments" in one[SPEEDUP]
    assert m1["n"] == m2["n"] == 3 and m1["segment_tokens"] == 12
    assert m1["ratios"] != m2["ratios"]  # timed again for the second run (equal floats would mean a cache)
    assert m1["method_summary"]["tokens"] == m2["method_summary"]["tokens"] == 36  # 3 segments of 12 tokens
    assert re.search(r"the measurement took \d+\.\d s", two[SPEEDUP])


def test_measure_speedup_interleaves_and_reports_the_spread(decoders, monkeypatch):
    from specviz import speedup

    calls = []
    real = decoders["llama"].generate

    def generate(prompt, **settings):
        calls.append(settings["method"])
        return real(prompt, **settings)

    monkeypatch.setattr(decoders["llama"], "generate", generate)
    out = speedup.measure_speedup(decoders["llama"], PROMPT, {"method": "ngram", "num_speculative_tokens": 3,
                                                                "max_new_tokens": 64, "prompt_lookup_min": 1,
                                                                "prompt_lookup_max": 3}, pairs=4, segment_tokens=8)
    assert calls == ["ngram", "none", "none", "ngram", "ngram", "none", "none", "ngram"]  # A B, B A, ...
    m = out["measurement"]
    assert m["n"] == 4 and len(m["ratios"]) == 4 and m["segment_tokens"] == 8
    assert m["low"] == min(m["ratios"]) and m["high"] == max(m["ratios"])
    assert out["tokens"] == 32 and out["steps"] == 32  # method none: one token per step, 4 x 8 tokens
    assert speedup.spread([1.0, 1.1, 0.9])["noisy"] is False
    assert speedup.spread([0.5, 1.0, 2.0])["noisy"] is True  # the panel then says "too noisy to read"
    short = speedup.measure_speedup(decoders["llama"], PROMPT, {"method": "ngram", "max_new_tokens": 4}, pairs=5,
                                    segment_tokens=4, budget_s=0.0)
    assert short["measurement"]["n"] == 1 and short["measurement"]["pairs"] == 5  # the budget cut it short


def test_a_noisy_measurement_is_flagged_in_the_panel():
    from specviz.viz.speed import measured_html

    base = {"pairs": 3, "segment_tokens": 32, "cost_s": 2.0, "n": 3}
    quiet = measured_html({**base, "ratios": [1.4, 1.5, 1.45], "median": 1.45, "low": 1.4, "high": 1.5, "noisy": False})
    loud = measured_html({**base, "ratios": [0.6, 1.5, 2.4], "median": 1.5, "low": 0.6, "high": 2.4, "noisy": True})
    assert "1.45× tokens/s" in quiet and "range 1.40–1.50× over the 3 pairs" in quiet and "noisy" not in quiet
    assert "Too noisy to read" in loud and "0.60× to 2.40×" in loud
    cut = measured_html({**base, "n": 1, "ratios": [1.2], "median": 1.2, "low": 1.2, "high": 1.2, "noisy": False})
    assert "one pair: no spread" in cut and "the time budget ended it after 1 of 3 pairs" in cut


def test_suffix_cache_is_per_session_and_can_be_reset(app_url):
    a, b = Client(app_url, verbose=False), Client(app_url, verbose=False)
    prompt = "def add(a, b):\n    return a + b\n"
    first = a.predict(*run_args(prompt=prompt, method="suffix", max_new=16, compare=True), api_name="/run")
    assert first[PROGRESS].startswith("**done**")
    assert "speedup measured" in a.predict(api_name="/measure")[PROGRESS]
    # one earlier output: the measurement's segments drafted from a frozen copy and added nothing
    assert "holds **1** earlier output" in a.predict("suffix", api_name="/method_state")
    metrics_first = _exported_trace(a).metrics
    a.predict(*run_args(prompt=prompt, method="suffix", max_new=16, compare=False), api_name="/run")
    assert "holds **2** earlier outputs" in a.predict("suffix", api_name="/method_state")
    # a new session starts from an empty tree: the same request drafts as a's first run did
    assert "holds **0** earlier outputs" in b.predict("suffix", api_name="/method_state")
    b.predict(*run_args(prompt=prompt, method="suffix", max_new=16, compare=False), api_name="/run")
    metrics_b = _exported_trace(b).metrics
    assert metrics_b["mean_acceptance_length"] == metrics_first["mean_acceptance_length"]
    assert metrics_b["num_draft_tokens"] == metrics_first["num_draft_tokens"]
    # reset: a known starting state again
    shown = a.predict("suffix", api_name="/reset_method_state")
    assert "holds **0** earlier outputs" in shown
    a.predict(*run_args(prompt=prompt, method="suffix", max_new=16, compare=False), api_name="/run")
    assert _exported_trace(a).metrics["num_draft_tokens"] == metrics_first["num_draft_tokens"]


def test_suffix_snapshot_is_frozen_and_deepcopy_gives_a_live_copy():
    import copy

    from specviz.methods.suffix.proposer import GlobalSuffixCache

    cache = GlobalSuffixCache()
    cache.add_request([1, 2, 3])
    frozen = cache.snapshot()
    frozen.add_request([4, 5])
    assert len(frozen) == 1 and len(cache) == 1 and frozen.trie.find([1, 2]) is not None
    live = copy.deepcopy(cache)  # what gr.State does with the initial value, per session
    live.add_request([7])
    assert len(live) == 2 and len(cache) == 1 and live.lock is not cache.lock
    cache.clear()
    assert len(cache) == 0 and cache.trie.find([1]) is None and len(live) == 2


def test_export_names_differ_for_two_prompts_and_two_times():
    from specviz.ui.handlers import export_stem

    cfg = {"method": "ngram", "num_speculative_tokens": 4, "verify": "greedy", "temperature": 0.0, "seed": 0}
    a = Trace(config=cfg, prompt_token_ids=[1, 2], prompt_text="def f(x):")
    b = Trace(config=cfg, prompt_token_ids=[1, 3], prompt_text="def g(y):")
    t = time.gmtime(1_800_000_000)
    assert export_stem(a, t) != export_stem(b, t)
    assert export_stem(a, t) != export_stem(a, time.gmtime(1_800_000_001))
    assert re.fullmatch(r"specviz-ngram-k4-greedy-T0\.0-seed0-p[0-9a-f]{6}-20270115T080000Z", export_stem(a, t))


def test_the_header_names_the_device_in_use():
    from specviz.ui.cache import device_in_use

    assert device_in_use("cpu") == "cpu"
    expected = f"cuda:0 ({torch.cuda.get_device_name(0)})" if torch.cuda.is_available() else "cpu"
    assert device_in_use(None) == expected  # "auto" is resolved, not shown
    assert "auto" not in DecoderCache(None, None, None).describe()


def test_the_compile_option_reaches_the_decoder_and_the_trace(tiny_dirs, monkeypatch):
    """``--compile``: parsed, handed by the app's decoder cache to SpecDecoder.from_pretrained (so the static
    runners and the head runners compile on CUDA), named in the header (no effect on the CPU, said so), and
    recorded in each trace's config (False without it)."""
    from specviz.ui.launch import parse_args

    assert parse_args(["--compile"]).compile and not parse_args([]).compile
    target, draft = tiny_dirs["llama"]
    seen = {}
    real = SpecDecoder.from_pretrained.__func__

    def spy(cls, *a, **kw):
        seen.update(kw)
        return real(cls, *a, **{k: v for k, v in kw.items() if k != "compile"}, runner="static", compile=False)

    monkeypatch.setattr(SpecDecoder, "from_pretrained", classmethod(spy))
    cache = DecoderCache(str(target), str(draft), "cpu", compile=True)
    assert "no effect on the CPU" in cache.describe()
    dec = cache.get()
    assert seen.get("compile") is True
    trace = dec.generate(PROMPT, method="none", max_new_tokens=4)
    assert trace.config["compile"] is False and trace.config["runner"] == "StaticRunner"
    assert Trace.from_json(trace.to_json()).config["compile"] is False  # the schema takes it
    assert "torch.compile" not in DecoderCache(str(target), str(draft), "cpu").describe()


# ---- one-time capture: counted by the runners / verifier, excluded from the step times ---------
CAPTURE_S, FORWARD_S = 0.5, 0.001
CLOCK = [0.0]  # the engine's clock in the capture test: advanced only by the fake runner below


class _CapturingRunner(EagerRunner):
    """Pretends to capture a CUDA graph the first time it sees a forward width after the prefill:
    CAPTURE_S on the engine's (fake) clock, counted in ``capture_s`` as StaticRunner._capture
    counts it; every forward itself costs FORWARD_S."""

    cuda_graphs = True

    def __init__(self, model):
        super().__init__(model)
        self.capture_s, self.widths = 0.0, set()

    def forward_features(self, token_ids, taps=(), parents=None):  # forward() calls it too
        n = int(token_ids.numel())
        if self.seq_len > 0 and n not in self.widths:
            self.widths.add(n)
            CLOCK[0] += CAPTURE_S
            self.capture_s += CAPTURE_S
        CLOCK[0] += FORWARD_S
        return super().forward_features(token_ids, taps, parents=parents)


def test_capture_inside_a_run_is_excluded_from_its_timings(tiny_dirs, monkeypatch):
    import types

    from specviz import timing

    target, draft = tiny_dirs["llama"]
    dec = SpecDecoder.from_pretrained(str(target), str(draft), device="cpu")
    dec.runner_factory = _CapturingRunner
    monkeypatch.setattr(timing, "time", types.SimpleNamespace(perf_counter=lambda: CLOCK[0]))  # the step timer's clock
    trace = dec.generate(PROMPT, method="ngram", num_speculative_tokens=3, max_new_tokens=24,
                         prompt_lookup_min=1, prompt_lookup_max=3)
    widths = {len(s.draft_token_ids) + 1 for s in trace.steps}
    assert len(widths) >= 2 and trace.metrics["capture_ms"] == pytest.approx(1e3 * CAPTURE_S * len(widths))
    # a step that captured is charged only its own forward; the capture is reported beside it
    capturing = [s for s in trace.steps if s.timings_ms.get("capture", 0.0) > 0]
    assert len(capturing) == len(widths)
    for s in trace.steps:
        assert s.timings_ms["verify"] == pytest.approx(1e3 * FORWARD_S), s.timings_ms
        assert s.timings_ms.get("capture", 0.0) in (0.0, pytest.approx(1e3 * CAPTURE_S))
    assert sum(trace.metrics["time_ms"].values()) < 1e3 * CAPTURE_S  # time_ms (and tokens/s) without it
    # the panel says so
    from specviz.ui.views import all_views

    speedup = all_views(trace, 0, 1, None, "x")[-1]
    assert "excluded from its timings" in speedup and f"{trace.metrics['capture_ms'] / 1e3:.2f} s" in speedup


class _GraphRunner(EagerRunner):
    """Records the forward widths a graph-capturing runner would capture."""

    cuda_graphs = True
    tree_buckets = (8, 16)  # as StaticRunner's: tree forwards padded to these row counts
    max_cache_len = 4096

    def __init__(self, model):
        super().__init__(model)
        self.widths, self.tree_widths = [], []

    def forward_features(self, token_ids, taps=(), parents=None):  # forward() calls it too
        tree = parents is not None and list(parents) != list(range(-1, len(parents) - 1))
        (self.tree_widths if tree else self.widths).append(int(token_ids.numel()))
        return super().forward_features(token_ids, taps, parents=parents)


class _RecordingVerifier:
    """A CPU StepVerifier that says it captures graphs and records every spec it verifies."""

    cuda_graphs = True
    capture_s = 0.0
    max_graphs = 4  # as StepVerifier's LRU bound (64 there): the warm-up must raise it to fit its plan

    def __init__(self):
        from specviz.verify import StepVerifier

        self.specs, self._real = [], StepVerifier(torch.device("cpu"))

    def run(self, spec, logits, q, x, generator):  # the warm-up's
        assert logits.shape == (spec.k + 1, spec.vocab) and x.shape == (spec.k,)
        assert (q is not None) == spec.full_q
        self.specs.append(spec)
        from dataclasses import replace

        return self._real.run(replace(spec, backend="reference"), logits, q, x, generator)

    def queue(self, spec, logits, q, x, draft, generator):  # a request's steps
        assert (q is not None) == spec.full_q
        self.specs.append(spec)
        from dataclasses import replace

        return self._real.queue(replace(spec, backend="reference"), logits, q, x, draft, generator)


def test_warm_up_reaches_every_width_and_verifier_spec(tiny_dirs):
    from specviz.warmup import warm_up_specs

    target, draft = tiny_dirs["llama"]
    dec = SpecDecoder.from_pretrained(str(target), str(draft), device="cpu")
    dec.runner_factory = _GraphRunner
    dec.generate(PROMPT, method="none", max_new_tokens=1)  # one target runner in the pool
    verifier = _RecordingVerifier()
    dec.pool.replace("verifier", [verifier])
    report = dec.warm_up(max_speculative_tokens=4)
    target_runner = dec.pool.free(id(dec.target_model))[0]
    assert set(range(1, 6)) <= set(target_runner.widths)  # verify widths 1..k+1
    assert target_runner.tree_widths == [8, 16]  # one tree forward per tree-size bucket (static trees)
    assert {1, 2} <= set(dec.pool.free(id(dec.draft_model))[0].widths)  # the drafter's steps
    assert not dec.pool.free(id(dec.draft_model))[0].tree_widths  # the drafter never runs trees
    plan = warm_up_specs(dec.vocab_size, 4, backend="triton")
    assert verifier.specs[-len(plan):] == plan  # after the two tiny requests, every spec of the plan once
    assert report["graphs"] == 5 + 2 + 2 + len(plan)
    # the verifier keeps every pair the warm-up captured (its LRU bound once dropped 42 of k <= 12's 106 keys)
    from specviz.verify import graph_key

    assert verifier.max_graphs >= len({graph_key(s) for s in plan}) + 1


def test_warm_up_specs_cover_what_the_ui_reaches(tiny_dirs, monkeypatch):
    """Every VerifySpec the engine builds for the UI's settings (k <= 12; temperature 0 or an
    example's 0.8 / 1.0; the default synthetic rates) is among those warm_up captures."""
    from dataclasses import replace

    from specviz.verify import verifier as verify_step
    from specviz.warmup import warm_up_specs

    target, draft = tiny_dirs["llama"]
    dec = SpecDecoder.from_pretrained(str(target), str(draft), device="cpu")
    seen = set()
    real = verify_step.StepVerifier.queue

    def queue(self, spec, *args):  # every step of a request
        seen.add(replace(spec, backend="triton"))
        return real(self, spec, *args)

    monkeypatch.setattr(verify_step.StepVerifier, "queue", queue)
    rates = (0.8, 0.6, 0.4, 0.3, 0.2)
    for method in ("none", "ngram", "suffix", "draft_model"):
        for verify, temp, k in (("greedy", 0.0, 12), ("standard", 0.8, 12), ("block", 1.0, 7), ("synthetic", 0.0, 5),
                                ("synthetic", 1.0, 5), ("standard", 0.0, 3)):
            dec.generate(PROMPT, method=method, verify=verify, temperature=temp, num_speculative_tokens=k,
                         max_new_tokens=12, synthetic_rates=rates if verify == "synthetic" else None,
                         prompt_lookup_min=1 if method == "ngram" else None,
                         prompt_lookup_max=3 if method == "ngram" else None)
    plan = set(warm_up_specs(dec.vocab_size, 12, backend="triton"))
    assert seen and seen <= plan, sorted(map(str, seen - plan))[:3]
    assert any(s.full_q for s in seen) and any(s.k >= 5 for s in seen)


def test_background_warm_up_reports_progress_then_its_cost(tiny_dirs):
    target, draft = tiny_dirs["llama"]
    cache = DecoderCache(str(target), str(draft), "cpu")
    lines = []
    import specviz.warmup as warmup

    real = warmup.warm_up

    def spy(*args, progress=None, **kw):
        return real(*args, progress=lambda line: (lines.append(line), progress(line)), **kw)

    warmup.warm_up = spy
    try:
        cache.start_warm_up().join(timeout=120)
    finally:
        warmup.warm_up = real
    assert cache.loaded() and cache.status == "" and lines[-1] == "warm-up: done"
    assert cache.warm_up_report["seconds"] > 0
    from specviz.ui.handlers import SessionHandlers
    from specviz.ui.cache import StopSignals

    line, timer = SessionHandlers(cache, StopSignals()).warm_up_status()
    assert line.startswith("warmed up in") and timer.active is False


def test_a_run_pressed_during_the_warm_up_waits_for_it(tiny_dirs):
    target, draft = tiny_dirs["llama"]
    cache = DecoderCache(str(target), str(draft), "cpu")
    started = threading.Event()
    import specviz.warmup as warmup

    real = warmup.warm_up

    def slow(*args, **kw):
        started.set()
        time.sleep(1.0)
        return real(*args, **kw)

    warmup.warm_up = slow
    try:
        cache.start_warm_up()
        assert started.wait(60)
        t0 = time.perf_counter()
        # what Run does on the CPU, where the warm-up is part of the load: waits for both, never loads twice
        decoder = cache.get()
        assert time.perf_counter() - t0 > 0.3 and cache.warm_up_report is not None
    finally:
        warmup.warm_up = real
    assert cache.get() is decoder


def test_no_capture_note_when_nothing_was_captured(app_url):
    client = Client(app_url, verbose=False)
    out = client.predict(*run_args(method="ngram", max_new=8, compare=False), api_name="/run")
    assert plot(out[GRID])["data"]
    assert "captured CUDA graphs" not in out[SPEEDUP]  # nothing captured on the CPU: no note


def test_an_error_quoting_angle_brackets_is_shown_whole():
    """Python's SyntaxError text ends "(<unknown>, line 1)": the Markdown progress line took "<unknown>" for a tag
    and lost the rest of the message and the note that the views are stale (new-user report)."""
    import warnings

    from specviz.ui.outputs import STALE_NOTE, message_outputs as _message_outputs

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # gr.Warning outside a request warns
        line = _message_outputs("speculative_token_tree: '(' was never closed (<unknown>, line 1)")[0]
    assert "(&lt;unknown&gt;, line 1)" in line and "<unknown>" not in line and STALE_NOTE in line
