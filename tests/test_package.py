"""specviz is a real package: pyproject.toml declares it (its Triton kernels inside, as specviz.kernels) and the
`specviz` command; once `pip install -e .` has run (scripts/setup.sh), imports work from any directory; reading a
trace needs neither torch nor transformers."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_pyproject_declares_the_package_and_its_command():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["name"] == "specviz"
    assert meta["project"]["scripts"]["specviz"] == "specviz.cli:main"
    assert set(meta["tool"]["setuptools"]["packages"]["find"]["include"]) == {"specviz*"}
    assert not (ROOT / "kernels").exists(), "no top-level kernels package: it would shadow PyPI's 'kernels'"
    deps = " ".join(meta["project"]["dependencies"])
    assert "gradio" not in deps and "plotly" not in deps  # the engine installs without the UI stack
    assert "-e ." in (ROOT / "scripts" / "setup.sh").read_text()


def _installed() -> bool:
    """pip installed it into this interpreter's environment (its console script is there)."""
    return Path(sys.executable).with_name("specviz").exists()


@pytest.mark.skipif(not _installed(), reason="specviz is not pip-installed in this environment (scripts/setup.sh "
                                            "installs it)")
def test_imports_and_the_command_work_outside_the_repository(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = ("from specviz import SpecDecoder, Trace; import specviz, specviz.kernels; "
            "print(SpecDecoder.__name__, Trace.__name__)")
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0 and "SpecDecoder Trace" in res.stdout, res.stderr
    command = Path(sys.executable).with_name("specviz")
    res = subprocess.run([str(command), "--help"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and all(c in res.stdout for c in ("app", "generate", "train")), res.stderr


def test_reading_a_trace_imports_neither_torch_nor_transformers():
    """A trace viewer (an uploaded trace, the offline report) needs no model stack: the package's __init__ is lazy."""
    code = ("import sys, specviz, specviz.trace; from specviz import Trace; "
            "heavy = [m for m in ('torch', 'transformers', 'triton') if m in sys.modules]; "
            "assert not heavy, heavy; print(Trace.__name__)")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "Trace" in res.stdout, res.stderr
