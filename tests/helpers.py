"""Set-up shared by test files.

The head-method files (test_medusa, test_mtp, test_dflash, test_eagle, test_eagle_tree): the tiny
target, the decoders of both runners, the CLI's arguments, the "random heads and an oracle give plain
greedy's tokens" loop and the GPU check that the static runner's CUDA graphs give the eager runner's
tokens. The browser files (test_browser, test_browser_single_run, test_lesson_app): headless Chromium
and the app's page. Imports are inside the functions, so that importing this module costs nothing
(and needs neither Chromium nor Playwright)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

PROMPT = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a"
RUNNERS = ("eager", "static")


def save_tiny_target(root: Path, layers: int, hidden: int = 32):
    """(target dir, target model): a tiny random Llama (seed 3, ``layers`` layers) saved to ``root / "target"``
    and loaded back as a decoder's target (fp32 on the CPU), for building heads on."""
    from specviz import SpecDecoder
    from tiny_models import save_model

    target = save_model("llama", root / "target", seed=3, layers=layers, hidden=hidden)
    return target, SpecDecoder.from_pretrained(target, device="cpu", dtype="float32").target_model


def tiny_head_dirs(tmp_path_factory, kind: str, make_head, layers: int = 4, save=None):
    """(target dir, head dir): :func:`save_tiny_target` (``layers`` layers) and ``make_head(target model)``
    saved (fp32; by ``save``, default specviz.heads.save_head) beside it, in a fresh folder named ``kind``."""
    import torch

    from specviz.heads import save_head

    root = tmp_path_factory.mktemp(kind)
    target, model = save_tiny_target(root, layers=layers)
    (save or save_head)(make_head(model), root / kind, dtype=torch.float32)
    return target, root / kind


def save_eagle_heads(root: Path, model) -> dict[str, Path]:
    """{kind: head dir}: one random head of each kind, eagle (seed 10) and eagle3 (seed 11), built on ``model``
    and saved (fp32) to ``root / kind``."""
    import torch

    from specviz.methods.eagle.head import build_head
    from specviz.methods.eagle.config import head_config_from_target
    from specviz.heads import save_head

    heads = {}
    for i, kind in enumerate(("eagle", "eagle3")):
        torch.manual_seed(10 + i)
        save_head(build_head(head_config_from_target(model.config, kind), model), root / kind, dtype=torch.float32)
        heads[kind] = root / kind
    return heads


def runner_decoders(target, heads: dict, device: str = "cpu") -> dict:
    """{runner: SpecDecoder} for the eager and the static runner: ``target`` with ``heads`` ({kind: dir}), fp32."""
    from specviz import SpecDecoder

    return {r: SpecDecoder.from_pretrained(target, device=device, dtype="float32", runner=r,
                                           heads={k: str(v) for k, v in heads.items()}) for r in RUNNERS}


def cli_args(target, k: int = 3, *more: str) -> list[str]:
    """``specviz generate`` on ``target`` (the CPU, fp32, 6 new tokens, k = ``k``), then ``more``."""
    return ["generate", "--target", str(target), "--prompt", "def add(a, b):", "-k", str(k), "--max-new-tokens", "6",
            "--device", "cpu", "--dtype", "float32", "--no-color", *more]


def target_features(dec, ids: list[int], taps):
    """[len(ids), F]: the taps of one uncached target forward over ``ids``, concatenated."""
    import torch

    from specviz.runner import hidden_state_index

    with torch.no_grad():
        out = dec.target_model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    L = dec.target_model.config.num_hidden_layers
    return torch.cat([out.hidden_states[hidden_state_index(t, L)][0] for t in taps], dim=-1)


def assert_greedy_equals_plain_greedy(dec, runner: str, kinds, ks, make_oracle, *, min_accepted: int,
                                      rejection_from_k: int = 1, noun: str = "head", check_random=None,
                                      **generate) -> None:
    """For every k of ``ks`` and method of ``kinds``: the decoder's own (random) heads, then the stub
    ``make_oracle(kind, full, real_heads)`` (``full``: the prompt and plain greedy's 16 tokens) give exactly
    method none's tokens; with the stub, some step accepts its whole draft and (from k = ``rejection_from_k``
    on) some step rejects a part; the stubs' accepted drafts sum to more than ``min_accepted``. The real
    heads are put back. ``check_random(k, trace)``: a further check of each random-head run."""
    from specviz.static_runner import StaticRunner

    want = dec.generate(PROMPT, method="none", max_new_tokens=16).output_token_ids
    full = dec.encode(PROMPT) + want
    real = dict(dec.heads)
    accepted = 0
    try:
        for k in ks:
            for kind in kinds:
                dec.heads = dict(real)
                got = dec.generate(PROMPT, method=kind, num_speculative_tokens=k, max_new_tokens=16, **generate)
                assert got.output_token_ids == want, (runner, kind, k, f"random {noun}")
                if check_random is not None:
                    check_random(k, got)
                dec.heads[kind] = make_oracle(kind, full, real)
                got = dec.generate(PROMPT, method=kind, num_speculative_tokens=k, max_new_tokens=16, **generate)
                assert got.output_token_ids == want, (runner, kind, k, f"oracle {noun}")
                if k >= rejection_from_k:
                    assert any(s.num_accepted < len(s.draft_token_ids) for s in got.steps)  # a rejection
                assert any(s.num_accepted == len(s.draft_token_ids) > 0 for s in got.steps)  # a full accept
                accepted += sum(s.num_accepted for s in got.steps)
    finally:
        dec.heads = real
    assert accepted > min_accepted  # the oracle's drafts were mostly accepted
    if runner == "static":
        assert isinstance(dec.target_runner, StaticRunner)


