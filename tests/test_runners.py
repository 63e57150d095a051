"""The static-cache runner (and, on CUDA, its CUDA graphs) gives the eager runner's greedy tokens."""

from __future__ import annotations

import pytest
import torch

from specviz import SpecDecoder
from specviz.runner import EagerRunner
from specviz.static_runner import StaticRunner

PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a"
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("arch", ("llama", "qwen2"))
def test_static_runner_matches_eager_greedy(tiny_dirs, arch, device):
    target, draft = tiny_dirs[arch]
    eager = SpecDecoder.from_pretrained(target, draft, device=device, dtype="float32")
    static = SpecDecoder.from_pretrained(target, draft, device=device, dtype="float32", runner="static")
    for method, k in (("none", 1), ("ngram", 3), ("suffix", 4), ("draft_model", 2), ("draft_model", 5)):
        kw = dict(method=method, num_speculative_tokens=k, max_new_tokens=40, prompt_lookup_min=1)
        want = eager.generate(PROMPT, **kw).output_token_ids
        for _ in range(2):  # the second request reuses the pooled runner (and its graphs)
            assert static.generate(PROMPT, **kw).output_token_ids == want, (method, k)
    assert isinstance(static.target_runner, StaticRunner)


def test_static_rollback_hides_stale_entries(tiny_dirs):
    from specviz.models import load_model

    model = load_model(tiny_dirs["llama"][0], torch.device("cpu"), torch.float32)
    ids = torch.arange(5, 25)
    eager, static = EagerRunner(model), StaticRunner(model, max_cache_len=64)
    for r in (eager, static):
        r.reset()
        r.forward(ids[:10])
        r.forward(ids[10:16])  # a "draft" that gets rejected
        r.truncate(12)
    torch.testing.assert_close(static.forward(ids[16:20]), eager.forward(ids[16:20]), rtol=1e-4, atol=1e-4)
    assert static.seq_len == eager.seq_len == 16
    with pytest.raises(ValueError, match="static KV cache holds 64"):
        static.forward(torch.arange(60))
