"""The greedy losslessness badge tells a 16-bit rounding flip from a bug (specviz/compare/lossless.py).

Planted near-tie: the tiny target's LM head is wrapped so that wherever the target's argmax is one chosen token T0
(a token method none emits a few tokens in), a second token B gets exactly T0's logit, plus one ulp in forwards of
more than one row (the verify forward): a 1-row forward and a (k + 1)-row forward then choose different tokens, as
differently ordered bf16 GEMMs do on a GPU. In bf16 the badge must read "≈ equal: bf16 near-tie at token i"; in
float32 the same flip is a bug (✗). Negative control in bf16: a deliberately wrong verifier (every draft accepted)
must stay ✗. The trace must carry the top-2 logits of every committed token.
"""

from __future__ import annotations

import pytest
import torch

from specviz import SpecDecoder
from specviz.compare import RunConfig, losslessness, new_comparison, run_comparison
from specviz.compare.lossless import NEAR_TIE_ULPS, logit_top2_of, near_tie, tie_bound

PROMPT = "def add(a, b):\n    return"
TIE_AT = 3  # 0-based output position of method none's token whose logit gets a planted twin


class PlantedTieHead(torch.nn.Module):
    """``base`` (the LM head), then where a row's argmax is ``t0``: logit[b] = logit[t0] (an exact tie, which
    argmax breaks towards the lower id), moved one ulp of the logits' dtype towards b winning when the forward has
    more than one row, so 1-row and multi-row forwards disagree there and nowhere else."""

    def __init__(self, base: torch.nn.Module, t0: int, b: int):
        super().__init__()
        self.base, self.t0, self.b = base, t0, b
        self.weight = base.weight  # what the decoder reads (vocabulary size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.base(hidden).clone()  # [1, n, V] in the model's dtype
        hit = logits.argmax(-1) == self.t0  # [1, n]
        twin = logits[..., self.t0]
        if logits.shape[1] > 1:  # b above t0: b must win; below: t0 must (the tie already goes to b)
            twin = _one_ulp(twin, up=self.b > self.t0)
        logits[..., self.b] = torch.where(hit, twin, logits[..., self.b])
        return logits


def _one_ulp(x: torch.Tensor, up: bool) -> torch.Tensor:
    """The neighbour of every element of x in x's dtype, towards +inf if ``up`` (bf16: x -+ 2^(floor(log2|x|) - 7),
    exact in bf16)."""
    if x.dtype == torch.float32:
        return torch.nextafter(x, torch.full_like(x, float("inf") if up else float("-inf")))
    ulp = torch.exp2(torch.floor(torch.log2(x.float().abs().clamp_min(2.0 ** -100))) - 7)
    return (x.float() + (ulp if up else -ulp)).to(x.dtype)


def _decoder(tiny_dirs, dtype: str, same_draft: bool = True) -> SpecDecoder:
    target, draft = tiny_dirs["llama"]
    return SpecDecoder.from_pretrained(target, target if same_draft else draft, device="cpu", dtype=dtype)


def _plant(dec: SpecDecoder) -> tuple[int, int]:
    """Wrap dec's target head; returns (T0, B)."""
    none = dec.generate(PROMPT, method="none", max_new_tokens=TIE_AT + 2)
    t0 = none.output_token_ids[TIE_AT]
    b = t0 + 1 if t0 + 1 < dec.vocab_size else t0 - 1
    dec.target_model.lm_head = PlantedTieHead(dec.target_model.lm_head, t0, b)
    return t0, b


def _compare(dec: SpecDecoder, method: str = "draft_model"):
    c = new_comparison([RunConfig(method, 3)], [PROMPT], [0], max_new_tokens=16)
    run_comparison(dec, c)
    return c, next(i for i, cfg in enumerate(c.configs) if cfg.method == method)


def test_tie_bound_is_ulps_of_16_bit_dtypes_only():
    assert tie_bound(20.0, "bfloat16") == NEAR_TIE_ULPS * 0.125  # bf16 ulp at 16 <= |x| < 32 is 2^-3
    assert tie_bound(-20.0, "bfloat16") == tie_bound(20.0, "bfloat16")
    assert tie_bound(0.01, "bfloat16") == NEAR_TIE_ULPS * 2.0 ** -7  # at least the ulp at 1
    assert tie_bound(20.0, "float16") == NEAR_TIE_ULPS * 2.0 ** -6
    assert tie_bound(20.0, "float32") is None and tie_bound(20.0, "") is None


