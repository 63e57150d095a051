"""The step verifier: one :meth:`StepVerifier.queue` for every draft shape (a chain is the tree whose parents are
i - 1), returning a :class:`QueuedStep` whose :meth:`~QueuedStep.result` is the step's one wait and gives a
:class:`Verified`. Inside, a chain runs the fast chain units (:mod:`specviz.verify.chain`) and a tree the tree
verifier (:mod:`specviz.verify.tree`); both replay CUDA graphs on CUDA with the Triton sampler."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

import torch

from specviz.graphs import CapturedGraphs, replay
from specviz.proposer import Draft
from specviz.record import host_record, logit_top2_rows, queue_logit_top2, tree_record
from specviz.transfer import HostCopy

from .chain import ChainVerification, QueuedChain, _Graphs
from .spec import VerifySpec, graph_key
from .tree import QueuedTreeStep, TreeVerification


@dataclass
class Verified:
    """One verified step, whatever the draft's shape.

    emitted:      the accepted drafts, then the recovered / bonus token (host ints).
    num_accepted: accepted drafts.
    draft_ids:    the step's drafts as the trace's row shows them: a chain's k' tokens (its -1 padding removed),
                  a tree's accepted path.
    token_ids:    every drafted token (a tree's nodes; a chain's k').
    next_input:   int64 [1] on the device: the emitted token, the next step's first input.
    kept_rows:    None for a chain (its first rows are the committed ones); a tree's int64 [1 + N] on the device:
                  row 0 (the root), then each accepted node's forward row in path order, then padding.
    path:         a tree's accepted node ids (None for a chain).
    record:       () -> the step's plain-data trace record (reads the detail copy queued behind the verification:
                  call it when publishing).
    """

    emitted: list[int]
    num_accepted: int
    draft_ids: list[int]
    token_ids: list[int]
    next_input: torch.Tensor
    kept_rows: torch.Tensor | None
    path: list[int] | None
    record: Callable[[], dict[str, Any]]


@dataclass
class QueuedStep:
    """A queued verification (:meth:`StepVerifier.queue`); :meth:`result` waits once and returns :class:`Verified`."""

    spec: VerifySpec
    draft: Draft
    chain: QueuedChain | None = None
    tree: QueuedTreeStep | None = None
    top2: HostCopy | None = None  # the forward's top-2 logits per row (:func:`specviz.record.queue_logit_top2`)

    @property
    def next_input(self) -> torch.Tensor:
        """int64 [1] on the device: the step's emitted token, readable by later GPU work before :meth:`result`."""
        return self.chain.next_input if self.chain is not None else self.tree.next_input

    def result(self) -> Verified:
        if self.chain is not None:
            return _chain_verified(self.spec, self.chain, self.top2)
        return _tree_verified(self.spec, self.draft, self.tree, self.top2)


def _with_top2(record: dict[str, Any], top2: HostCopy | None, rows: list[int]) -> dict[str, Any]:
    """``record`` with ``logit_top2`` (the top-2 logits of the rows that decided its tokens) when recorded."""
    return record if top2 is None else {**record, "logit_top2": logit_top2_rows(top2, rows)}


def _chain_verified(spec: VerifySpec, queued: QueuedChain, top2: HostCopy | None = None) -> Verified:
    core = queued.core()
    draft_ids = [int(t) for t in core["draft"]]
    while draft_ids and draft_ids[-1] == -1:  # padding past k' (the sampler's k' is its first -1)
        draft_ids.pop()
    acc = int(core["num_accepted"][0])
    emitted = [int(t) for t in core["output"][: acc + 1]]

    def record() -> dict[str, Any]:
        if queued.detail is not None:
            rec = host_record({**core, **queued.detail.result()}, draft_ids, spec.verify, queued.backend)
            return _with_top2(rec, top2, list(range(acc + 1)))  # row j decided output token j of the step
        return brief_record(emitted, acc, len(draft_ids))

    return Verified(emitted, acc, draft_ids, draft_ids, queued.next_input, None, None, record)


def _tree_verified(spec: VerifySpec, draft: Draft, queued: QueuedTreeStep, top2: HostCopy | None = None) -> Verified:
    parents = list(draft.parents)  # a device-drafted tree's host copy: read now, after the queue
    out = queued.verify.finish(parents)  # the step's one wait, then the walk
    acc = len(out.path)
    emitted = list(out.output_token_ids)

    def record() -> dict[str, Any]:
        rec = tree_record(out, out.token_ids, parents, draft.scores, draft.tree_rule, spec.verify, queued.detail)
        return _with_top2(rec, top2, [0] + [c + 1 for c in out.path])  # the root's row, then each accepted node's

    return Verified(emitted, acc, emitted[:acc], list(out.token_ids), queued.next_input.clone(), queued.kept_rows,
                    list(out.path), record)


