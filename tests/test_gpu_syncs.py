"""At most one host wait per engine step, for every method, counted on a GPU (ngram_gpu by default reads its draft
length once more: it verifies k' + 1 rows, not k + 1; its padded variant reads nothing).

Counted per call of ``SpecDecoder._step`` in a warm request (a first request captured the graphs):
* host syncs that PyTorch's sync-debug mode reports (``torch.cuda.set_sync_debug_mode("warn")``:
  ``.item()`` / ``.tolist()`` of device tensors, blocking copies, stream and device syncs), turned
  into counted warnings;
* ``torch.cuda.Event.synchronize`` calls, which sync-debug mode does not see: the verifier's wait
  for its core graph (the step's one wait) and, with tracing on, the read of an earlier step's
  detail record when that step is published (``PendingDetail``, its own pinned buffer, copied on a
  side stream two steps earlier; ``HostCopy.tolist`` waits only if that copy has not finished).
A step's first call also runs the drafter's eager prefill (per-request set-up), so it is left out.
Not seen by either count: the CUDA driver's own stream sync before a non-blocking copy from pageable
host memory; host drafts (ngram, suffix) and other host inputs are therefore staged in pinned memory
(specviz/transfer.py).
Skipped without CUDA (the lead runs it on the H200: benchmarks/run_gpu_suite.sh).
"""

from __future__ import annotations

import warnings

import pytest
import torch

from specviz import SpecDecoder

pytestmark = pytest.mark.gpu

PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a"
SYNC_MESSAGE = "called a synchronizing CUDA operation"
CASES = [
    ("none", dict(method="none")),
    ("ngram", dict(method="ngram", prompt_lookup_min=1, prompt_lookup_max=3)),
    ("ngram_gpu", dict(method="ngram_gpu", prompt_lookup_min=1, prompt_lookup_max=3)),  # reads k' on the host
    ("ngram_gpu padded", dict(method="ngram_gpu", prompt_lookup_min=1, prompt_lookup_max=3)),  # drafts padded to k
    ("suffix", dict(method="suffix")),
    ("draft_model greedy", dict(method="draft_model")),
    ("draft_model standard", dict(method="draft_model", verify="standard", temperature=0.8, top_p=0.9)),
    ("draft_model block", dict(method="draft_model", verify="block", temperature=0.8)),
    ("ngram synthetic", dict(method="ngram", verify="synthetic", temperature=1.0, prompt_lookup_min=1,
                             synthetic_rates=[0.9, 0.8, 0.7, 0.6])),
    ("eagle greedy", dict(method="eagle")),  # the head's static runner: graphs per draft step / first pass
    ("eagle3 standard", dict(method="eagle3", verify="standard", temperature=0.8)),
]


def count_waits(dec: SpecDecoder, monkeypatch, prompt=PROMPT, **kw) -> list[dict]:
    """Run one request and return, per step, the sync-debug warnings and the Event waits."""
    waited: list[torch.cuda.Event] = []
    original_sync = torch.cuda.Event.synchronize

    def counted_sync(event):
        import traceback

        event.specviz_caller = traceback.format_stack(limit=3)[0].strip()  # where the wait came from (a report)
        waited.append(event)
        return original_sync(event)

    monkeypatch.setattr(torch.cuda.Event, "synchronize", counted_sync)
    steps: list[dict] = []
    original_step = dec._step
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")

        def counted_step(*args, **kwargs):
            n_warn, n_wait = len(caught), len(waited)
            out = original_step(*args, **kwargs)
            steps.append({"syncs": [f"{w.message} at {w.filename}:{w.lineno}" for w in caught[n_warn:]
                                    if SYNC_MESSAGE in str(w.message)],
                          "waits": waited[n_wait:]})
            return out

        dec._step = counted_step
        torch.cuda.set_sync_debug_mode("warn")
        try:
            trace = dec.generate(prompt, **kw)
        finally:
            torch.cuda.set_sync_debug_mode(0)
            del dec._step
            monkeypatch.setattr(torch.cuda.Event, "synchronize", original_sync)
    assert len(steps) == len(trace.steps) > 3
    return steps


@pytest.fixture(scope="module")
def gpu_decoder(tiny_dirs):
    from specviz.methods.eagle.head import build_head
    from specviz.methods.eagle.config import head_config_from_target

    target, draft = tiny_dirs["llama"]
    dec = SpecDecoder.from_pretrained(target, draft, device="cuda", dtype="float32", runner="static")
    for kind in ("eagle", "eagle3"):  # random heads: what is counted does not depend on their acceptance
        torch.manual_seed(3)
        head = build_head(head_config_from_target(dec.target_model.config, kind), dec.target_model)
        dec.heads[kind] = head.to(device="cuda", dtype=torch.float32).eval()
    return dec


