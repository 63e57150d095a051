"""Shared fixtures: tiny random models saved to disk (loaded like real ones), and one intra-op thread."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from tiny_models import save_model  # noqa: E402


def pytest_collection_modifyitems(config, items):
    """Mark every test that drives Chromium (it takes a ``browser`` fixture) ``browser``: scripts/test.sh runs them in
    one process after the rest, so page timings are not stretched by a second worker's load. Skip the tests marked
    ``gpu`` where there is no CUDA device (CI); on the H200 they run (``pytest -m gpu``)."""
    import torch

    no_cuda = pytest.mark.skip(reason="needs a CUDA GPU (pytest -m gpu on the device)")
    for item in items:
        if "browser" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.browser)
        if item.get_closest_marker("gpu") is not None and not torch.cuda.is_available():
            item.add_marker(no_cuda)


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    """{arch: (target_dir, draft_dir)} for arch in llama, qwen2 (draft: a smaller, different model)."""
    root = tmp_path_factory.mktemp("tiny")
    out = {}
    for arch in ("llama", "qwen2"):
        target = save_model(arch, root / f"{arch}-target", seed=0)
        draft = save_model(arch, root / f"{arch}-draft", seed=1, layers=1)
        out[arch] = (target, draft)
    return out


@pytest.fixture(scope="session")
def decoders(tiny_dirs):
    """{arch: SpecDecoder} with target + a different (random) draft, float32 on CPU."""
    from specviz import SpecDecoder

    return {arch: SpecDecoder.from_pretrained(t, d, device="cpu", dtype="float32") for arch, (t, d) in tiny_dirs.items()}


@pytest.fixture(scope="session")
def self_decoders(tiny_dirs):
    """{arch: SpecDecoder} whose draft is the target itself (every greedy draft accepted)."""
    from specviz import SpecDecoder

    return {arch: SpecDecoder.from_pretrained(t, t, device="cpu", dtype="float32") for arch, (t, _) in tiny_dirs.items()}


def _single_thread():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a whole module (``pytestmark = pytest.mark.usefixtures("one_thread")``): the
    models are tiny, and the CI machine's cores are shared."""
    yield from _single_thread()


@pytest.fixture
def one_thread_per_test():
    """One intra-op thread for one test only."""
    yield from _single_thread()
