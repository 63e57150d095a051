"""verify="synthetic" through the engine: the rates' message, and what a
forced rejection with an empty residual (Z = 0) records."""

from __future__ import annotations

import pytest

PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a"


@pytest.mark.parametrize("rates, problem", [
    ([1.5, 0.5], "1.5 outside [0, 1]"),
    ([0.8, 0.6], "2 given"),
    ([0.5, 0.6, 0.4, 0.3, 0.2], "a_2 > a_1"),
    ([0.8, 0.6, 0.4, 0.3, -0.1], "-0.1 outside [0, 1]"),
])
def test_bad_synthetic_rates_say_what_a_rate_is(decoders, rates, problem):
    with pytest.raises(ValueError) as info:
        decoders["llama"].generate(PROMPT, method="ngram", verify="synthetic", num_speculative_tokens=5,
                                   synthetic_rates=rates, max_new_tokens=4)
    msg = str(info.value)
    assert problem in msg
    for part in ("unconditional per-position acceptance rates", "[0, 1]", "non-increasing", "k = 5 needs 5"):
        assert part in msg, msg
    assert "shape" not in msg


def test_missing_rates_message(decoders):
    with pytest.raises(ValueError, match="needs synthetic_rates.*non-increasing"):
        decoders["llama"].generate(PROMPT, method="ngram", verify="synthetic", max_new_tokens=4)


def test_forced_rejection_with_empty_residual_is_marked(self_decoders):
    """Greedy identical draft: p_i is one-hot at x_i, so a forced rejection leaves Z = 0; the
    sampler draws from p instead (the token equals the rejected draft) and the trace says so."""
    dec = self_decoders["llama"]
    trace = dec.generate(PROMPT, method="draft_model", verify="synthetic", synthetic_rates=[0.5] * 4,
                         num_speculative_tokens=4, max_new_tokens=30, seed=1)
    rejected = [s for s in trace.steps if s.num_accepted < len(s.draft_token_ids)]
    assert rejected, "no forced rejection in 30 tokens at a = 0.5"
    for s in rejected:
        pos = s.positions[s.num_accepted]
        assert pos.residual_mass == 0.0
        assert s.emitted.kind == "recovered" and s.emitted.residual_empty
        assert s.emitted.token_id == s.draft_token_ids[s.num_accepted]
    assert not any(s.emitted.residual_empty for s in trace.steps if s not in rejected)


def test_ordinary_recovered_tokens_are_not_marked(decoders):
    trace = decoders["llama"].generate(PROMPT, method="draft_model", verify="standard", temperature=1.0,
                                       num_speculative_tokens=3, max_new_tokens=24, seed=0)
    recovered = [s for s in trace.steps if s.emitted.kind == "recovered"]
    assert recovered and not any(s.emitted.residual_empty for s in recovered)
    assert all(s.positions[s.num_accepted].residual_mass > 0 for s in recovered)


def test_a_forced_rejection_from_p_shows_no_residual_view(self_decoders):
    """Where synthetic verification forced a rejection with Z = 0, the decision panel does not ask "where did the
    recovered token come from?" nor draw an empty residual: it says what synthetic verification did (drew from p)."""
    import re

    from specviz.viz.residual import SYNTHETIC_FROM_P, residual_figure

    dec = self_decoders["llama"]
    trace = dec.generate(PROMPT, method="draft_model", verify="synthetic", synthetic_rates=[0.5] * 4,
                         num_speculative_tokens=4, max_new_tokens=30, seed=1)
    st = next(s for s in trace.steps if s.num_accepted < len(s.draft_token_ids))
    fig = residual_figure(trace, st.index, st.num_accepted + 1)
    caption = " ".join(re.sub(r"<[^>]+>", " ", a.text) for a in fig.layout.annotations if a.name == "caption")
    caption = " ".join(caption.split())
    assert "where did the recovered" not in caption and "Synthetic verification rejected" in caption
    assert "came from the target's p" in caption and " ".join(SYNTHETIC_FROM_P.split()[:6]) in caption
    assert not any(b.name and b.name.startswith("residual") for b in fig.data if b.type == "bar")
    assert {"target p", "draft q"} <= {b.name for b in fig.data if b.type == "bar"}