def test_planted_bf16_near_tie_reads_approximately_equal(tiny_dirs):
    dec = _decoder(tiny_dirs, "bfloat16")
    t0, b = _plant(dec)
    c, row = _compare(dec)
    run, base = c.runs_of(row)[0].trace, c.runs_of(0)[0].trace
    assert run.output_token_ids != base.output_token_ids  # the plant made the decoders differ
    tops = logit_top2_of(run)
    assert tops is not None and len(tops) == len(run.output_token_ids)  # every committed token's top-2 recorded
    badge = losslessness(c, row)
    i = next(j for j, (x, y) in enumerate(zip(run.output_token_ids, base.output_token_ids)) if x != y)
    assert i <= TIE_AT and {run.output_token_ids[i], base.output_token_ids[i]} == {t0, b}
    assert badge["badge"].startswith(f"≈ equal: bf16 near-tie at token {i + 1} (gap "), badge
    assert badge["ok"] is True and badge["near_tie"] is True and "GEMM" in badge["detail"]
    tie = near_tie(run, base, i)
    assert tie["near_tie"] and 0 <= min(tie["gap"]) <= max(tie["gap"]) <= tie["bound"]


def test_the_same_flip_in_float32_is_a_bug(tiny_dirs):
    dec = _decoder(tiny_dirs, "float32")
    _plant(dec)
    c, row = _compare(dec)
    assert c.runs_of(row)[0].trace.output_token_ids != c.runs_of(0)[0].trace.output_token_ids
    badge = losslessness(c, row)
    assert badge["badge"].startswith("✗ differs (1/1)") and badge["ok"] is False
    assert "must agree exactly" in badge["detail"]


def test_a_wrong_verifier_stays_a_bug_in_bf16(tiny_dirs, monkeypatch):
    """Negative control: greedy that accepts every draft (a different draft model, so many drafts are wrong)."""
    import specviz.verify.chain as chain

    real = chain.rejection_sample

    def accept_everything(p, q, x, method="standard", **kw):
        if method == "greedy" and x.shape[1]:
            kw.update(synthetic_rates=(1.0,) * x.shape[1], noise=None)
            return real(p, q, x, method="synthetic", **kw)
        return real(p, q, x, method=method, **kw)

    dec = _decoder(tiny_dirs, "bfloat16", same_draft=False)
    monkeypatch.setattr(chain, "rejection_sample", accept_everything)
    c, row = _compare(dec)
    assert c.runs_of(row)[0].trace.output_token_ids != c.runs_of(0)[0].trace.output_token_ids
    badge = losslessness(c, row)
    assert badge["badge"].startswith("✗ differs") and badge["ok"] is False, badge


def test_equal_outputs_and_missing_logits(tiny_dirs):
    dec = _decoder(tiny_dirs, "bfloat16")
    c, row = _compare(dec)
    assert losslessness(c, row)["badge"] == "✓ equal (1/1)"
    run, base = c.runs_of(row)[0].trace, c.runs_of(0)[0].trace
    for st in run.steps:  # a trace without the logits (older, or brief) never reads as a near-tie
        st.logit_top2 = []
    run.output_token_ids = run.output_token_ids[:2] + [(run.output_token_ids[2] + 1) % dec.vocab_size]
    assert not near_tie(run, base, 2)["near_tie"]
    badge = losslessness(c, row)
    assert badge["badge"].startswith("✗ differs") and "no top-2 logits" in badge["detail"]


@pytest.mark.parametrize("dtype", ["bfloat16"])
def test_top2_survive_the_json_round_trip(tiny_dirs, dtype):
    from specviz.trace import Trace

    dec = _decoder(tiny_dirs, dtype)
    tr = dec.generate(PROMPT, method="draft_model", num_speculative_tokens=3, max_new_tokens=8)
    back = Trace.from_json(tr.to_json())
    assert logit_top2_of(back) == logit_top2_of(tr) and all(r[1] >= r[3] for r in logit_top2_of(tr))


def test_fp32_logits_option(tiny_dirs):
    """use_fp32_logits: the head becomes a float32 GEMM (logits not rounded to bf16), the trace says so; it refuses
    once a request has run (captured graphs would keep the old head)."""
    from specviz.precision import Fp32Head, use_fp32_logits

    dec = _decoder(tiny_dirs, "bfloat16")
    use_fp32_logits(dec)
    assert isinstance(dec.target_model.get_output_embeddings(), Fp32Head)
    tr = dec.generate(PROMPT, method="draft_model", num_speculative_tokens=3, max_new_tokens=8)
    assert tr.config["logits_dtype"] == "float32" and tr.config["dtype"] == "bfloat16"
    logits = [v for row in logit_top2_of(tr) for v in (row[1], row[3])]
    assert any(torch.tensor(v).to(torch.bfloat16).float().item() != v for v in logits)  # not bf16 values
    plain = _decoder(tiny_dirs, "bfloat16")
    plain.generate(PROMPT, method="none", max_new_tokens=2)
    with pytest.raises(ValueError, match="before the first request"):
        use_fp32_logits(plain)
