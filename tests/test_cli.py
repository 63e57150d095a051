"""The CLI prints a coloured run and writes a trace that loads back."""

from __future__ import annotations

import subprocess
import sys

from specviz import Trace
from specviz.cli import main

PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a"


def test_cli_generate_prints_colours_and_writes_trace(tiny_dirs, tmp_path, capsys):
    target, draft = tiny_dirs["llama"]
    out = tmp_path / "trace.json"
    code = main(["generate", "--target", str(target), "--draft", str(target), "--method", "draft_model",
                 "-k", "3", "--prompt", PROMPT, "--max-new-tokens", "12", "--device", "cpu", "--trace", str(out),
                 "--color"])
    text = capsys.readouterr().out
    assert code == 0
    assert "\033[36m" in text  # bonus tokens (the draft is the target: every draft accepted)
    assert "\033[32m" in text  # accepted tokens
    assert "mean acceptance length" in text
    trace = Trace.from_json(out.read_text())
    assert len(trace.output_token_ids) == 12 or trace.stop_reason == "eos"


def test_cli_reports_bad_input_without_traceback(tiny_dirs, capsys):
    target, _ = tiny_dirs["llama"]
    code = main(["generate", "--target", str(target), "--prompt", "", "--device", "cpu"])
    assert code == 2
    assert "prompt is empty" in capsys.readouterr().err


def test_cli_module_entry_point(tiny_dirs):
    target, _ = tiny_dirs["llama"]
    res = subprocess.run([sys.executable, "-m", "specviz", "generate", "--target", str(target), "--method", "none",
                          "--prompt", "x = 1", "--max-new-tokens", "3", "--device", "cpu", "--no-color"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "steps 3" in res.stdout


def test_cli_plain_when_not_a_terminal(tiny_dirs, capsys):
    target, _ = tiny_dirs["llama"]
    code = main(["generate", "--target", str(target), "--draft", str(target), "--method", "draft_model",
                 "--prompt", PROMPT, "--max-new-tokens", "6", "--device", "cpu"])
    out = capsys.readouterr().out
    assert code == 0 and "\033[" not in out  # captured stdout is not a tty: no escape codes
    assert "mean acceptance length" in out


def test_cli_steps_prints_text_not_token_ids(tiny_dirs, capsys):
    target, _ = tiny_dirs["llama"]
    code = main(["generate", "--target", str(target), "--draft", str(target), "--method", "draft_model", "-k", "3",
                 "--prompt", PROMPT, "--max-new-tokens", "8", "--device", "cpu", "--steps"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("step ")]
    assert code == 0 and lines
    # every step names what was drafted and emitted as quoted text, e.g. "drafted 3 ' a +' · accepted 3 ..."
    import re

    for line in lines:
        assert re.fullmatch(r"step \d+: (drafted \d+ '.*' · accepted \d+ '.*' · |no draft · )"
                            r"(accepted|recovered|bonus|target) '.*'", line), line
        assert "token " not in line  # the old format printed "token <id>"


def test_cli_steps_of_a_tree_print_the_accepted_path(tmp_path, capsys):
    """A tree step's accepted tokens are its path's nodes (the trace's row), not the tree's first nodes."""
    import json

    from specviz.models import load_tokenizer
    from specviz.loading import DEFAULT_TARGET

    trace_file = tmp_path / "t.json"
    code = main(["generate", "--method", "eagle3", "-k", "7", "--tree", "4,6,32", "--prompt",
                 "class LlamaMLP(nn.Module):\n    def __init__(self, config):\n", "--max-new-tokens", "16",
                 "--device", "cpu", "--steps", "--trace", str(trace_file)])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("step ")]
    steps = json.loads(trace_file.read_text())["steps"]
    tok = load_tokenizer(DEFAULT_TARGET)
    assert code == 0 and len(lines) == len(steps)
    for line, step in zip(lines, steps):
        path = step["draft_token_ids"][: step["num_accepted"]]
        assert f"accepted {step['num_accepted']} along a path {tok.decode(path)!r}" in line, (line, step)


def test_cli_plain_output_explains_its_marks(tiny_dirs, capsys):
    target, draft = tiny_dirs["llama"]  # a different draft: some drafts are rejected
    code = main(["generate", "--target", str(target), "--draft", str(draft), "--method", "draft_model",
                 "--prompt", PROMPT, "--max-new-tokens", "12", "--device", "cpu", "--no-color"])
    out = capsys.readouterr().out
    assert code == 0 and "[-" in out  # rejected drafts are marked ...
    assert "legend: [-x-] = a draft token the target rejected" in out  # ... and the marks explained


def test_cli_has_app_generate_and_train_commands(capsys):
    import pytest

    with pytest.raises(SystemExit):
        main(["--help"])
    helptext = capsys.readouterr().out
    assert all(name in helptext for name in ("app", "generate", "train"))
    with pytest.raises(SystemExit):
        main(["app", "--help"])
    assert "--no-warm-up" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    assert "--preset" in capsys.readouterr().out
