"""benchmarks/regional_compile.py: the per-layer compiled forward equals the uncompiled one and leaves the layers as
they were (CPU, the ``eager`` backend: the code path only)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import regional_compile  # noqa: E402


def test_regional_forward_equals_the_uncompiled_one_and_restores_the_layers():
    row = regional_compile.child("dry", "layers", [1, 3], repeats=1, dry=True)
    assert set(row["widths"]) == {1, 3}
    for width in row["widths"].values():
        assert width["argmax_equal"] and width["max_abs_diff"] == 0.0 and width["compile_s"] > 0


def test_the_layers_run_compiled_only_inside_the_compiled_forward():
    model = regional_compile.load("dry", torch.device("cpu"), torch.float32)
    runner = regional_compile.StaticRunner(model, 64, cuda_graphs=False, compile=False)
    compiled = regional_compile.regional(runner, "eager")
    ids = torch.arange(4).view(1, 4)
    with torch.inference_mode():
        seen = []
        hook = lambda layer, args, kwargs: seen.append("forward" in vars(layer))  # noqa: E731
        handles = [layer.register_forward_pre_hook(hook, with_kwargs=True)
                   for layer in regional_compile.decoder_layers(model)]
        logits, _ = compiled(ids, False)
        runner.reset()
        plain, _ = runner._model_out(ids, False)
    assert seen == [True, True, False, False]  # swapped in for the compiled call, the class's forward after it
    assert torch.equal(logits, plain)
    for handle in handles:
        handle.remove()


def test_decoder_layers_are_found_or_refused():
    model = regional_compile.load("dry", torch.device("cpu"), torch.float32)
    assert len(regional_compile.decoder_layers(model)) == model.config.num_hidden_layers == 2
    model.config.num_hidden_layers = 7
    with pytest.raises(ValueError, match="no ModuleList of 7 decoder layers"):
        regional_compile.decoder_layers(model)


def test_render_prints_one_row_per_width_with_the_ratio():
    rows = [{"shape": "s", "scope": "layers", "caches": "cold",
             "widths": {1: {"uncompiled_ms": 2.0, "compiled_ms": 1.0, "compile_s": 3.0, "max_abs_diff": 0.0}}}]
    assert "| s | layers | cold | 1 | 3.0 | 2.000 | 1.000 | 2.00x |" in regional_compile.render(rows)
