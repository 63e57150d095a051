"""MoE experts inside CUDA graphs (specviz.attention.graph_experts_implementation): the rule, the switch, that
the capturable implementation computes the same logits, and that the forward a static runner captures reads no
device value on the host (checked op by op on the CPU; the GPU test in test_families.py counts capture failures)."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from family_models import MOE_FAMILIES, build_family
from specviz.attention import experts_for_graphs, experts_implementation, graph_experts_implementation
from specviz.static_runner import StaticRunner

pytestmark = pytest.mark.usefixtures("one_thread")

HOST_READS = {"aten._local_scalar_dense.default", "aten.nonzero.default", "aten.item.default"}


def test_the_rule():
    bf16, fp32 = torch.bfloat16, torch.float32
    assert experts_for_graphs("grouped_mm", bf16, "cuda", (9, 0)) is None  # CUTLASS path: offsets stay on the device
    assert experts_for_graphs("grouped_mm", bf16, "cuda", (10, 0)) is None
    assert experts_for_graphs("grouped_mm", fp32, "cuda", (9, 0)) == "batched_mm"  # aten fallback: offs.cpu()
    assert experts_for_graphs("grouped_mm", bf16, "cuda", (8, 0)) == "batched_mm"
    assert experts_for_graphs("eager", bf16, "cuda", (9, 0)) == "batched_mm"  # nonzero() and a host loop
    assert experts_for_graphs("batched_mm", fp32, "cuda", (9, 0)) is None
    assert experts_for_graphs("grouped_mm", fp32, "cpu", None) is None  # nothing is captured on the CPU
    assert graph_experts_implementation(build_family("llama")) is None  # no experts at all
    assert graph_experts_implementation(build_family("qwen3-moe")) is None  # a CPU model


class _HostReads(TorchDispatchMode):
    """Records every op that reads a device tensor's value on the host (a sync, refused inside a capture)."""

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func) in HOST_READS:
            self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


def _decode_forward_host_reads(model: torch.nn.Module, impl: str) -> tuple[list[str], torch.Tensor]:
    """Prefill a static runner, then run the forward it would capture (4 tokens) with experts ``impl``."""
    runner = StaticRunner(model, max_cache_len=64, cuda_graphs=False)
    runner.reset()
    runner.forward(torch.arange(5, 17))
    with experts_implementation(model, impl), torch.inference_mode(), _HostReads() as mode:
        logits, _ = runner._model_out(torch.arange(20, 24)[None], False)
    return mode.seen, logits


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_batched_experts_read_nothing_on_the_host_and_equal_the_default(family):
    model = build_family(family)
    default = model.config._experts_implementation
    seen, batched = _decode_forward_host_reads(model, "batched_mm")
    assert seen == [], (family, seen)
    assert model.config._experts_implementation == default  # the switch is undone
    _, grouped = _decode_forward_host_reads(model, "grouped_mm")
    torch.testing.assert_close(batched, grouped, rtol=1e-4, atol=1e-4)
    seen_loop, looped = _decode_forward_host_reads(model, "eager")  # the original per-expert loop
    assert seen_loop, family  # the check can fail: nonzero() and `if expert_idx == ...` read device values
    torch.testing.assert_close(looped, grouped, rtol=1e-4, atol=1e-4)


def test_a_failed_capture_is_noted_once_and_reaches_the_speedup_panel(caplog):
    """On the CPU a capture fails (no CUDA stream): each width then runs eagerly with the same tokens, the failure is
    logged once per model and cause, and the next request's trace carries it to the speedup panel's notes."""
    import functools
    import logging

    from specviz import SpecDecoder
    from specviz.static_runner import capture_notes
    from specviz.viz.speed import graph_notes_html
    from tiny_models import build_tokenizer

    model = build_family("llama")
    graphed = SpecDecoder(model, build_tokenizer(),
                          runner_factory=functools.partial(StaticRunner, max_cache_len=96, cuda_graphs=True))
    plain = SpecDecoder(model, build_tokenizer(), runner_factory=functools.partial(StaticRunner, max_cache_len=96))
    kw = dict(method="ngram", num_speculative_tokens=3, prompt_lookup_min=1, max_new_tokens=12)
    prompt = list(range(5, 16)) * 2
    with caplog.at_level(logging.WARNING, logger="specviz.static_runner"):
        first = graphed.generate(prompt, **kw)
    assert first.output_token_ids == plain.generate(prompt, **kw).output_token_ids
    warned = [r for r in caplog.records if "CUDA-graph capture" in r.getMessage()]
    assert len(warned) == 1, [r.getMessage() for r in caplog.records]  # several widths failed, one line
    notes = capture_notes(model)
    assert len(notes) == 1 and "LlamaForCausalLM" in notes[0] and "run eagerly" in notes[0]
    assert "graph_notes" not in first.config  # known only after this request's captures
    second = graphed.generate(prompt, **kw)
    assert second.config["graph_notes"] == notes
    from specviz.trace import Trace

    assert Trace.from_json(second.to_json()).config["graph_notes"] == notes  # an exported trace keeps them
    html = graph_notes_html(second.config["graph_notes"])
    assert "Not every forward ran from a CUDA graph" in html and "LlamaForCausalLM" in html
    assert graph_notes_html(None) == "" and capture_notes(build_family("llama")) == []
