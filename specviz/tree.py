"""Draft trees: the one draft shape every proposer returns (a chain is the tree whose parents are i - 1).

Convention (docs/design/methods.md 1.3, with the root left implicit): the root is the last committed token
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
import hashlib
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import torch

MAX_TREE_NODES = 64
TREE_FORMS = ("static", "dynamic", "branches")  # the forms a method may draft (``Method.tree_forms``)
STATIC_SETTING = "speculative_token_tree"  # vLLM's name
DYNAMIC_SETTINGS = ("eagle_tree_top_k", "eagle_tree_depth", "eagle_tree_total_tokens")
BRANCHES_SUFFIX = "_tree_branches"  # "<method>_tree_branches": the children kept per node
# EAGLE-2's knobs by default: the measured best of the trees tried (results/tree/README.md)
DEFAULT_TOP_K, DEFAULT_DEPTH, DEFAULT_TOTAL_TOKENS = 4, 6, 32


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


def check_branches(branches: Any, setting: str) -> int | None:
    """None, or an int >= 1 (children kept per node). Raises ValueError naming ``setting``."""
    if branches is None:
        return None
    if isinstance(branches, bool) or not isinstance(branches, int) or branches < 1:
        raise ValueError(f"{setting} must be None (a chain) or an integer >= 1 (children kept per tree node), "
                         f"got {branches!r}")
    return branches


@dataclass(frozen=True)
class DynamicTree:
    """EAGLE-2's knobs (names as ``EaModel.from_pretrained``; SGLang: ``--speculative-eagle-topk`` = top_k,
    ``--speculative-num-steps`` = depth + 1, ``--speculative-num-draft-tokens`` = total_tokens).

    top_k: children expanded per node and frontier size K (>= 1). depth: D, head forwards after the
    root's expansion (>= 0; the deepest node is at depth D + 1). total_tokens: N, tokens verified
    INCLUDING the root, so N - 1 draft nodes (2 <= N, N - 1 <= min(MAX_TREE_NODES, K + D*K*K)).
    Raises ValueError saying which bound is broken."""

    top_k: int = DEFAULT_TOP_K
    depth: int = DEFAULT_DEPTH
    total_tokens: int = DEFAULT_TOTAL_TOKENS

    def __post_init__(self):
        k, d, n = self.top_k, self.depth, self.total_tokens
        if not (isinstance(k, int) and not isinstance(k, bool) and k >= 1):
            raise ValueError(f"eagle_tree_top_k must be an integer >= 1, got {k!r}")
        if not (isinstance(d, int) and not isinstance(d, bool) and d >= 0):
            raise ValueError(f"eagle_tree_depth must be an integer >= 0 (head forwards after the root's expansion), "
                             f"got {d!r}")
        if not (isinstance(n, int) and not isinstance(n, bool) and n >= 2):
            raise ValueError(f"eagle_tree_total_tokens must be an integer >= 2 (the root plus at least one draft "
                             f"node), got {n!r}")
        if n - 1 > MAX_TREE_NODES:
            raise ValueError(f"eagle_tree_total_tokens = {n} gives {n - 1} draft nodes; at most "
                             f"{MAX_TREE_NODES} are supported (total_tokens <= {MAX_TREE_NODES + 1})")
        if n - 1 > k + d * k * k:
            raise ValueError(f"eagle_tree_total_tokens = {n} asks for {n - 1} draft nodes but top_k = {k}, depth = {d} "
                             f"make only {k + d * k * k} candidates; lower total_tokens or raise top_k / depth")

    @property
    def max_depth(self) -> int:
        return self.depth + 1


@dataclass(frozen=True)
class DraftTree:
    """A request's draft tree (None everywhere means a chain of k), in one of :data:`TREE_FORMS`:

    * "static": vLLM's ``speculative_token_tree``, paths of child ranks (``paths``, sorted as
      :func:`parse_choices`); the methods that take it rank their draft's candidates;
    * "dynamic": EAGLE-2's tree (``dynamic``: top_k, depth, total_tokens), grown by the head's confidence;
    * "branches": up to ``branches`` ranked continuations per node (n-gram and suffix matches).

    Written as one string (the Compare tab, ``specviz compare --trees``): "[(0,), (1,), (0, 0)]" static,
    "4, 6, 32" dynamic, "2" branches; as generate() keywords: ``speculative_token_tree``, ``eagle_tree_top_k`` /
    ``_depth`` / ``_total_tokens``, ``<method>_tree_branches``. Parsed here only."""

    form: str
    paths: tuple[tuple[int, ...], ...] = ()
    dynamic: DynamicTree | None = None
    branches: int | None = None

    @classmethod
    def parse(cls, text: Any) -> "DraftTree | None":
        """One string -> a tree (None for "" or "chain"). Raises ValueError for text of none of the three forms, or
        an invalid tree."""
        spec = " ".join(str(text or "").split())
        if spec.lower() in ("", "chain"):
            return None
        if spec.startswith("["):
            return cls("static", paths=tuple(parse_choices(spec)))
        if spec.isdigit():
            return cls("branches", branches=check_branches(int(spec), "tree branches"))
        parts = [x.strip() for x in spec.replace(";", ",").split(",")]
        if len(parts) != 3 or not all(x.isdigit() for x in parts):
            raise ValueError(f"a draft tree is \"[(0,), (1,), (0, 0)]\" (static), three integers top_k, depth, "
                             f"total_tokens like 4, 6, 32 (EAGLE-2) or a number of branches per node like 2; "
                             f"got {text!r}")
        return cls("dynamic", dynamic=DynamicTree(*map(int, parts)))

    @classmethod
    def from_settings(cls, settings: dict[str, Any], method: str, methods: Iterable[str] = ()) -> "DraftTree | None":
        """The tree that generate() keywords ask for (they are removed from ``settings``): None for a chain.
        ``methods``: every registered name (a ``<name>_tree_branches`` of another method is an error).
        Raises ValueError for an invalid tree, a static and a dynamic tree given together, or branches named for
        another method."""
        static = settings.pop(STATIC_SETTING, None)
        knobs = {name: settings.pop(name) for name in DYNAMIC_SETTINGS if settings.get(name) is not None}
        for name in DYNAMIC_SETTINGS:
            settings.pop(name, None)
        branch_keys = [f"{m}{BRANCHES_SUFFIX}" for m in methods if f"{m}{BRANCHES_SUFFIX}" in settings]
        given = {key[: -len(BRANCHES_SUFFIX)]: settings.pop(key) for key in branch_keys}
        given = {m: b for m, b in given.items() if b is not None}
        for other in given:
            if other != method:
                raise ValueError(f"{other}{BRANCHES_SUFFIX} applies to method {other}, not {method!r}; unset it or "
                                 "change the method")
        trees = []
        if static is not None:
            if not isinstance(static, str):
                raise ValueError("speculative_token_tree must be a string like \"[(0,), (1,), (0, 0)]\" (vLLM's format)")
            trees.append(cls("static", paths=tuple(parse_choices(static))))
        if knobs:
            short = {name.rsplit("_tree_", 1)[1]: value for name, value in knobs.items()}
            trees.append(cls("dynamic", dynamic=DynamicTree(**short)))
        if method in given:
            trees.append(cls("branches", branches=check_branches(given[method], f"{method}{BRANCHES_SUFFIX}")))
        if len(trees) > 1:
            raise ValueError("set either speculative_token_tree (a static tree) or eagle_tree_top_k / eagle_tree_depth / "
                             "eagle_tree_total_tokens (EAGLE-2's dynamic tree), not both")
        return trees[0] if trees else None

    def settings(self, method: str) -> dict[str, Any]:
        """The generate() keywords of this tree for ``method`` (the inverse of :meth:`from_settings`)."""
        if self.form == "static":
            return {STATIC_SETTING: self.spec}
        if self.form == "dynamic":
            d = self.dynamic
            return dict(zip(DYNAMIC_SETTINGS, (d.top_k, d.depth, d.total_tokens)))
        return {f"{method}{BRANCHES_SUFFIX}": self.branches}

    @property
    def spec(self) -> str:
        """The one-string form (:meth:`parse` reads it back)."""
        if self.form == "static":
            return str(list(self.paths))
        if self.form == "dynamic":
            return f"{self.dynamic.top_k}, {self.dynamic.depth}, {self.dynamic.total_tokens}"
        return str(self.branches)

    @property
    def max_depth(self) -> int | None:
        """The most drafts one path can hold (its k): a static tree's longest path, EAGLE-2's depth + 1; None for
        branches (their depth is k)."""
        if self.form == "static":
            return max(len(p) for p in self.paths)
        if self.form == "dynamic":
            return self.dynamic.max_depth
        return None

    @property
    def label(self) -> str:
        """Short and distinct: "static tree [(0,),(1,),(0,0)]" (the tree itself when short, else "static tree
        (9 nodes, depth 4, #1a2b)" with 4 hex digits of its SHA-1), "tree 4,6,32", "tree 2 branches"."""
        if self.form == "static":
            compact = "".join(self.spec.split())
            if len(compact) <= 32:
                return f"static tree {compact}"
            digest = hashlib.sha1(compact.encode()).hexdigest()[:4]
            return f"static tree ({len(self.paths)} nodes, depth {self.max_depth}, #{digest})"
        if self.form == "dynamic":
            return "tree " + self.spec.replace(" ", "")
        return f"tree {self.branches} branches"
