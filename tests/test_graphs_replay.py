"""specviz.graphs.replay, the one timed-replay helper of the static runner and the step verifier: a plain replay
when no event list is armed, and both callers route their replays through it with their own event list (the CUDA
path itself runs in the GPU tests; this checks the wiring on any machine)."""

from __future__ import annotations

from specviz import static_runner
from specviz.verify import verifier as verify_step
from specviz.graphs import replay


class _Graph:
    def __init__(self):
        self.replays = 0

    def replay(self):
        self.replays += 1


def test_replay_without_events_replays_once():
    g = _Graph()
    replay(g, None)
    assert g.replays == 1


def test_runner_and_verifier_replay_through_the_helper(monkeypatch):
    seen = []
    for module, cls in ((static_runner, static_runner.StaticRunner), (verify_step, verify_step.StepVerifier)):
        monkeypatch.setattr(module, "replay", lambda graph, events: seen.append((graph, events)))
        obj = cls.__new__(cls)  # only the attribute _replay reads
        obj.graph_events = events = []
        g = _Graph()
        obj._replay(g)
        assert seen[-1][0] is g and seen[-1][1] is events
    assert len(seen) == 2
