"""Compile swapped in behind served graphs: the warm-up's compile stage (:mod:`specviz.compile_stage`), a runner's
recompile of one graph at a time (:class:`specviz.compiled_graphs.CompiledGraphs`), the compile cache file, and
which graphs a request replayed (``config.runner_compiled``, the speedup panel's note).

On the CPU the stage runs over stand-in runners (no CUDA graphs here); on the GPU over the real static runner."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from specviz import SpecDecoder
from specviz.compile_stage import (CompileStatus, artifact_path, compile_stage, initial_status, load_artifacts,
                                   save_artifacts)
from specviz.compiled_graphs import CompiledGraphs, compiled_label
from specviz.pools import Pool
from specviz.static_runner import StaticRunner
from specviz.trace.validate import _check_measurement
from specviz.warmup import Gate, WarmUp
from tiny_models import build_model


class _FakeRunner(CompiledGraphs):
    """Three captured graphs; recompiling key (3, ()) fails (its compile raised), the others succeed."""

    cuda_graphs = True

    def __init__(self, log: list):
        self._graphs = {(1, ()): "g1", (3, ()): "g3", ("tree", 8, ()): "t8", (5, ()): None}  # None: a failed capture
        self._compiled = self._compiled_tree = None
        self._init_compiled_graphs()
        self.log = log
        self.raise_on_tree = False

    def enable_compile(self, backend: str = "inductor") -> bool:
        self._compiled = self._compiled_tree = "compiled"
        return True

    def recompile(self, key, prompt) -> bool:
        self.log.append(("recompile", key, threading.get_ident()))
        if key == (3, ()):
            return False
        if key == ("tree", 8, ()) and self.raise_on_tree:
            raise RuntimeError("CUDA out of memory")
        self._graphs[key] = f"compiled {key}"
        self._note_capture(key, True)
        return True


class _FakeDecoder:
    def __init__(self, runners: list):
        self.target_model, self.draft_model = torch.nn.Linear(2, 2), None
        self.pool = Pool()
        self.pool.replace(id(self.target_model), runners)
        self.compile_status = CompileStatus(mode="auto", state="pending")


def test_the_stage_recompiles_every_served_graph_once_and_keeps_a_failed_one_uncompiled():
    log: list = []
    runners = [_FakeRunner(log), _FakeRunner(log)]  # two pooled target runners: both are recompiled
    dec = _FakeDecoder(runners)
    lines: list[str] = []
    warm = WarmUp(dec, [1, 2, 3], 4, lines.append)
    assert compile_stage(warm) == 4  # graphs now compiled by this stage
    st = dec.compile_status
    assert (st.state, st.done, st.failed, st.total) == ("done", 4, 2, 6)
    for r in runners:
        assert r.uncompiled_keys() == [(3, ())]  # the failed one still serves its uncompiled graph
        assert r._graphs[(3, ())] == "g3" and r._graphs[(5, ())] is None  # a failed capture is not recompiled
    assert [key for _, key, _ in log].count((1, ())) == 2
    assert any("compiling the forwards in-process: 0/6" in line for line in lines)
    # a second stage (after a method's warm-up) tries only what is left; the counts are of the runners' graphs
    log.clear()
    assert compile_stage(warm) == 0
    assert [key for _, key, _ in log] == [(3, ()), (3, ())]
    assert (st.done, st.failed, st.total) == (4, 2, 6)


def test_a_graph_whose_recompile_raises_keeps_serving_and_the_stage_goes_on(caplog):
    runner = _FakeRunner([])
    runner.raise_on_tree = True
    dec = _FakeDecoder([runner])
    assert compile_stage(WarmUp(dec, [1], 2, lambda line: None)) == 1
    assert sorted(map(str, runner.uncompiled_keys())) == sorted(map(str, [(3, ()), ("tree", 8, ())]))
    assert dec.compile_status.failed == 2 and "CUDA out of memory" in caplog.text


def test_the_stage_does_nothing_unless_the_mode_is_auto():
    dec = _FakeDecoder([_FakeRunner([])])
    for mode in ("off", "on"):
        dec.compile_status = CompileStatus(mode=mode, state="off" if mode == "off" else "done")
        assert compile_stage(WarmUp(dec, [1], 2, lambda line: None)) == 0
        assert dec.pool.free(id(dec.target_model))[0].uncompiled_keys()


def test_each_recompile_is_one_unit_that_waits_for_the_requests_in_flight():
    log: list = []
    dec = _FakeDecoder([_FakeRunner(log)])
    gate = Gate()
    entered, leave = threading.Event(), threading.Event()

    def request() -> None:
        with gate.request():
            entered.set()
            leave.wait(5)
            log.append(("request done", None, None))

    r = threading.Thread(target=request)
    r.start()
    assert entered.wait(5)
    t = threading.Thread(target=compile_stage, args=(WarmUp(dec, [1], 2, lambda line: None, gate=gate),))
    t.start()
    t.join(0.3)
    assert t.is_alive() and log == []  # nothing recompiled while the request runs
    leave.set()
    r.join(5)
    t.join(5)
    assert log[0][0] == "request done" and [e[0] for e in log[1:]] == ["recompile"] * 3


def test_initial_status_by_argument_and_device(monkeypatch):
    import specviz.compile_stage as stage

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert initial_status(True, cpu, True).mode == "on"
    assert initial_status("background", cuda, True).mode == "auto"
    assert initial_status("background", cuda, True).state == "pending"
    assert initial_status("background", cpu, False).mode == "off"  # the CPU's eager runner: nothing to compile
    assert initial_status("background", cuda, False).mode == "off"
    assert initial_status(False, cuda, True).mode == "off"
    for default in (False, True):  # None follows the library's default
        monkeypatch.setattr(stage, "BACKGROUND_DEFAULT", default)
        assert initial_status(None, cuda, True).mode == ("auto" if default else "off")
    with pytest.raises(ValueError, match="background"):
        initial_status("yes", cuda, True)
    with pytest.raises(ValueError, match="background"):
        SpecDecoder.from_pretrained(device="cpu", compile="fast")


def test_the_app_takes_the_three_compile_flags():
    from specviz.ui.launch import parser

    parse = parser().parse_args
    assert parse([]).compile is None
    assert parse(["--compile"]).compile is True
    assert parse(["--compile-background"]).compile == "background"
    assert parse(["--no-compile"]).compile is False
    with pytest.raises(SystemExit):
        parse(["--compile", "--no-compile"])


@pytest.fixture(scope="module")
def cpu_trace():
    dec = SpecDecoder.from_pretrained(device="cpu")
    return dec, dec.generate("def f(x):", method="ngram", max_new_tokens=4)


def test_a_cpu_decoder_records_no_runner_label_and_its_status_is_off(cpu_trace):
    dec, trace = cpu_trace
    assert dec.compile_status.mode == "off"
    assert "runner_compiled" not in trace.config  # the eager runner replays no graph


def test_compiled_label_counts_the_requests_own_replays():
    assert compiled_label([3, 7], [9, 7]) == "compiled"
    assert compiled_label([0, 2], [0, 9]) == "uncompiled"
    assert compiled_label([1, 1], [4, 3]) == "partly compiled (3 of 5 forwards)"
    assert compiled_label([2, 2], [2, 2]) is None


def test_the_cache_file_is_keyed_by_models_and_can_be_switched_off(tmp_path, monkeypatch):
    a, b = build_model("llama", seed=0, layers=2, hidden=64), build_model("llama", seed=0, layers=3, hidden=64)
    monkeypatch.setenv("SPECVIZ_COMPILE_CACHE", str(tmp_path))
    pa, pb = artifact_path([a], torch.device("cpu")), artifact_path([b], torch.device("cpu"))
    assert pa.parent == tmp_path and pa != pb
    assert pa == artifact_path([a], torch.device("cpu"))  # stable across calls
    assert load_artifacts(pa) == "none"
    pa.write_bytes(b"not a torch cache")
    assert load_artifacts(pa).startswith("error: ")  # a foreign file is reported, not raised
    assert save_artifacts(pb) in ("saved", "none")
    monkeypatch.setenv("SPECVIZ_COMPILE_CACHE", "off")
    assert artifact_path([a], torch.device("cpu")) is None
    assert load_artifacts(None) == save_artifacts(None) == "off"


def test_the_cache_is_written_whole_and_an_unwritable_directory_is_reported_not_raised(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: (b"artifacts", None))
    target = tmp_path / "c" / "a.bin"
    assert save_artifacts(target) == "saved" and target.read_bytes() == b"artifacts"
    assert not list(target.parent.glob("*.tmp"))
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert save_artifacts(Path(blocker) / "sub" / "a.bin").startswith("error: ")


def test_the_speedup_note_names_the_runner_and_warns_when_the_sides_differ():
    from specviz.viz.speed import runner_note  # the views need plotly; the GPU tests here do not

    assert runner_note(None, None) == ""
    assert runner_note("uncompiled", {"runner": {"method": "uncompiled", "none": "uncompiled"}}) == ""  # the default
    same = runner_note("compiled", {"runner": {"method": "compiled", "none": "compiled"}})
    assert "this run: <b>compiled</b>" in same and "They differ" not in same
    mixed = runner_note("uncompiled", {"runner": {"method": "compiled", "none": "uncompiled"}})
    assert "They differ" in mixed and "#b45309" in mixed


def test_an_uploaded_measurement_keeps_a_valid_runner_entry_and_drops_a_malformed_one(cpu_trace):
    from specviz.speedup import summarize

    base = {"median": 1.5, "low": 1.2, "high": 1.8, "cost_s": 2.0, "pairs": 3, "segment_tokens": 32, "n": 3,
            "noisy": False, "ratios": [1.2, 1.5, 1.8], "method_summary": summarize([cpu_trace[1]])}
    ok = lambda v: isinstance(v, (int, float)) and v == v  # noqa: E731
    kept = _check_measurement({**base, "runner": {"method": "compiled", "none": "compiled"}}, "m", ok)
    assert kept["runner"] == {"method": "compiled", "none": "compiled"}
    dropped = _check_measurement({**base, "runner": {"method": 3, "evil": "x"}}, "m", ok)
    assert "runner" not in dropped


class _Graph:
    """A stand-in CUDA graph for the CPU: replaying it does nothing (its static outputs stay as captured)."""

    def replay(self) -> None:
        pass

    def pool(self) -> None:
        return None


@pytest.fixture
def fake_graphs(monkeypatch):
    """The static runner's capture paths with :class:`_Graph` instead of a CUDA graph (the forward runs eagerly once,
    compiled when compile is on), so its recompile and replay counting run on the CPU; ``fail`` makes compiled chain
    captures raise."""
    import specviz.static_tree as static_tree

    state = {"fail": False}

    def capture(fn, device, pool=None, warmup=2, reset=None):  # a tree forward's capture
        out = fn()
        if reset is not None:
            reset()
        return _Graph(), out

    def capture_once(self, n, ids, taps):
        if state["fail"] and self._compiled is not None:
            raise RuntimeError("capture failed")
        static_ids = ids.clone()
        logits, feats = self._eager(static_ids, taps, model_out=self._compiled)
        self._set_position(self.seq_len)
        self._graphs[(n, taps)] = (_Graph(), static_ids, logits, feats)
        self._note_capture((n, taps), self._compiled is not None)
        return self._graphs[(n, taps)]

    monkeypatch.setattr(static_tree, "capture", capture)
    monkeypatch.setattr(StaticRunner, "_capture_once", capture_once)
    return state


def _captured_runner() -> tuple[StaticRunner, list[int]]:
    from specviz.compiled_graphs import capture_shape

    model = build_model("llama", seed=0, layers=2, hidden=64)
    runner = StaticRunner(model, max_cache_len=128, cuda_graphs=True, tree_buckets=(8, 16))
    prompt = list(range(5, 14))
    for n in (1, 2, 4):
        capture_shape(runner, prompt, n, (), False)
    capture_shape(runner, prompt, 8, (), True)
    runner.reset()
    return runner, prompt


def test_recompile_swaps_each_graph_and_counts_replays_by_kind(fake_graphs):
    runner, prompt = _captured_runner()
    keys = runner.uncompiled_keys()
    # the verify widths, the tree bucket and the 9-token prompt's prefill bucket (16 rows)
    assert sorted(map(str, keys)) == sorted(map(str, [(1, ()), (2, ()), (4, ()), (16, ()), ("tree", 8, ())]))
    runner.forward(torch.tensor(prompt))
    before = list(runner.replays)
    runner.forward(torch.tensor(prompt[-1:] * 2))
    assert compiled_label(before, runner.replays) == "uncompiled"
    runner.reset()
    assert runner.enable_compile(backend="eager")
    olds = {key: runner.graphs[key] for key in keys}
    assert [runner.recompile(key, prompt) for key in keys] == [True] * 5
    assert runner.uncompiled_keys() == [] and len(runner.compiled_keys()) == 5
    assert all(runner.graphs[key] is not olds[key] for key in keys)  # swapped, not kept
    runner.forward(torch.tensor(prompt))
    before = list(runner.replays)
    runner.forward(torch.tensor(prompt[-1:] * 2))
    runner.forward_features(torch.tensor(prompt[-1:] * 3), parents=[-1, 0])  # a tree: bucket 8
    assert compiled_label(before, runner.replays) == "compiled"


def test_a_recompile_whose_capture_fails_keeps_the_old_graph_and_compile_gives_up(fake_graphs):
    runner, prompt = _captured_runner()
    old = runner.graphs[(2, ())]
    assert runner.enable_compile(backend="eager")
    fake_graphs["fail"] = True
    assert runner.recompile((2, ()), prompt) is False
    assert runner.graphs[(2, ())] is old and (2, ()) in runner.uncompiled_keys()  # the served graph is kept
    assert runner._compile_gave_up and not runner.compiled  # the runner stays uncompiled from now on
    assert runner.recompile((4, ()), prompt) is False and (4, ()) in runner.uncompiled_keys()


@pytest.mark.gpu
def test_recompiled_graphs_replace_the_served_ones_and_decode_the_same_tokens_on_gpu():
    """fp32 on CUDA: graphs captured uncompiled, then each recompiled in place; every graph is compiled after, the
    replays are counted as compiled, and a forward after the swap equals one before (argmax, logits to 1e-4)."""
    model = build_model("llama", seed=0, layers=2, hidden=64).cuda()
    runner = StaticRunner(model, max_cache_len=128)
    prompt = list(range(5, 14))
    from specviz.compiled_graphs import capture_shape as _capture

    for n in (1, 2, 4):
        _capture(runner, prompt, n, (), False)
    _capture(runner, prompt, 8, (), True)
    runner.reset()
    runner.forward(torch.tensor(prompt))
    counts = list(runner.replays)
    before = runner.forward(torch.tensor(prompt[-1:] * 4)).clone()
    assert compiled_label(counts, runner.replays) == "uncompiled"
    runner.reset()
    keys = runner.uncompiled_keys()
    assert len(keys) == 4 and all(runner.recompile(key, prompt) for key in keys)
    assert runner.uncompiled_keys() == [] and runner.compiled
    runner.forward(torch.tensor(prompt))
    counts = list(runner.replays)
    after = runner.forward(torch.tensor(prompt[-1:] * 4))
    assert compiled_label(counts, runner.replays) == "compiled"
    torch.testing.assert_close(after, before, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
def test_the_warm_up_compiles_behind_the_served_graphs_and_traces_say_so_on_gpu(tmp_path, monkeypatch):
    """The bundled models on CUDA (bf16): before the warm-up a request replays uncompiled graphs; the warm-up's compile
    stage leaves none uncompiled, writes the cache file, and a later request says "compiled"."""
    monkeypatch.setenv("SPECVIZ_COMPILE_CACHE", str(tmp_path))
    dec = SpecDecoder.from_pretrained(device="cuda", compile="background")
    assert dec.compile_status.mode == "auto"
    first = dec.generate("def f(x):", method="draft_model", num_speculative_tokens=3, max_new_tokens=24)
    assert first.config.get("runner_compiled") == "uncompiled"
    report = dec.warm_up(4, verify_methods=("greedy",), temperatures=(), synthetic_rates=(),
                         method_names=("draft_model",))
    st = dec.compile_status
    assert st.state == "done" and st.done > 0 and st.failed == 0 and report["compiled"] == st.done
    from specviz.compile_stage import compiled_runners

    assert all(not r.uncompiled_keys() for r in compiled_runners(dec))
    # the bundled models leave room on the GPU for the compiling process's copy: it wrote the cache file
    assert st.where == "in a child process" and st.artifacts == "saved by the compiling process"
    assert list(tmp_path.glob("*.bin"))
    later = dec.generate("def f(x):", method="draft_model", num_speculative_tokens=3, max_new_tokens=24)
    assert later.config.get("runner_compiled") == "compiled"


def test_specviz_compare_takes_a_compile_choice(tmp_path, capsys):
    """--compile background on the CPU runs the comparison as before (the eager runner has nothing to compile); an
    unknown choice is refused by the parser."""
    from specviz.cli import main

    out = tmp_path / "cmp"
    code = main(["compare", "--methods", "ngram", "-k", "2", "--prompt", "def f(x):\n    return f(", "--max-new-tokens",
                 "4", "--device", "cpu", "--compile", "background", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    assert (out / "compare.csv").exists()
    with pytest.raises(SystemExit):
        main(["compare", "--methods", "ngram", "--prompt", "x", "--compile", "fast", "--out", str(out)])


def test_the_app_header_names_each_compile_mode(monkeypatch):
    import specviz.ui.cache as cache

    monkeypatch.setattr(cache, "device_in_use", lambda device: "cuda:0")
    lines = {mode: cache.DecoderCache(device="cuda", compile=mode).describe() for mode in (True, "background", False)}
    assert "on from the start" in lines[True]
    assert "swapped in after the warm-up" in lines["background"] and "from the start" not in lines["background"]
    assert "torch.compile" not in lines[False]


def test_compile_true_on_the_cpus_eager_runner_is_off():
    assert initial_status(True, torch.device("cpu"), False).mode == "off"
    assert initial_status(True, torch.device("cpu"), True).mode == "on"  # a static runner compiles on the CPU too
