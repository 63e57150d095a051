"""The reference tree verifier (specviz/sampling/tree.py) is lossless: chi-square per output position.

docs/design/methods.md 11.4: a synthetic target p(. | prefix) over a small vocabulary, a deterministic function
of the prefix, and a synthetic draft q likewise. For rule A (top-k children, q one-hot) and rule B
(children drawn i.i.d. from q) one verification step runs TRIALS times with fresh noise; each
output stream is continued by plain sampling from p to 3 tokens (so every trial has 3), and
position j's token, conditioned on the tokens before it, must follow p(. | those tokens):
position 1 against p(. | root), position 2 for the most frequent first tokens, position 3 for the
most frequent pairs. p-values from scipy.stats, Bonferroni over the family (tests/stats_helpers.py).
The negative control (the classic bug, docs/design/methods.md 1.4): top-k children verified with rule B using
the draft softmax as q must fail the same test.
"""

from __future__ import annotations

import collections
import functools
import zlib

import numpy as np
import pytest
import torch

from specviz import tree as T
from specviz.sampling.tree import verify_tree
from stats_helpers import chi_square, threshold

V = 12
TRIALS = 6000
CHOICES = [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 1, 0)]
PATHS = T.parse_choices(CHOICES)
PARENTS = T.choices_parents(PATHS)
N_FIRST, N_PAIRS = 3, 2  # conditional tests at positions 2 and 3


@functools.lru_cache(maxsize=None)
def _dist(prefix: tuple[int, ...], salt: int, scale: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(zlib.crc32(bytes([salt, *prefix])))
    return torch.softmax(torch.randn(V, generator=g, dtype=torch.float64) * scale, -1).float()


def p_of(prefix):  # the target
    return _dist(prefix, 1, 1.3)


@functools.lru_cache(maxsize=None)
def q_of(prefix):  # the draft: correlated with p, not equal
    return torch.softmax(torch.log(p_of(prefix)) + 0.8 * torch.log(_dist(prefix, 2, 1.0)), -1)


def topk_tree() -> tuple[list[int], torch.Tensor]:
    """Deterministic children: path (r1, .., rd) = rank r_j of q at the parent's prefix."""
    tokens: list[int] = []
    for path in PATHS:
        prefix = tuple(tokens[PATHS.index(path[:j])] for j in range(1, len(path)))
        tokens.append(int(torch.argsort(q_of(prefix), descending=True, stable=True)[path[-1]]))
    return tokens, torch.stack([p_of(tuple(tokens[c] for c in T.path_to(PARENTS, i))) for i in range(-1, len(PATHS))])


def sampled_tree(g: torch.Generator):
    """Children drawn i.i.d. from the parent's q; returns tokens, p [1 + N, V], q [N, V]."""
    tokens, qs = [], []
    for i, par in enumerate(PARENTS):
        prefix = tuple(tokens[c] for c in T.path_to(PARENTS, par))
        q = q_of(prefix)
        tokens.append(int(torch.multinomial(q, 1, generator=g)))
        qs.append(q)
    p = torch.stack([p_of(tuple(tokens[c] for c in T.path_to(PARENTS, i))) for i in range(-1, len(PATHS))])
    return tokens, p, torch.stack(qs)


def continue_to(out: list[int], g: torch.Generator, length: int = 3) -> tuple[int, ...]:
    out = list(out)
    while len(out) < length:  # inverse-CDF draw from p(. | out)
        cdf = _cdf(tuple(out))
        out.append(min(int(np.searchsorted(cdf, float(torch.rand((), generator=g, dtype=torch.float64)), "right")),
                       V - 1))
    return tuple(out[:length])


@functools.lru_cache(maxsize=None)
def _cdf(prefix):
    return np.cumsum(p_of(prefix).double().numpy())


def run(mode: str, seed: int = 0) -> list[tuple[int, ...]]:
    g = torch.Generator().manual_seed(seed)
    fixed = topk_tree()
    softmax_q = torch.stack([q_of(tuple(fixed[0][c] for c in T.path_to(PARENTS, par))) for par in PARENTS])
    streams = []
    for _ in range(TRIALS):
        if mode == "sampled":
            tokens, p, q = sampled_tree(g)
            out = verify_tree(p, torch.tensor(tokens), PARENTS, q, rule="sampled", generator=g)
        else:
            tokens, p = fixed
            q = softmax_q if mode == "bug_softmax_q" else None  # the bug: top-k children verified as if sampled
            out = verify_tree(p, torch.tensor(tokens), PARENTS, q, rule="topk" if q is None else "sampled",
                              generator=g)
        streams.append(continue_to(out.output_token_ids, g))
    return streams


def pvalues(streams: list[tuple[int, ...]]) -> list[tuple[str, float]]:
    """p-values of position 1, position 2 | the N_FIRST most frequent first tokens, position 3 |
    the N_PAIRS most frequent pairs."""
    out = []
    first = collections.Counter(s[0] for s in streams)
    out.append(("pos1", chi_square(np.bincount([s[0] for s in streams], minlength=V), p_of(()).numpy())[2]))
    for t, _ in first.most_common(N_FIRST):
        seconds = [s[1] for s in streams if s[0] == t]
        out.append((f"pos2|{t}", chi_square(np.bincount(seconds, minlength=V), p_of((t,)).numpy())[2]))
    pairs = collections.Counter(s[:2] for s in streams)
    for pair, _ in pairs.most_common(N_PAIRS):
        thirds = [s[2] for s in streams if s[:2] == pair]
        out.append((f"pos3|{pair}", chi_square(np.bincount(thirds, minlength=V), p_of(pair).numpy())[2]))
    return out


FAMILY = 2 * (1 + N_FIRST + N_PAIRS)  # two rules x positions


@pytest.mark.parametrize("mode", ["topk", "sampled"])
def test_tree_rules_are_lossless(mode):
    streams = run(mode)
    bad = [(name, pv) for name, pv in pvalues(streams) if pv < threshold(FAMILY)]
    assert not bad, f"rule {mode}: positions whose tokens do not follow p: {bad}"


def test_rule_a_reaches_depth():
    """The test means something: rule A accepts deep paths often (the tree is exercised)."""
    tokens, p = topk_tree()
    g = torch.Generator().manual_seed(5)
    depths = collections.Counter(len(verify_tree(p, torch.tensor(tokens), PARENTS, generator=g).path)
                                 for _ in range(2000))
    assert depths[1] > 200 and depths[2] > 100, depths


def test_negative_control_softmax_q_for_topk_children_fails():
    """Rule B with the draft softmax as q on deterministic top-k children is not lossless: detected."""
    pv = pvalues(run("bug_softmax_q"))
    assert min(v for _, v in pv) < threshold(FAMILY), pv


def test_greedy_follows_argmax():
    tokens, p = topk_tree()
    out = verify_tree(p, torch.tensor(tokens), PARENTS, rule="greedy")
    want, node = [], -1
    kids = T.children(PARENTS)
    while True:
        y = int(p[node + 1].argmax())
        want.append(y)
        nxt = [c for c in kids[node + 1] if tokens[c] == y]
        if not nxt:
            break
        node = nxt[0]
    assert out.output_token_ids == want
    assert out.kind == ("bonus" if not kids[node + 1] else "recovered")
    assert all(out.fate[c] == "accepted" for c in out.path)


def test_rule_a_residual_removes_every_rejected_child():
    """Hand case: root children tokens 0 and 1 both rejected -> emitted from p with 0, 1 removed."""
    p = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.25] * 4, [0.25] * 4])
    u = torch.tensor([[0.9, 0.99]], dtype=torch.float64)  # 0.9 > 0.5; 0.99 > 0.3 / 0.5 = 0.6
    from specviz.sampling.types import SamplerNoise

    noise = SamplerNoise(u=u, exp=torch.ones(1, 4))
    out = verify_tree(p, torch.tensor([0, 1]), [-1, -1], rule="topk", noise=noise)
    assert out.path == [] and out.fate == ["rejected", "rejected"] and out.token_id == 2
    assert out.accept_prob.tolist() == pytest.approx([0.5, 0.6])
    assert out.emit_weights.tolist() == pytest.approx([0.0, 0.0, 0.2, 0.0])
    noise = SamplerNoise(u=torch.tensor([[0.9, 0.59]], dtype=torch.float64), exp=torch.ones(1, 4))
    out = verify_tree(p, torch.tensor([0, 1]), [-1, -1], rule="topk", noise=noise)
    assert out.path == [1] and out.fate == ["rejected", "accepted"] and out.kind == "bonus"


