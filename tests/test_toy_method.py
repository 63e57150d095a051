"""A method registered from outside specviz (tests/toy_method: repeat_last, three small files) is a full citizen:
the engine runs it (greedy = plain greedy), its trace details are checked on upload, the CLI takes its name and
option (also when loaded through $SPECVIZ_METHODS), the app's Run tab shows it with its option and runs it, Compare
runs it beside the others, and the lesson tells its step. Nothing under specviz/ names it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from specviz import SpecDecoder, methods
from specviz.trace import Trace

import toy_method

TESTS = Path(__file__).parent
PROMPT = "a b a b a b"


@pytest.fixture()
def toy():
    methods.register(toy_method.METHOD)
    yield toy_method.METHOD
    methods.unregister(toy_method.METHOD.name)


@pytest.fixture(scope="module")
def target(tiny_dirs):
    return tiny_dirs["llama"][0]


def test_nothing_in_the_package_names_it():
    package = TESTS.parent / "specviz"
    assert not [p for p in package.rglob("*.py") if "repeat_last" in p.read_text()]


def test_the_engine_runs_it_and_greedy_stays_exact(toy, target):
    dec = SpecDecoder.from_pretrained(target, device="cpu", dtype="float32")
    want = dec.generate(PROMPT, method="none", max_new_tokens=12).output_token_ids
    got = dec.generate(PROMPT, method="repeat_last", repeat_lag=2, num_speculative_tokens=3, max_new_tokens=12)
    assert got.output_token_ids == want
    drafted = [s for s in got.steps if s.draft_token_ids]
    assert drafted and drafted[0].match["repeat_lag"] == 2 and len(drafted[0].match["copied_from"]) == 3
    assert got.config["method"] == "repeat_last"
    back = Trace.from_json(got.to_json())  # its details pass the upload check (its details_schema)
    assert back.steps[0].match == got.steps[0].match
    bad = got.to_dict()
    bad["steps"][0]["match"]["copied_from"] = "everywhere"
    with pytest.raises(ValueError, match="copied_from"):
        Trace.from_dict(bad)


def test_unknown_options_of_a_registered_method_are_refused(toy, target):
    dec = SpecDecoder.from_pretrained(target, device="cpu", dtype="float32")
    with pytest.raises((ValueError, TypeError), match="repeat_lag"):
        dec.generate(PROMPT, method="repeat_last", repeat_lag=0, max_new_tokens=4)


def test_the_cli_finds_it_through_the_environment(target):
    env = {**os.environ, "SPECVIZ_METHODS": "toy_method", "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent)])}
    out = subprocess.run([sys.executable, "-m", "specviz", "generate", "--target", str(target), "--prompt", PROMPT,
                          "--method", "repeat_last", "--repeat-lag", "2", "-k", "3", "--max-new-tokens", "6",
                          "--device", "cpu", "--dtype", "float32", "--no-color"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert re.search(r"draft tokens [1-9]", out.stdout), out.stdout  # it ran and drafted
    broken = subprocess.run([sys.executable, "-m", "specviz", "generate", "--help"], capture_output=True, text=True,
                            env={**env, "SPECVIZ_METHODS": "no_such_plugin"}, timeout=300)
    assert broken.returncode != 0 and "specviz method plugin 'no_such_plugin' did not load" in broken.stderr


def test_the_app_shows_and_runs_it(toy, tiny_dirs):
    import gradio as gr

    from specviz.ui import build_app
    from specviz.ui.cache import DecoderCache, StopSignals
    from specviz.ui.handlers import SessionHandlers
    from specviz.ui.outputs import new_state
    from specviz.ui.run import RunRequest, option_controls

    target, draft = tiny_dirs["llama"]
    cache = DecoderCache(str(target), str(draft), "cpu")
    demo = build_app(str(target), str(draft), "cpu", cache=cache)
    radios = [b for b in demo.blocks.values() if isinstance(b, gr.Radio) and b.label == "Method (proposer)"]
    assert radios and "repeat_last" in [c[0] for c in radios[0].choices]
    assert [b for b in demo.blocks.values() if isinstance(b, gr.Slider) and b.label == "repeat lag"]
    assert "repeat_lag" in option_controls()
    request = RunRequest(prompt=PROMPT, method="repeat_last", num_speculative_tokens=3, max_new_tokens=8,
                         compare=False)
    values = [getattr(request, f) for f in RunRequest.__dataclass_fields__ if f != "options"]
    options = {name: 1 for name in option_controls()} | {"repeat_lag": 2}
    outs = list(SessionHandlers(cache, StopSignals()).run(new_state(), None, *values,
                                                          *(options[n] for n in option_controls())))
    assert outs[-1][0].startswith("**done**"), outs[-1][0]


def test_compare_and_the_lesson_take_it(toy, target):
    from specviz.compare import new_comparison, run_comparison
    from specviz.compare.model import Prompt
    from specviz.ui.compare_config import build_configs, methods as compare_methods
    from specviz.viz.lesson import chapter_html, lesson_chapters

    assert "repeat_last" in compare_methods()
    dec = SpecDecoder.from_pretrained(target, device="cpu", dtype="float32")
    c = new_comparison(build_configs(["repeat_last"], "3", ["auto"], "0"), [Prompt("ab", PROMPT)], [0], 8)
    run_comparison(dec, c)
    rows = {c.configs[r.config].method: r for r in c.runs}
    assert set(rows) == {"none", "repeat_last"}
    assert rows["repeat_last"].trace.output_token_ids == rows["none"].trace.output_token_ids
    trace = dec.generate(PROMPT, method="repeat_last", num_speculative_tokens=3, max_new_tokens=8)
    chapters = lesson_chapters(trace)
    assert toy_method.METHOD.texts.lesson in chapter_html(chapters, 0)
    assert any("The rule copied positions" in chapter_html(chapters, i) for i in range(len(chapters)))


def test_a_details_schema_out_of_notation_is_refused_at_registration():
    import dataclasses

    with pytest.raises(TypeError, match="copied_from"):
        methods.register(dataclasses.replace(toy_method.METHOD, name="bad", details_schema={"copied_from": ["int"]}))
    assert "bad" not in methods.names()
