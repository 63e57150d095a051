"""Runners for an EAGLE / EAGLE-3 head's chain drafting: the eager reference and a static one with CUDA graphs.

The proposer (:class:`specviz.methods.eagle.proposer.EagleProposer`) makes two kinds of call per engine step:

    first_pass(features [c, F], ids int64 [c], start)  -> hidden [1, d], logits float32 [V]
        the committed pairs (g_j, x_{j+1}) at positions j = start..start+c-1 (from target features)
    step(hidden [1, d], token int64 [1], position)      -> hidden [1, d], logits float32 [V]
        one draft step at ``position`` from the head's own fed-back hidden state

Both return the LAST row only (the one the chain continues from), as new tensors on the head's
device (hidden in the head's dtype). Slot i of the head's KV cache holds position i.

:class:`EagerHeadRunner` is the reference: a transformers ``DynamicCache`` cropped back to
``start`` before each first pass (the provisional draft K/V is dropped, docs/design/methods.md 1.2), and the
head's own forward with its default mask. It accepts any object with the heads' step API (test stubs).

:class:`StaticHeadRunner` is the fast path, in :class:`specviz.static_runner.StaticRunner`'s style
(gpt-fast ``generate.py``): a pre-allocated per-slot cache (:class:`~specviz.methods.eagle.graph_runner.SlotCache`, written with
``index_copy_`` at the rows' own positions, so rollback costs nothing: stale slots past a
query's position are hidden by the mask ``slot <= position`` and overwritten before any later
query can see them), and on CUDA one captured graph per call kind and width: ("step", 1) for draft
steps and ("first", B) for first passes of c <= B rows, B from :data:`BUCKETS` (rows c..B-1 are
padding at positions start+c..start+B-1: they write only slots that the next draft steps
overwrite before reading them, and no real row attends them). Inputs (features, ids, positions)
are copied into the graph's static buffers; positions, the mask and RoPE are computed inside the
graph from the position buffer, so a replay needs no host input and adds no host wait. First
passes wider than the largest bucket (the prefill), or whose padding would run past the cache,
run eagerly over the same cache. If a capture fails, the runner logs one warning and runs that
call kind and width eagerly from then on (never a crash; outputs are the same).

Compiled head (``compile=True``): the head's forward
(:meth:`StaticHeadRunner._forward`, first passes and draft steps), one tree level
(:meth:`StaticHeadRunner._forward_tree`) and a whole draft tree (:meth:`StaticHeadRunner.tree_draft`:
EAGLE-2's root expansion, every level and the rerank) run through ``torch.compile(backend)``
(``dynamic=False``: every call kind has fixed shapes), and on CUDA that compiled code is what the
runner's own CUDA graph captures (as :class:`specviz.static_runner.StaticRunner` does for the target:
inductor fuses the many small kernels of a head layer, about 55 per tree level, and the graph removes the
launches).
A compile or compiled-run failure is logged once and that call reruns eagerly (the head's K/V writes
are idempotent: the same slots are rewritten); compile then stays off for the runner.

Equality: the static runner gives the eager runner's drafts (fp32; attention over the masked
slots differs only in summation order): tests/test_head_runner.py on the CPU (eager path,
padding included) and, on CUDA, with graphs.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from .graph_runner import BUCKETS, TREE_SCRATCH, StaticHeadRunner, _check_sees  # noqa: F401 (re-exported)
from .head import _Head, crop_cache


class EagerHeadRunner:
    """The reference: the head's eager forward over a ``DynamicCache`` (the head's K/V; slot i = position i).

    Args:
        head: an EAGLE / EAGLE-3 head (or any module with the heads' step API, see
            :mod:`specviz.methods.eagle.head`), on its device, in eval mode.
    """

    cuda_graphs = False
    capture_s = 0.0

    def __init__(self, head: torch.nn.Module):
        self.head = head
        self.cache = DynamicCache()

    def reset(self) -> None:
        self.cache = DynamicCache()

    def truncate(self, length: int) -> None:
        """Drop the K/V of positions >= ``length`` (the provisional draft K/V, docs/design/methods.md 1.2)."""
        crop_cache(self.cache, length)

    tree_scratch = None  # tree levels append to the DynamicCache: no bound

    def tree_level(self, hidden: torch.Tensor, tokens: torch.Tensor, position: int, committed: int, first: int,
                   sees: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One level of a draft tree (see :meth:`StaticHeadRunner.tree_level`): the R rows' K/V are appended
        after the ``committed`` positions and the tree's ``first`` earlier scratch rows (scratch row j = column
        committed + j), each row attending the committed keys and the scratch rows ``sees`` marks (bool [R, S],
        S = first + R, on any device)."""
        R = int(tokens.shape[0])
        written = self.cache.get_seq_length() - committed
        if first != written:
            raise ValueError(f"tree_level: scratch rows from {first} are not the next ones after {written} written")
        _check_sees(sees, R, first + R, first + R)
        device = tokens.device
        visible = torch.cat([torch.ones(R, committed, dtype=torch.bool, device=device),
                             sees.to(device=device, dtype=torch.bool, non_blocking=True)], dim=1)  # [R, Lc + S]
        pos = torch.full((R,), position, dtype=torch.long, device=device)
        out, logits = self.head(hidden, tokens, pos, self.cache, from_target=False, attention_mask=visible[None, None])
        return out, logits.float()

    def tree_draft(self, key: tuple, fn, hidden: torch.Tensor, logits: torch.Tensor, position: int,
                   committed: int) -> torch.Tensor:
        """As :meth:`StaticHeadRunner.tree_draft`, eagerly: ``fn``'s levels are :meth:`tree_level` calls."""
        def level(i, first, h, tokens, sees):
            return self.tree_level(h, tokens, position + i, committed, first, sees)

        return fn(hidden, logits, level)

    def first_pass(self, features: torch.Tensor, ids: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """features [c, F], ids int64 [c] (the token after each feature), rows at positions start..start+c-1
        -> (hidden [1, d], logits float32 [V]) of the last row. Drops the cache's slots >= start first."""
        self.truncate(start)
        pos = torch.arange(start, start + ids.shape[0], device=ids.device)  # [c]: the feature's position j
        hidden, logits = self.head(features, ids, pos, self.cache, from_target=True)  # [c, d], [c, V]
        return hidden[-1:], logits[-1]

    def step(self, hidden: torch.Tensor, token: torch.Tensor, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden [1, d] (fed back), token int64 [1] at ``position`` -> (hidden [1, d], logits float32 [V])."""
        pos = torch.full((1,), position, dtype=torch.long, device=token.device)
        hidden, logits = self.head(hidden, token, pos, self.cache, from_target=False)  # [1, d], [1, V]
        return hidden, logits[0]

    def warm_up(self, max_width: int) -> int:
        return 0


def make_head_runner(head: torch.nn.Module, max_len: int | None, cuda_graphs: bool | None = None,
                     compile: bool | None = None, compile_backend: str = "inductor"):
    """The head runner for a request: :class:`StaticHeadRunner` when ``max_len`` is given (the target
    runs on the static runner) and ``head`` is a specviz head (``compile``: as that class); otherwise
    :class:`EagerHeadRunner`."""
    if max_len is not None and isinstance(head, _Head):
        return StaticHeadRunner(head, max_len, cuda_graphs, compile=compile, compile_backend=compile_backend)
    return EagerHeadRunner(head)
