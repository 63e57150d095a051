"""Inductor's compiles in a child process (:mod:`specviz.precompile`): the child's protocol on the CPU (the eager
backend stands in for Inductor), the parent's waiting outside the warm-up's units, and its fallback when the child
fails. The GPU run of the whole path is ``test_compile_stage.py``'s warm-up test."""

from __future__ import annotations

import sys
import threading

import torch

from specviz import precompile
from specviz.compile_stage import CompileStatus, compile_stage
from specviz.loading import DEFAULT_TARGET
from specviz.precompile import Child, graph_key, key_of, spec_of
from specviz.warmup import Gate, WarmUp
from test_compile_stage import _FakeDecoder, _FakeRunner

KEYS = [(1, ()), (3, ("layer_output:0", "final_norm")), ("tree", 8, ())]


def test_graph_keys_round_trip_through_json():
    for key in KEYS:
        assert key_of(graph_key(key)) == key


def test_the_child_compiles_each_graph_in_order_and_says_so_line_by_line():
    spec = {"target": str(DEFAULT_TARGET), "draft": "", "dtype": "float32", "device": "cpu", "max_cache_len": 64,
            "prompt": [1, 2, 3, 4], "graphs": [{"role": "target", "key": graph_key(k)} for k in KEYS],
            "artifacts": "", "backend": "eager"}
    child = Child(spec)
    assert all(child.wait_for("target", key, timeout=120) for key in KEYS), child.error
    assert child.finish() == "off" and not child.error  # no cache file asked for
    assert child.proc.returncode == 0 and set(child.done) == {("target", k) for k in KEYS}


def test_a_child_that_dies_releases_every_waiter_with_its_reason():
    child = Child({}, command=[sys.executable, "-c", "import sys; print('boom', file=sys.stderr); sys.exit(3)"])
    assert child.wait_for("target", (1, ()), timeout=30) is False
    assert "exit 3" in child.error and "boom" in child.error


def test_the_spec_names_each_graph_once_with_its_models_role():
    dec = _FakeDecoder([])
    dec.draft_model = torch.nn.Linear(2, 2)
    dec.names = {"target": "/models/t", "draft": "/models/d", "dtype": "bfloat16"}
    dec.device = torch.device("cuda", 0)
    dec.runner_options = {"max_cache_len": 512}
    t1, t2, d1 = (type("R", (), {"model": m})() for m in (dec.target_model, dec.target_model, dec.draft_model))
    spec = spec_of(dec, [(t1, (1, ())), (t2, (1, ())), (d1, (1, ())), (t1, ("tree", 8, ()))], [5, 6], None)
    assert spec["graphs"] == [{"role": "target", "key": [1, []]}, {"role": "draft", "key": [1, []]},
                              {"role": "target", "key": ["tree", 8, []]}]
    assert (spec["target"], spec["draft"], spec["dtype"], spec["device"], spec["max_cache_len"], spec["artifacts"]) \
        == ("/models/t", "/models/d", "bfloat16", "cuda:0", 512, "")


def _decoder(log: list) -> _FakeDecoder:
    runner = _FakeRunner(log)
    dec = _FakeDecoder([runner])
    runner.model = dec.target_model
    return dec


class _StandInChild:
    """Records when the stage waits for a graph, and whether a warm-up unit was held meanwhile."""

    def __init__(self, gate: Gate, log: list, ok: bool = True):
        self.gate, self.log, self.ok, self.error = gate, log, ok, ""

    stuck = False
    said = True  # the child reported every graph it was asked about (compiled or failed)

    def reported(self, role, key):
        return self.said

    def wait_for(self, role, key, timeout=None):
        self.log.append(("wait", key, self.gate._owner))
        return self.ok

    def stop(self):
        self.log.append(("stop", None, None))

    def finish(self):
        return "saved"


def test_the_stage_waits_for_each_graph_outside_its_units_then_recompiles_it(monkeypatch):
    log: list = []
    dec = _decoder(log)
    gate = Gate()
    monkeypatch.setattr(precompile, "start", lambda decoder, work, prompt: _StandInChild(gate, log))
    assert compile_stage(WarmUp(dec, [1], 2, lambda line: None, gate=gate)) == 2
    assert [e[0] for e in log] == ["wait", "recompile"] * 3  # each graph: waited for, then recompiled
    assert all(owner is None for kind, _, owner in log if kind == "wait")  # no unit held while waiting
    st = dec.compile_status
    assert st.where == "in a child process" and st.artifacts == "saved by the compiling process"