@pytest.mark.parametrize("detailed", (True, False), ids=("trace-on", "trace-off"))
@pytest.mark.parametrize("name, settings", CASES)
def test_at_most_one_wait_per_step(gpu_decoder, monkeypatch, name, settings, detailed):
    """One wait per step; ngram_gpu by default reads its draft length k' once more (the price of verifying k' + 1
    rows rather than k + 1: specviz.methods.ngram_gpu.PAD_ON_CUDA), its padded variant none."""
    import specviz.methods.ngram_gpu as ngram_gpu

    monkeypatch.setattr(ngram_gpu, "PAD_ON_CUDA", name == "ngram_gpu padded")
    host_reads = 1 if name == "ngram_gpu" else 0
    dec = gpu_decoder
    kw = dict(num_speculative_tokens=4, max_new_tokens=48, seed=1, detailed_trace=detailed, **settings)
    for _ in range(2):  # warm-up: Triton compilation, graph capture, pinned buffers, suffix global tree
        dec.generate(PROMPT, **kw)
    steps = count_waits(dec, monkeypatch, **kw)[1:]
    core = {id(g.core_done) for g in dec.step_verifier.graphs.values()}
    summary = []
    for i, s in enumerate(steps, start=1):
        main = [e for e in s["waits"] if id(e) in core]
        side = [e for e in s["waits"] if id(e) not in core]
        summary.append((len(s["syncs"]), len(main), len(side)))
        assert len(s["syncs"]) <= host_reads, f"{name} step {i}: host syncs beyond the verifier's wait: {s['syncs']}"
        assert len(main) == 1, f"{name} step {i}: {len(main)} waits for the verifier's core graph"
        assert len(side) <= (1 if detailed else 0), f"{name} step {i}: {len(side)} other event waits"
    if host_reads:  # the read of k' happens on the steps that draft (the last step drafts nothing)
        assert any(n == host_reads for n, _, _ in summary), summary
    print(f"{name} detailed={detailed}: (syncs, core waits, detail waits) per step {summary}")


TREE = dict(eagle_tree_top_k=2, eagle_tree_depth=3, eagle_tree_total_tokens=8)


@pytest.mark.parametrize("detailed", (True, False), ids=("trace-on", "trace-off"))
def test_eagle_tree_step_reads_the_host_once_per_level(gpu_decoder, monkeypatch, detailed):
    """An EAGLE-2 tree step reads the device once for the drafted tree (the frontier, its ancestor masks and
    the candidates' parents stay on the device through every level; the rerank's one copy brings the tree to
    the host), once in the tree verifier and, with tracing on, once for the step's record: at most 2 (+ 1
    traced) host reads, whatever the tree's size or depth (it was one per node and per top-20 list, about 30 for
    8 nodes; then one per level)."""
    dec = gpu_decoder
    kw = dict(method="eagle3", num_speculative_tokens=4, max_new_tokens=48, seed=1, detailed_trace=detailed, **TREE)
    for _ in range(2):
        dec.generate(PROMPT, **kw)
    steps = count_waits(dec, monkeypatch, **kw)[1:]
    bound = 2 + int(detailed)
    counts = [len(s["syncs"]) + len(s["waits"]) for s in steps]
    print(f"eagle3 tree detailed={detailed}: host reads per step {counts}")
    worst = max(range(len(steps)), key=lambda i: counts[i])
    assert max(counts) <= bound, (f"host reads per step {counts} exceed 2 (+1 traced) = {bound}; step {worst + 1}: "
                                  f"syncs {steps[worst]['syncs']}, event waits at "
                                  f"{[getattr(e, 'specviz_caller', '?') for e in steps[worst]['waits']]}")


@pytest.mark.parametrize("settings", [dict(method="none"), dict(method="none", async_scheduling=False),
                                      dict(method="draft_model", verify="standard", temperature=0.8),
                                      dict(method="eagle3", **TREE)], ids=("none", "none sync", "chain", "tree"))
def test_queueing_a_verification_never_waits_for_the_gpu(gpu_decoder, monkeypatch, settings):
    """``StepVerifier.queue`` returns without a host wait, traced steps too: each detail record is copied into its
    own pinned buffer and read when its step is published. A wait there (for the previous step's detail, running on
    the side stream beside the queued target forward) would hold the host until that forward is nearly done and
    leave the GPU idle while the host then queues the verification and the next forward."""
    from specviz.record import PendingTreeDetail
    from specviz.transfer import HostCopy
    from specviz.verify import StepVerifier
    from specviz.verify.chain import PendingDetail

    dec = gpu_decoder
    kw = dict(num_speculative_tokens=4, max_new_tokens=48, seed=1, detailed_trace=True, **settings)
    for _ in range(2):
        dec.generate(PROMPT, **kw)
    inside, waits, syncs = [False], [], []
    original_sync, original_queue = torch.cuda.Event.synchronize, StepVerifier.queue

    def counted_sync(event):
        if inside[0]:
            waits.append(event)
        return original_sync(event)

    def flag_read(cls, name):  # a host read of a detail record inside queue: a wait whenever its copy is unfinished
        original = getattr(cls, name)

        def read(self, *args, **kwargs):
            if inside[0]:
                waits.append(f"{cls.__name__}.{name}")
            return original(self, *args, **kwargs)
        monkeypatch.setattr(cls, name, read)

    def flagged_queue(self, *args, **kwargs):
        inside[0], before = True, len(caught)
        try:
            return original_queue(self, *args, **kwargs)
        finally:
            inside[0] = False
            syncs.extend(f"{w.message} at {w.filename}:{w.lineno}" for w in caught[before:]
                         if SYNC_MESSAGE in str(w.message))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        monkeypatch.setattr(torch.cuda.Event, "synchronize", counted_sync)
        monkeypatch.setattr(StepVerifier, "queue", flagged_queue)
        for cls, name in ((PendingDetail, "result"), (PendingTreeDetail, "result"), (HostCopy, "tolist")):
            flag_read(cls, name)
        torch.cuda.set_sync_debug_mode("warn")
        try:
            trace = dec.generate(PROMPT, **kw)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    assert len(trace.steps) > 3 and all(s.positions or s.emitted.top for s in trace.steps)  # detailed records
    graphs = [g for g in dec.step_verifier.graphs.values() if g is not None and g.detail is not None]
    assert graphs, "no captured detail graph: the test did not run the graph path"
    assert not waits, f"{len(waits)} waits or detail reads inside StepVerifier.queue over {len(trace.steps)} steps"
    assert not syncs, syncs
