"""Run kernel tests compiled (CUDA, in-process) or under the Triton interpreter (CPU, subprocess).

Why a subprocess: ``@triton.jit`` reads TRITON_INTERPRET when a kernel is decorated, and
triton's own ``triton.language`` helpers (``tl.max``, ``tl.sum``, ...) are decorated when triton
is first imported. So a process runs either interpreted or compiled kernels, fixed at triton's
first import, and switching a shared pytest process to the interpreter would leak into every
other test (torch.compile, the sm_90 compile checks). The kernel test modules therefore run
their CPU variants in a child pytest with TRITON_INTERPRET=1, through :func:`run_interpreted`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parent.parent  # the checkout (tests/ is one level down)


def interpreted() -> bool:
    """True when this process was started with TRITON_INTERPRET=1 (kernels run on CPU)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def run_interpreted(test_file: str, select: str = "cpu", timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``pytest test_file -k select`` in a child process with TRITON_INTERPRET=1.

    Returns the CompletedProcess (stdout and stderr merged in ``stdout``). Raises
    subprocess.TimeoutExpired after ``timeout`` seconds.
    """
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "pytest", test_file, "-q", "-p", "no:cacheprovider", "-k", select, "-o", "addopts="]
    return subprocess.run(
        cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout
    )


def check_interpreted_run(proc: subprocess.CompletedProcess) -> None:
    """Raise AssertionError (with the child's output) unless the child pytest passed at least one
    test and failed none."""
    tail = proc.stdout[-6000:]
    assert proc.returncode == 0, f"interpreter tests failed (rc={proc.returncode}):\n{tail}"
    assert " passed" in proc.stdout and " failed" not in proc.stdout, f"no interpreter test passed:\n{tail}"


# the device parameter of kernel tests: "cpu" runs only in the interpreter's child process, "cuda" only compiled
DEVICES = [
    pytest.param("cpu", marks=pytest.mark.skipif(not interpreted(), reason="runs in test_interpreter_subprocess")),
    pytest.param("cuda", marks=[pytest.mark.gpu,
                                pytest.mark.skipif(interpreted(), reason="the interpreter runs on the CPU")]),
]


def interpreter_subprocess(test_file: str) -> None:
    """A kernel test file's ``test_interpreter_subprocess``: run its "cpu" cases under the interpreter in a child
    process (skipped inside that child, and where a GPU runs the compiled kernels instead)."""
    if interpreted():
        pytest.skip("this is the interpreter process")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the compiled kernels are tested instead")
    check_interpreted_run(run_interpreted(test_file, "cpu"))
