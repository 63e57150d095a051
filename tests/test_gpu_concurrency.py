"""Concurrent requests on one CUDA device while graphs are still being captured.

On the H200, 8 concurrent app sessions on a fresh app broke a CUDA-graph capture ("operation
failed due to a previous error during capture") and a session never finished: another thread's CUDA work ran
during the capture. :func:`specviz.engine.device_lock` now serialises GPU work step by step. Here, threads
run different methods at once on a fresh static-runner decoder (nothing captured yet, so captures happen
mid-request), and each output must equal the same request run alone, with no capture failing.
Skipped without CUDA.
"""

from __future__ import annotations

import threading

import pytest
import torch

from specviz import SpecDecoder

pytestmark = pytest.mark.gpu

PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a"
REQUESTS = [
    dict(method="none"),
    dict(method="ngram_gpu", prompt_lookup_min=1, prompt_lookup_max=3, num_speculative_tokens=4),
    dict(method="draft_model", num_speculative_tokens=3),
    dict(method="draft_model", num_speculative_tokens=5, verify="standard", temperature=0.9, seed=2),
    dict(method="ngram", prompt_lookup_min=1, prompt_lookup_max=3, num_speculative_tokens=6),
    dict(method="draft_model", num_speculative_tokens=4, verify="block", temperature=0.8, seed=3),
]


def test_concurrent_requests_during_capture_equal_solo_runs(tiny_dirs):
    target, draft = tiny_dirs["llama"]
    solo_dec = SpecDecoder.from_pretrained(target, draft, device="cuda", dtype="float32", runner="static")
    solo = [solo_dec.generate(PROMPT, max_new_tokens=40, **kw).output_token_ids for kw in REQUESTS]
    dec = SpecDecoder.from_pretrained(target, draft, device="cuda", dtype="float32", runner="static")
    results: list = [None] * len(REQUESTS)
    errors: list = []
    start = threading.Barrier(len(REQUESTS))

    def work(i: int) -> None:
        try:
            start.wait()
            results[i] = dec.generate(PROMPT, max_new_tokens=40, **REQUESTS[i]).output_token_ids
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append((i, repr(exc)))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(REQUESTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    assert all(not t.is_alive() for t in threads), "a request did not finish"
    for i, kw in enumerate(REQUESTS):
        assert results[i] == solo[i], (i, kw)
    failed = [key for r in dec.pool.objects()
              for key, g in (getattr(r, "_graphs", None) or {}).items() if g is None]
    assert not failed, f"captures that failed under concurrency: {failed}"
