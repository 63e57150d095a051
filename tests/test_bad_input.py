"""Bad input gets a ValueError whose message says what to change; nothing is left broken."""

from __future__ import annotations

import pytest

from specviz import SpecDecoder
from specviz.models import ModelLoadError

PROMPT = "def f(x):\n    return x"

CASES = [
    (dict(prompt=""), "prompt is empty"),
    (dict(prompt="   \n"), "prompt is empty"),
    (dict(prompt=[]), "prompt is empty"),
    (dict(prompt=[10**6]), "prompt token ids"),
    (dict(num_speculative_tokens=0), "num_speculative_tokens must be between 1"),
    (dict(num_speculative_tokens=-3), "num_speculative_tokens must be between 1"),
    (dict(num_speculative_tokens=1000), "num_speculative_tokens must be between 1"),
    (dict(temperature=-0.5, verify="standard"), "temperature must be"),
    (dict(temperature=0.7, top_p=0.0), "top_p must be"),
    (dict(temperature=0.7, top_p=1.5), "top_p must be"),
    (dict(temperature=0.7, top_k=-1), "top_k must be"),
    (dict(method="medusa-ish"), "unknown method"),
    (dict(verify="maybe"), "unknown verification"),
    (dict(temperature=0.7, verify="greedy"), "needs temperature 0"),
    (dict(verify="synthetic"), "needs synthetic_rates"),
    (dict(max_new_tokens=0), "max_new_tokens must be"),
    (dict(max_new_tokens=10_000), "exceeds the model's context"),
    (dict(no_such_setting=1), "unknown generate"),
]


@pytest.mark.parametrize("kwargs,message", CASES)
def test_bad_settings_raise_value_error(decoders, kwargs, message):
    dec = decoders["llama"]
    kwargs = dict(kwargs)
    prompt = kwargs.pop("prompt", PROMPT)
    kwargs.setdefault("method", "ngram")
    with pytest.raises(ValueError, match=message):
        dec.generate(prompt, **kwargs)
    # the decoder still works afterwards
    assert dec.generate(PROMPT, method="ngram", max_new_tokens=3).output_token_ids


def test_draft_model_method_without_draft(tiny_dirs):
    target, _ = tiny_dirs["llama"]
    dec = SpecDecoder.from_pretrained(target, device="cpu", dtype="float32")
    with pytest.raises(ValueError, match="needs a draft model"):
        dec.generate(PROMPT, method="draft_model")


def test_missing_model_is_a_clear_error(tmp_path):
    with pytest.raises(ModelLoadError, match="no such directory"):
        SpecDecoder.from_pretrained(str(tmp_path / "nope"), device="cpu")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="could not load model"):
        SpecDecoder.from_pretrained(str(tmp_path / "empty"), device="cpu")


def test_bad_device_and_dtype(tiny_dirs):
    target, _ = tiny_dirs["llama"]
    with pytest.raises(ValueError, match="dtype"):
        SpecDecoder.from_pretrained(target, device="cpu", dtype="float8")
