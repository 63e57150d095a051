"""The recorder: engine events in, a :class:`~specviz.trace.schema.Trace` out."""

from __future__ import annotations

from typing import Any

from specviz import events as ev

from .metrics import RunMetrics
from .schema import Emitted, Position, Step, Trace, TreeNode, chain_nodes


class Recorder:
    """Subscribes to an :class:`~specviz.events.EventBus` and builds a :class:`Trace`."""

    def __init__(self, bus: ev.EventBus):
        self.trace: Trace | None = None
        self._draft: ev.DraftProposed | None = None
        self._pending: dict[str, Any] | None = None
        self._unsubscribe = [
            bus.subscribe(ev.GenerationStarted, self._on_start),
            bus.subscribe(ev.DraftProposed, self._on_draft),
            bus.subscribe(ev.StepVerified, self._on_verified),
            bus.subscribe(ev.TokensCommitted, self._on_committed),
            bus.subscribe(ev.GenerationFinished, self._on_finished),
        ]

    def close(self) -> None:
        for unsubscribe in self._unsubscribe:
            unsubscribe()

    def _on_start(self, e: ev.GenerationStarted) -> None:
        self.trace = Trace(config=dict(e.config), prompt_token_ids=list(e.prompt_token_ids))

    def _on_draft(self, e: ev.DraftProposed) -> None:
        self._draft = e

    def _on_verified(self, e: ev.StepVerified) -> None:
        self._pending = {"event": e}

    def _on_committed(self, e: ev.TokensCommitted) -> None:
        draft, verified = self._draft, self._pending["event"]
        rec = verified.record
        row = list(draft.token_ids) if "row" not in rec else [rec["nodes"][c]["token_id"] for c in rec["row"]]
        self.trace.steps.append(
            Step(
                index=e.step,
                proposer=draft.proposer,
                draft_token_ids=row,
                num_accepted=rec["num_accepted"],
                emitted=Emitted(**rec["emitted"]),
                positions=[Position(**p) for p in rec["positions"]],
                committed_token_ids=list(e.token_ids),
                match={"kind": self.trace.config.get("method"), **draft.details},  # kind picks the details' schema
                block=rec.get("block"),
                timings_ms={"draft": draft.draft_ms, "verify": verified.verify_ms, "sample": verified.sample_ms,
                            **({"capture": verified.capture_ms} if verified.capture_ms else {})},
                sampler_backend=rec.get("backend", "reference"),
                logit_top2=rec.get("logit_top2", [])[:len(e.token_ids)],  # the rows of what the stop kept
                **self._tree_fields(rec, row),
            )
        )

    def _tree_fields(self, rec: dict[str, Any], draft_ids: list[int]) -> dict[str, Any]:
        """nodes / accepted_path / tree_rule of a step: from a tree record, else the chain's."""
        if "nodes" in rec:
            return {"nodes": [TreeNode(**n) for n in rec["nodes"]], "accepted_path": list(rec["accepted_path"]),
                    "tree_rule": rec["tree_rule"]}
        positions = [Position(**p) for p in rec["positions"]]
        greedy = self.trace.config.get("verify") == "greedy"
        acc = rec["num_accepted"]
        return {"nodes": chain_nodes(list(draft_ids), acc, positions, greedy),
                "accepted_path": list(range(min(acc, len(draft_ids)))), "tree_rule": "chain"}

    def _on_finished(self, e: ev.GenerationFinished) -> None:
        t = self.trace
        t.output_token_ids = list(e.output_token_ids)
        t.wall_time_s = e.wall_time_s
        t.target_forward_passes = e.target_forward_passes
        t.stop_reason = e.stop_reason
        t.config.update(e.config)
        m = RunMetrics.of(t)
        t.tokens_per_second, t.metrics = m.tokens_per_second, m.to_dict()