def test_invalid_inputs_raise():
    p = torch.full((3, 4), 0.25)
    with pytest.raises(ValueError, match="unknown tree rule 'block'.*chain-only"):
        verify_tree(p, torch.tensor([0, 1]), [-1, -1], rule="block")
    with pytest.raises(ValueError, match="needs draft_probs"):
        verify_tree(p, torch.tensor([0, 1]), [-1, -1], rule="sampled")
    with pytest.raises(ValueError, match="one-hot"):
        verify_tree(p, torch.tensor([0, 1]), [-1, -1], torch.full((2, 4), 0.25), rule="topk")
    with pytest.raises(ValueError, match=r"\[1 \+ N, V\]"):
        verify_tree(p, torch.tensor([0]), [-1], rule="topk")
    out = verify_tree(p, torch.tensor([7, -3]), [-1, -1], rule="topk", generator=torch.Generator().manual_seed(0))
    assert out.path == [] and out.accept_prob.tolist() == [0.0, 0.0]  # ids outside [0, V): never accepted


def test_a_tree_queued_from_device_parents_is_refused_at_the_walk_if_invalid():
    """Device parents (an EAGLE-2 tree) are validated when the walk reads their host copy: an invalid tree gives a
    ValueError there (its device indices are clamped, so nothing reads out of range first); valid ones give the
    host-parents result."""
    from specviz.sampling.tree import queue_verify_tree, verify_tree

    torch.manual_seed(0)
    p = torch.softmax(torch.randn(4, 11), dim=-1)
    ids = torch.tensor([3, 5, 7])
    parents = [-1, 0, 0]
    want = verify_tree(p, ids, parents, rule="greedy")
    got = queue_verify_tree(p, ids, torch.tensor(parents), rule="greedy").finish(parents)
    assert (got.path, got.output_token_ids, got.fate) == (want.path, want.output_token_ids, want.fate)
    bad = queue_verify_tree(p, ids, torch.tensor([-1, 5, 0]), rule="greedy")
    with pytest.raises(ValueError):
        bad.finish([-1, 5, 0])
    with pytest.raises(ValueError, match="nodes"):
        queue_verify_tree(p, ids, torch.tensor(parents), rule="greedy").finish([-1, 0])
