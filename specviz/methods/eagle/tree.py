"""Tree drafting with an EAGLE-1 / EAGLE-3 head: EAGLE-2's dynamic tree and static trees.

Sources: Li et al., "EAGLE-2: Faster Inference of Language Models with Dynamic Draft Trees"
(EMNLP 2024, arXiv 2406.16858); ``topK_genrate`` in SafeAILab/EAGLE ``eagle/model/cnets1.py`` /
``cnets.py`` (docs/design/methods.md 3.1); static trees as EAGLE-1's ``choices`` / vLLM's
``speculative_token_tree`` (``EagleProposer.propose_tree``; docs/design/methods.md 1.3, 9).

Both trees come from the same head as the chain (:class:`~specviz.methods.eagle.proposer.EagleProposer`,
whose first pass, observe and committed-cache rule are reused unchanged): after the first pass
over the newly committed (target feature, token) pairs the head's last row (position n-1, the
root x_n) gives log-probabilities of the depth-1 candidates. A level of the tree is then one head
forward over the frontier nodes (depth d) at the ONE position ``n + d - 1`` (every sibling shares
it, docs/design/methods.md 3.4), each row fed its parent's output hidden state with its own token, attending
to the committed prefix plus its own ancestors and itself (never its cousins). Those rows'
K/V go to scratch slots (after the committed length Lc on the eager head runner, past its
max_len on the static one) and are never read by a later step (docs/design/methods.md 1.2): the head's cache
keeps committed positions only.

Dynamic (EAGLE-2, exactly ``topK_genrate``): with K = top_k, D = depth, N = total_tokens
(root included, so N - 1 draft nodes):

1. root: ``topk(log_softmax(head logits at n-1), K)`` -> K depth-1 candidates; score = log q.
2. D times: run the K frontier nodes; each takes its top-K children, score = parent score +
   log q (the path's cumulative log-confidence); all K*K become candidates, the best K the next
   frontier.
3. rerank: the N - 1 best of the K + D*K*K candidates, in candidate order (parents before
   children). The deepest node is at depth D + 1.

Ties are broken by candidate order (a stable sort; ``torch.topk`` leaves them unspecified), so a
child (score <= its parent's, created later) never enters without its parent.

Static: a parsed choice list (:func:`specviz.tree.parse_choices`): the child of rank r of a node is
its r-th most likely token under the head, one forward per depth over the nodes that have children
(one host read per depth for the children's tokens).

Every child is the deterministic top-k of its parent's head distribution: ``Draft.probs`` is None
(q one-hot) and ``tree_rule`` "topk" (docs/design/methods.md 1.4 rule A), at any temperature. ``Draft.scores``
holds each node's cumulative log-confidence (natural log).
"""

from __future__ import annotations

import functools
from typing import Sequence

import torch

from specviz import tree as tree_mod
from specviz.tree import DynamicTree  # noqa: F401 (re-exported)
from specviz.transfer import HostCopy, LazyHostList, to_device
from specviz.proposer import Draft, StepContext
from .proposer import EagleProposer