def test_without_the_child_the_stage_compiles_in_process_as_before(monkeypatch):
    dec = _decoder([])
    monkeypatch.setattr(precompile, "start", lambda *a: (_ for _ in ()).throw(AssertionError("not to be started")))
    for status in (CompileStatus(mode="auto", state="pending", artifacts="loaded"),):
        dec.compile_status = status  # caches read back: their hits are quick in-process
        assert compile_stage(WarmUp(dec, [1], 2, lambda line: None)) == 2
        assert status.where == "in-process" and status.artifacts == "loaded"
    monkeypatch.setenv("SPECVIZ_PRECOMPILE", "off")
    dec = _decoder([])
    assert compile_stage(WarmUp(dec, [1], 2, lambda line: None)) == 2 and dec.compile_status.where == "in-process"


def test_a_failed_child_leaves_each_graph_to_the_parent(monkeypatch):
    log: list = []
    dec = _decoder(log)
    child = _StandInChild(Gate(), log, ok=False)
    child.error, child.finish = "exit 1: CUDA out of memory", lambda: ""
    monkeypatch.setattr(precompile, "start", lambda decoder, work, prompt: child)
    assert compile_stage(WarmUp(dec, [1], 2, lambda line: None)) == 2  # the parent compiled them itself
    assert dec.compile_status.artifacts == "none"  # the warm-up writes the cache file then


def test_no_child_on_the_cpu():
    dec = _decoder([])
    dec.device = torch.device("cpu")
    assert precompile.start(dec, [(None, (1, ()))], [1]) is None


def test_the_waiting_is_released_by_the_childs_line(monkeypatch):
    script = ("import sys, time; sys.stdin.read(); time.sleep(0.3); "
              "print('PRECOMPILED {\"role\": \"target\", \"key\": [2, []], \"ok\": true, \"s\": 0.1}', flush=True); "
              "print('PRECOMPILED {\"artifacts\": \"saved\"}', flush=True)")
    child = Child({"graphs": []}, command=[sys.executable, "-c", script])
    done = threading.Event()
    threading.Thread(target=lambda: (child.wait_for("target", (2, ())), done.set())).start()
    assert not done.wait(0.05)  # still waiting for the line
    assert done.wait(30) and child.finish() == "saved"
    assert child.wait_for("target", (3, ()), timeout=5) is False  # never compiled: released by the child's end


def test_a_child_stuck_on_a_graph_is_stopped_and_the_parent_compiles_the_rest(monkeypatch):
    import specviz.compile_stage as stage

    log: list = []
    dec = _decoder(log)
    child = _StandInChild(Gate(), log, ok=False)
    child.stuck, child.said, child.finish = True, False, lambda: "saved"
    monkeypatch.setattr(precompile, "start", lambda decoder, work, prompt: child)
    monkeypatch.setattr(stage, "CHILD_GRAPH_TIMEOUT_S", 0.01)
    assert compile_stage(WarmUp(dec, [1], 2, lambda line: None)) == 2
    assert [e[0] for e in log] == ["wait", "stop", "recompile", "recompile", "recompile"]  # waited once, not per graph
    assert dec.compile_status.artifacts == "none"  # a stopped child wrote nothing: the warm-up writes the file


def test_a_real_child_that_never_answers_times_out():
    child = Child({}, command=[sys.executable, "-c", "import sys, time; sys.stdin.read(); time.sleep(60)"])
    assert child.wait_for("target", (1, ()), timeout=0.5) is False and child.stuck
    child.stop()
    child.proc.wait(10)


def test_a_graph_the_child_failed_is_compiled_here_and_the_child_goes_on(monkeypatch):
    """The child reports its first graph failed and the next ones compiled: the parent compiles every graph (the
    failed one from cold), does not stop the child, and the child's cache file stands."""
    rows = [{"role": "target", "key": [1, []], "ok": False, "s": 0.1}, {"role": "target", "key": [3, []], "ok": True,
            "s": 0.1}, {"role": "target", "key": ["tree", 8, []], "ok": True, "s": 0.1}, {"artifacts": "saved"}]
    script = "import sys, json; sys.stdin.read()\n" + "".join(
        f"print('PRECOMPILED ' + json.dumps({r!r}), flush=True)\n" for r in rows)
    log: list = []
    dec = _decoder(log)
    started: list = []

    def start(decoder, work, prompt):
        started.append(Child({}, command=[sys.executable, "-c", script]))
        return started[-1]

    monkeypatch.setattr(precompile, "start", start)
    assert compile_stage(WarmUp(dec, [1], 2, lambda line: None)) == 2
    assert started[0].proc.returncode == 0  # ended by itself, not killed
    st = dec.compile_status
    assert st.where == "in a child process" and st.artifacts == "saved by the compiling process"


def test_no_child_without_the_models_sources(monkeypatch):
    """A decoder built directly (no model names to reload) compiles in-process instead of failing the warm-up."""
    dec = _decoder([])
    dec.device, dec.names = torch.device("cuda", 0), {}
    dec.runner_options = {"max_cache_len": 64}
    monkeypatch.setattr(precompile, "room_for_child", lambda models, device: True)
    runner = dec.pool.free(id(dec.target_model))[0]
    assert precompile.start(dec, [(runner, (1, ()))], [1]) is None
