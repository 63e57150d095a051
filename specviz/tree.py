"""Draft trees: the one draft shape every proposer returns (a chain is the tree whose parents are i - 1).

Convention (methods.md 1.3, with the root left implicit): the root is the last committed token
x_n (already a target sample, always kept); draft nodes are 0..N-1 with ``parents[i] < i`` and
``parents[i] == -1`` for a child of the root; ``depth[i] = depth[parents[i]] + 1`` (depth 1 for a
root child). Node i is verified at position ``n + depth[i]`` and attends to every committed
position plus its own ancestors (the ancestor mask). Siblings hold distinct tokens.

Static trees come as "choices": paths of child ranks, e.g. ``[(0,), (1,), (0, 0)]`` = the top-1
and top-2 candidates at depth 1 and the top-1 child of the first; vLLM's
``speculative_token_tree`` is ``str()`` of such a list of tuples, sorted by ``(len(t), t)``
(``SpeculativeConfig.__post_init__``); Medusa's ``medusa_choices`` and EAGLE's ``choices.py``
use lists of lists. Sources: Medusa ``generate_medusa_buffers``, vLLM ``tree_attn.py``.
"""

from __future__ import annotations

import ast
from typing import Sequence

import torch

MAX_TREE_NODES = 64


def chain_parents(n: int) -> list[int]:
    """Parents of a chain of ``n`` drafts: [-1, 0, 1, ..., n - 2]."""
    return list(range(-1, n - 1))


def is_chain(parents: Sequence[int]) -> bool:
    """True when ``parents`` describe a chain (node i's parent is i - 1)."""
    return all(int(p) == i - 1 for i, p in enumerate(parents))


def validate_parents(parents: Sequence[int]) -> list[int]:
    """Check a parent list (ints, ``-1 <= parents[i] < i``); returns it as a list of ints.

    Raises ValueError saying which node is wrong."""
    out = [int(p) for p in parents]
    for i, p in enumerate(out):
        if not -1 <= p < i:
            raise ValueError(f"tree node {i} has parent {p}; a parent must be -1 (the root) or an earlier node (< {i})")
    return out


def depths(parents: Sequence[int]) -> list[int]:
    """Depth of every node (1 for a child of the root)."""
    d: list[int] = []
    for p in parents:
        d.append(1 if p < 0 else d[p] + 1)
    return d


def ancestor_mask(parents: Sequence[int]) -> torch.Tensor:
    """bool [N, N]: ``M[i, j]`` iff j is i or an ancestor of i (the root excluded)."""
    n = len(parents)
    m = torch.eye(n, dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            m[i] |= m[p]
    return m


def ancestor_mask_device(parents: torch.Tensor) -> torch.Tensor:
    """:func:`ancestor_mask` from parents int64 [N] on the device (each in -1..N-1), by device ops only: pointer
    doubling, ceil(log2 N) boolean matrix products (no host read, so it runs inside a CUDA graph). bool [N, N]."""
    N = int(parents.numel())
    idx = torch.arange(N, device=parents.device)
    anc = (parents[:, None] == idx[None, :]) | (idx[:, None] == idx[None, :])  # [N, N]: parent or itself
    for _ in range(max(1, (N - 1).bit_length())):
        anc = anc | ((anc.float() @ anc.float()) > 0)
    return anc


def path_to(parents: Sequence[int], node: int) -> list[int]:
    """Node indices from the root's child down to ``node`` (inclusive); [] for node -1 (the root)."""
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def children(parents: Sequence[int]) -> list[list[int]]:
    """children[u + 1] = the children of node u in node order (index 0: the root's children)."""
    out: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for i, p in enumerate(parents):
        out[p + 1].append(i)
    return out


def parse_choices(choices: str | Sequence[Sequence[int]], max_depth: int | None = None,
                  max_rank: int | None = None) -> list[tuple[int, ...]]:
    """A static tree's paths, sorted by (len, path) as vLLM sorts ``speculative_token_tree``.

    choices: vLLM's string (``"[(0,), (1,), (0, 0)]"``, read with :func:`ast.literal_eval`,
    never eval) or a list of paths (Medusa / EAGLE lists of lists). max_depth: the most drafts
    on one path (e.g. the number of Medusa heads); max_rank: the candidates per node (top-k).
    Raises ValueError for malformed text, an empty tree, a negative or too-large rank, a path
    deeper than ``max_depth``, a duplicate path, a path whose parent path is missing, or more
    than :data:`MAX_TREE_NODES` nodes.
    """
    if isinstance(choices, str):
        try:
            value = ast.literal_eval(choices.strip())
        except (ValueError, SyntaxError) as exc:
            raise ValueError(f"speculative_token_tree {choices!r} is not a list of tuples like "
                             f"\"[(0,), (1,), (0, 0)]\": {exc}") from None
    else:
        value = choices
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError("a static tree needs at least one path, e.g. \"[(0,), (0, 0)]\"")
    paths: list[tuple[int, ...]] = []
    for raw in value:
        if isinstance(raw, int):
            raw = (raw,)
        if not isinstance(raw, (list, tuple)) or not raw or not all(isinstance(r, int) and not isinstance(r, bool)
                                                                     for r in raw):
            raise ValueError(f"tree path {raw!r} is not a non-empty tuple of child ranks (ints)")
        path = tuple(int(r) for r in raw)
        if any(r < 0 for r in path):
            raise ValueError(f"tree path {path} has a negative child rank")
        if max_rank is not None and any(r >= max_rank for r in path):
            raise ValueError(f"tree path {path} asks for child rank {max(path)}, but only the top {max_rank} "
                             f"candidates exist per node (ranks 0..{max_rank - 1})")
        if max_depth is not None and len(path) > max_depth:
            raise ValueError(f"tree path {path} is {len(path)} deep, deeper than the {max_depth} draft positions "
                             f"available")
        paths.append(path)
    if len(set(paths)) != len(paths):
        dup = next(p for p in paths if paths.count(p) > 1)
        raise ValueError(f"tree path {dup} appears twice")
    known = set(paths)
    for path in paths:
        if len(path) > 1 and path[:-1] not in known:
            raise ValueError(f"tree path {path} has no parent path {path[:-1]} in the tree")
    if len(paths) > MAX_TREE_NODES:
        raise ValueError(f"the tree has {len(paths)} nodes; at most {MAX_TREE_NODES} are supported")
    return sorted(paths, key=lambda t: (len(t), t))


def choices_parents(paths: Sequence[tuple[int, ...]]) -> list[int]:
    """Parent list of sorted ``paths`` (from :func:`parse_choices`): node i is ``paths[i]``."""
    index = {p: i for i, p in enumerate(paths)}
    return [index[p[:-1]] if len(p) > 1 else -1 for p in paths]


def chain_choices(k: int) -> list[tuple[int, ...]]:
    """vLLM's default tree for k drafts: ``[(0,), (0, 0), ...]`` (a chain)."""
    return [(0,) * (i + 1) for i in range(k)]