def assert_static_graphs_equal_eager(decs: dict, method: str, k: int, verify: str) -> None:
    """``decs``: {runner: SpecDecoder} on CUDA. Greedy, seeded standard sampling and seeded ``verify``
    (both at T = 0.9): the static runner (CUDA graphs) gives the eager runner's tokens and per-step
    acceptances (24 new tokens, k = ``k``), and greedy gives method none's tokens."""
    for kw in (dict(), dict(temperature=0.9, verify="standard", seed=3), dict(temperature=0.9, verify=verify, seed=4)):
        runs = {r: d.generate(PROMPT, method=method, num_speculative_tokens=k, max_new_tokens=24, **kw)
                for r, d in decs.items()}
        assert runs["static"].output_token_ids == runs["eager"].output_token_ids, kw
        assert [s.num_accepted for s in runs["static"].steps] == [s.num_accepted for s in runs["eager"].steps], kw
        if not kw:
            want = decs["static"].generate(PROMPT, method="none", max_new_tokens=24).output_token_ids
            assert runs["static"].output_token_ids == want


# ---- the browser tests --------------------------------------------------------------------------------------
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]
SHOTS = Path(os.environ.get("SPECVIZ_SCREENSHOTS", Path(__file__).resolve().parent.parent / "screenshots-tmp"))


def chromium(tmp_path_factory, width: int, height: int):
    """A generator for a fixture (``yield from``): a persistent headless Chromium context (CHROMIUM, never a
    downloaded browser) with a ``width`` x ``height`` viewport on a fresh profile, removed afterwards."""
    from playwright.sync_api import sync_playwright

    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(str(profile), executable_path=CHROMIUM, headless=True, args=ARGS,
                                                   viewport={"width": width, "height": height})
        yield ctx
        ctx.close()
    shutil.rmtree(profile, ignore_errors=True)


def open_page(browser, url: str, viewport: dict | None = None, pages: list | None = None):
    """(page, errors): a new page of ``browser`` (appended to ``pages``; resized to ``viewport``) at ``url``, once
    the app's Run button is there; ``errors`` collects the page's uncaught script errors."""
    page = browser.new_page()
    if pages is not None:
        pages.append(page)
    if viewport is not None:
        page.set_viewport_size(viewport)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url)
    page.wait_for_selector("#sv-run")
    return page, errors


def set_box(page, label: str, value) -> None:
    """Type ``value`` into the input labelled ``label`` and press Enter."""
    box = page.get_by_label(label, exact=True)
    box.fill(str(value))
    box.press("Enter")


def fill_until_kept(box, value: str, commit: str = "Enter", tries: int = 3) -> None:
    """Fill the input ``box`` (a locator) with ``value``, pressing ``commit``, until it keeps the value: an accordion
    mounts its fields as it opens, so text filled into one it then replaces is lost (a chain ran where a static tree
    was typed, an ngram run kept prompt_lookup_min = 2). Asserts the value stuck."""
    for _ in range(tries):
        box.fill(value)
        box.press(commit)
        box.page.wait_for_timeout(200)
        if box.input_value() == value:
            return
    assert box.input_value() == value, (box.input_value(), value)


def progress(page) -> str:
    """The app's progress line."""
    return page.locator("#sv-progress").inner_text()


def draft_mismatches(dec, method: str, reference, k: int, max_new_tokens: int, min_compared: int = 4, **settings):
    """(trace, [(step, specviz's drafts, the reference's)] where they differ): ``dec`` decodes PROMPT with ``method``
    (a chain of k; ``settings`` more generate() keywords) and ``reference.draft(context, n)`` drafts n tokens from the
    same committed context at every drafting step. Asserts that at least ``min_compared`` steps drafted."""
    trace = dec.generate(PROMPT, method=method, num_speculative_tokens=k, max_new_tokens=max_new_tokens, **settings)
    ctx, bad, compared = list(trace.prompt_token_ids), [], 0
    for st in trace.steps:
        if st.draft_token_ids:
            want = reference.draft(ctx, len(st.draft_token_ids))
            compared += 1
            if want != list(st.draft_token_ids):
                bad.append((st.index, list(st.draft_token_ids), want))
        ctx += list(st.committed_token_ids)
    assert compared >= min_compared, "too few drafting steps to compare"
    return trace, bad


def with_head(dec, method: str, head):
    """A context manager: ``dec`` drafts ``method`` with ``head`` inside the block (the previous head, or none,
    after it)."""
    class _Swap:
        def __enter__(self):
            self.old = dec.heads.get(method)
            dec.heads[method] = head
            return dec

        def __exit__(self, *exc):
            if self.old is None:
                dec.heads.pop(method, None)
            else:
                dec.heads[method] = self.old
    return _Swap()