class EagleTreeProposer(EagleProposer):
    """Tree drafting with an EAGLE / EAGLE-3 head (``name`` = the head's kind, as the chain's).

    Args:
        head: as :class:`EagleProposer`.
        dynamic: a :class:`DynamicTree` (EAGLE-2), or None with ``choices`` given.
        choices: a static tree: vLLM ``speculative_token_tree`` string or a list of child-rank paths
            (:func:`specviz.tree.parse_choices`), or None.
    ``num_speculative_tokens`` is the tree's depth (the most drafts one step can accept); propose's
    ``num_tokens`` caps the depth (deeper nodes are not drafted).
    Raises:
        ValueError: neither or both of dynamic / choices, or invalid choices / knobs.
    """

    def __init__(self, head: torch.nn.Module, dynamic: DynamicTree | None = None,
                 choices: str | Sequence[Sequence[int]] | None = None, runner=None):
        if (dynamic is None) == (choices is None):
            raise ValueError("an EAGLE tree needs exactly one of: the dynamic tree's knobs (eagle_tree_top_k / "
                             "eagle_tree_depth / eagle_tree_total_tokens) or a static speculative_token_tree")
        self.dynamic = dynamic
        self.paths = tree_mod.parse_choices(choices) if choices is not None else None
        depth = dynamic.max_depth if dynamic is not None else max(len(p) for p in self.paths)
        super().__init__(head, depth, runner=runner)
        scratch = getattr(self.runner, "tree_scratch", None)  # rows a step's levels may write (None: no bound)
        rows = dynamic.top_k * dynamic.depth if dynamic is not None else len(self.paths)
        if scratch is not None and rows > scratch:
            raise ValueError(f"this EAGLE tree writes up to {rows} head rows per step (top_k x depth, or the static "
                             f"tree's nodes); the static head runner holds {scratch}: lower eagle_tree_top_k or "
                             "eagle_tree_depth")

    @torch.inference_mode()
    def propose(self, token_ids: Sequence[int], num_tokens: int | None = None,
                context: StepContext | None = None) -> Draft:
        max_depth = self.num_speculative_tokens if num_tokens is None else min(num_tokens, self.num_speculative_tokens)
        n = len(token_ids) - 1  # position of the root x_n
        known = self.committed + len(self._pending_ids)
        if known != n:
            raise RuntimeError(f"{self.name}: the context has {n} committed pairs but the head was told of {known}; "
                               "call observe() after every target forward")
        self._details = self._confidence = None  # the chain's per-position numbers do not apply
        if max_depth <= 0 or n == 0:
            return Draft(token_ids=torch.empty(0, dtype=torch.long), details={"kind": self.name, "tree": "none"})
        first = self._first_pass()
        details = {"kind": self.name, "greedy": (context or StepContext()).temperature <= 0, "root_position": n,
                   "root_token_id": int(token_ids[n]), "taps": list(self.taps), "first_pass": first}
        if self.dynamic is not None:
            return self._dynamic(n, max_depth, details)
        tokens, parents, scores, info = self._static(n, max_depth)
        device = self._last[1].device
        return Draft(token_ids=to_device(torch.tensor(tokens, dtype=torch.long), device), probs=None,
                     details={**details, **info}, parents=parents, scores=scores, tree_rule="topk")

    # ---- one level: a head forward over some tree nodes at one position ---------------------------
    def _level(self, hidden: torch.Tensor, tokens: torch.Tensor, position: int, first: int,
               sees: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the head on R rows (hidden [R, d] = each parent's output, tokens int64 [R]) at ``position``,
        writing scratch rows first..first+R-1; ``sees`` bool [R, first + R]: the scratch rows each row attends
        (its ancestors and itself) besides the committed prefix. Returns (hidden [R, d], log q [R, V] float32)."""
        out, logits = self.runner.tree_level(hidden, tokens, position, self.committed, first, sees)
        return out, torch.log_softmax(logits, dim=-1)

    def _root(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden [1, d], log q [V]) of the head's row at n-1 (the first pass's last row)."""
        hidden, logits = self._last
        return hidden, torch.log_softmax(logits.float(), dim=-1)

    # ---- EAGLE-2 -----------------------------------------------------------------------------------
    def _dynamic(self, n: int, max_depth: int, details: dict) -> Draft:
        """EAGLE-2 (:func:`eagle2_tree`) through the head runner's :meth:`tree_draft`: on the static head
        runner with CUDA graphs the whole tree (root expansion, every level, the rerank) is one graph replay.
        The tree stays on the device (tokens, ``device_parents``); its host copy (parents, scores) is queued
        behind it and read by the engine once the tree's target forward is queued."""
        K, N = self.dynamic.top_k, self.dynamic.total_tokens
        levels = min(self.dynamic.depth, max_depth - 1)  # head forwards after the root's expansion
        hidden, logits = self._last
        fn = functools.partial(eagle2_tree, top_k=K, levels=levels, total_tokens=N)
        packed = self.runner.tree_draft(("eagle2", K, levels, N), fn, hidden, logits.float(), n, self.committed)
        nodes = int(packed.shape[1])
        copy = HostCopy(packed)  # [3, nodes] float64: tokens, parents, scores (ids exact)
        info = {"tree": "dynamic", "top_k": K, "depth": self.dynamic.depth, "total_tokens": N, "levels": levels,
                "num_candidates": K + levels * K * K}
        return Draft(token_ids=packed[0].long(), probs=None, details={**details, **info},
                     parents=LazyHostList(copy, 1, nodes, int), scores=LazyHostList(copy, 2, nodes, float),
                     tree_rule="topk", device_parents=packed[1].long())

    # ---- static ------------------------------------------------------------------------------------
    def _static(self, n: int, max_depth: int):
        paths = [p for p in self.paths if len(p) <= max_depth]
        parents = tree_mod.choices_parents(paths)
        kids = tree_mod.children(parents)
        hidden, logp = self._root()
        tokens, scores = [0] * len(paths), [0.0] * len(paths)
        self._assign([-1], logp[None], paths, kids, tokens, scores)
        outs: dict[int, torch.Tensor] = {}  # node -> head output hidden [d] (nodes with children)
        scratch: list[int] = []  # node of each scratch row written so far
        depth = tree_mod.depths(parents)
        for d in range(1, max(depth, default=0)):
            rows = [i for i in range(len(paths)) if depth[i] == d and kids[i + 1]]
            if not rows:
                break
            h_in = torch.stack([outs[parents[i]] if parents[i] >= 0 else hidden[0] for i in rows])  # [R, d]
            tok = to_device(torch.tensor([tokens[i] for i in rows], dtype=torch.long), hidden.device)  # no host wait
            first = len(scratch)
            scratch.extend(rows)
            sees = torch.tensor([[s in _ancestors_or_self(i, parents) for s in scratch] for i in rows])  # [R, S]
            out, lp = self._level(h_in, tok, n + d - 1, first, to_device(sees, hidden.device))
            outs.update((i, out[r]) for r, i in enumerate(rows))
            self._assign(rows, lp, paths, kids, tokens, scores)
        return tokens, parents, scores, {"tree": "static", "choices": [list(p) for p in paths]}

    @staticmethod
    def _assign(nodes: list[int], logp: torch.Tensor, paths, kids, tokens: list, scores: list) -> None:
        """Give the children of ``nodes`` (-1 = the root) the token of their rank (their path's last entry) in
        their parent's log q (row r of ``logp`` [R, V] for nodes[r]); score = parent score + log q. One host
        read for the whole level."""
        ranks = [paths[c][-1] for i in nodes for c in kids[i + 1]]
        if not ranks:
            return
        top = torch.topk(logp, max(ranks) + 1, dim=-1)  # [R, r_max + 1]
        values, ids = torch.stack([top.values.double(), top.indices.double()]).tolist()  # the level's one read
        for r, i in enumerate(nodes):
            base = scores[i] if i >= 0 else 0.0
            for c in kids[i + 1]:
                rank = paths[c][-1]
                tokens[c], scores[c] = int(ids[r][rank]), base + values[r][rank]

def eagle2_tree(hidden: torch.Tensor, logits: torch.Tensor, level, *, top_k: int, levels: int,
                total_tokens: int) -> torch.Tensor:
    """EAGLE-2's dynamic tree (``topK_genrate``, see the module docstring) as device ops only, so that it
    can be captured as one CUDA graph: the frontier, each frontier node's ancestor rows and every
    candidate's parent stay device tensors.

    hidden [1, d], logits float32 [V]: the head's root row (position n-1). ``level(i, first, h, tokens,
    sees)``: one head forward of the frontier at position n + i writing scratch rows first..first+K-1
    (:meth:`specviz.methods.eagle.runner.StaticHeadRunner.tree_draft`); ``sees`` bool [K, (i+1) K] marks the scratch
    rows of each row's ancestors and itself. Returns float64 [3, total_tokens - 1]: the kept nodes'
    tokens, parents (node index, -1 = the root) and cumulative log-confidences, in candidate order (a parent
    precedes its children)."""
    K, N = top_k, total_tokens
    logp = torch.log_softmax(logits, dim=-1)
    dev = logp.device
    top = torch.topk(logp, K)
    cand_tok, cand_score = [top.indices], [top.values]  # per candidate id, level by level
    cand_parent = [torch.full((K,), -1, dtype=torch.long, device=dev)]  # candidate id of the parent (-1: root)
    frontier = torch.arange(K, device=dev)  # candidate ids of the frontier
    f_tok, f_hidden, f_score = top.indices, hidden.expand(K, -1), top.values  # [K], [K, d], [K]
    anc = torch.zeros(K, 0, dtype=torch.bool, device=dev)  # [K, i*K]: scratch rows of each frontier's ancestors
    eye = torch.eye(K, dtype=torch.bool, device=dev)
    base = K
    for i in range(levels):
        sees = torch.cat([anc, eye], dim=1)  # [K, (i+1)*K]: ancestors and itself
        out, lg = level(i, i * K, f_hidden, f_tok, sees)  # [K, d], [K, V]
        top = torch.topk(torch.log_softmax(lg, dim=-1), K, dim=-1)  # [K, K]
        cu = (top.values + f_score[:, None]).reshape(-1)  # [K*K] cumulative log-confidence
        cand_tok.append(top.indices.reshape(-1))
        cand_score.append(cu)
        cand_parent.append(frontier.repeat_interleave(K))  # child j*K + c of frontier row j
        best = _stable_top(cu, K)  # [K] indices into the K*K
        row = best // K  # the frontier row each new frontier node descends from
        frontier = base + best
        f_tok, f_hidden, f_score = top.indices.reshape(-1)[best], out[row], cu[best]
        anc = sees[row]
        base += K * K
    scores, tokens, parent = torch.cat(cand_score), torch.cat(cand_tok), torch.cat(cand_parent)  # [C]
    keep = torch.sort(_stable_top(scores, min(N - 1, scores.numel()))).values  # rerank, in candidate order
    node_of = torch.full_like(parent, -1)
    node_of[keep] = torch.arange(keep.numel(), device=dev)
    kept_parent = parent[keep]
    parents = torch.where(kept_parent >= 0, node_of[kept_parent.clamp_min(0)], -1)
    return torch.stack([tokens[keep].double(), parents.double(), scores[keep].double()])


def _stable_top(values: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest ``values`` (1-D), ties broken by lower index first."""
    return torch.sort(values, descending=True, stable=True).indices[:k]


def _ancestors_or_self(node: int, parents: Sequence[int]) -> set[int]:
    line = set()
    while node >= 0:
        line.add(node)
        node = parents[node]
    return line