def brief_record(emitted: list[int], acc: int, k: int) -> dict[str, Any]:
    """The record of a step traced without detail (``detailed_trace=False``)."""
    kind = "target" if k == 0 else ("bonus" if acc == k else "recovered")
    return {"num_accepted": acc, "output_token_ids": emitted, "positions": [],
            "emitted": {"position": acc + 1, "token_id": emitted[-1], "kind": kind, "p": None, "top": []}}


class StepVerifier(ChainVerification, TreeVerification, CapturedGraphs):
    """Verifies the steps of one request at a time (the engine pools one per target runner).

    Args:
        device: where logits live.
        cuda_graphs: capture the units as CUDA graphs (default: on CUDA; used only with backend
            "triton", since the reference sampler synchronises with the host).
        max_graphs: most captured (core, detail) pairs kept; the least recently used is dropped.
    Attributes:
        graph_events: set to a list to collect (start, end) CUDA events around every replay
            (core and detail; the detail's run on the side stream).
    """

    def __init__(self, device: torch.device, cuda_graphs: bool | None = None, max_graphs: int = 64):
        self.device = torch.device(device)
        self.cuda_graphs = self.device.type == "cuda" if cuda_graphs is None else bool(cuda_graphs)
        self.max_graphs = int(max_graphs)
        self._graphs: OrderedDict[VerifySpec, _Graphs] = OrderedDict()  # by graph_key, least recent first
        self._pool = None
        self._side: torch.cuda.Stream | None = None
        self.graph_events: list[tuple[torch.cuda.Event, torch.cuda.Event]] | None = None
        self.capture_s = 0.0  # seconds spent in _capture so far (the engine excludes it from step times)


    def queue(self, spec: VerifySpec, logits: torch.Tensor, q: torch.Tensor | None, x: torch.Tensor, draft: Draft,
              generator: torch.Generator | None) -> QueuedStep:
        """Queue one step's verification right behind its target forward. logits: [k'+1, V] (a chain) or [1 + N, V]
        (a tree, row 0 the root); q: [k', V] / [N, V] or None (one-hot drafts); x: int64 [k'] / [N] on the device.
        A detailed spec also records the forward's top-2 logits per row (the record's ``logit_top2``).
        Raises ValueError as the sampler or :func:`~specviz.verify.tree.tree_rule_for` do."""
        top2 = queue_logit_top2(logits) if spec.detailed else None
        if draft.is_chain:
            return QueuedStep(spec, draft, chain=self.queue_chain(spec, logits, q, x, generator), top2=top2)
        return QueuedStep(spec, draft, tree=self.queue_tree(spec, logits, q, x, draft.forward_parents,
                                                            draft.tree_rule, generator), top2=top2)

    def _before_replay(self) -> torch.cuda.Stream:
        """Before any replay (returns the current stream): the main stream waits, on the device, for the details
        queued on the side stream (every graph shares one memory pool: two of them never overlap). The host does not
        wait: each detail is copied into its own pinned buffer, read when its step is published."""
        main = torch.cuda.current_stream(self.device)
        if self._side is not None:
            main.wait_stream(self._side)
        return main

    def _replay_units(self, g, main: torch.cuda.Stream) -> "HostCopy | None":
        """Replay ``g``'s core (a chain's :class:`_Graphs` or a tree's :class:`_TreeGraphs`) and queue its host
        copy; then its detail graph on the side stream, behind the core. Returns the detail's
        :class:`~specviz.transfer.HostCopy`, queued on the side stream into a pinned buffer of this step's own, so
        reading it never holds up a later replay (None without a detail graph)."""
        self._replay(g.core)
        g.host.copy_(g.flat, non_blocking=True)
        g.core_done.record(main)
        if g.detail is None:
            return None
        with torch.cuda.stream(self._side):
            self._side.wait_event(g.core_done)
            self._replay(g.detail)
            return HostCopy(g.detail_flat)

    def _lookup(self, spec_or_key, capture):
        """The graphs for a chain's ``graph_key(spec)`` (given the spec) or a tree's key ``("tree", graph_key,
        rule)``, captured by ``capture(key)`` on a miss; keeps at most ``max_graphs`` (drops the least recently
        used: its memory returns to the shared pool)."""
        key = graph_key(spec_or_key) if isinstance(spec_or_key, VerifySpec) else spec_or_key
        g = self._graphs.get(key)
        if g is None:
            g = self._graphs[key] = capture(key)
            while len(self._graphs) > self.max_graphs:
                self._graphs.popitem(last=False)
        self._graphs.move_to_end(key)
        return g

    def _replay(self, graph: torch.cuda.CUDAGraph) -> None:
        replay(graph, self.graph_events)  # timed between CUDA events when graph_events is a list (benchmarks)

