"""The step record follows the sampler's rule for invalid drafts: a draft id
outside [0, V) (or a non-finite q row) is never accepted and its residual is p_i; building the
record used to raise "index out of bounds" in its own scatter."""

from __future__ import annotations

import pytest
import torch

from specviz.record import gather_core, gather_detail, host_record, pack, unpack
from specviz.sampling import rejection_sample

V, K = 12, 2


def _record(method, full_q, ids):
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(K + 1, V, generator=g), -1)
    q = torch.softmax(torch.randn(K, V, generator=g), -1) if full_q else None
    x = torch.tensor(ids)
    out = rejection_sample(p[None], None if q is None else q[None], x[None], method=method, generator=g)
    flat, layout = pack({**gather_core(out, x), **gather_detail(out, p, q, x)})
    return p, host_record(unpack(flat.tolist(), layout), ids, method, "reference"), out


@pytest.mark.parametrize("method", ("standard", "block"))
@pytest.mark.parametrize("full_q", (True, False))
@pytest.mark.parametrize("bad", (V + 3, -5))
def test_invalid_first_draft_is_rejected_and_recorded(method, full_q, bad):
    p, rec, out = _record(method, full_q, [bad, 1])
    assert rec["num_accepted"] == 0 and rec["emitted"]["kind"] == "recovered"
    assert rec["positions"][0]["accept_prob"] == 0.0
    # the residual at an invalid slot is p_1 itself: the record's emitted distribution is p_1's top
    want = torch.topk(p[0], 12)
    got = rec["emitted"]["top"]
    assert [int(t) for t, _ in got] == want.indices.tolist()
    assert [v for _, v in got] == pytest.approx(want.values.tolist(), rel=1e-5)
    assert rec["emitted"]["token_id"] == int(out.output_token_ids[0, 0])
    assert not rec["emitted"]["residual_empty"]
