"""The n-gram methods' own settings (ngram and ngram_gpu share them): vLLM's prompt-lookup bounds."""

from __future__ import annotations

from dataclasses import dataclass

from specviz.methods.base import option

PATTERN = "suffix"  # the details key (and the view's role) of the n-gram looked up: the context's last n tokens
TRIE_NODE: dict = {"token_id": int, "count": int}
TRIE_NODE["children"] = [TRIE_NODE]
LOOKUP_DETAILS = {  # what the n-gram proposers record per step (the trace checks uploads against it)
    "n": int, PATTERN: [int], "suffix_start": int, "occurrences": [int], "match_position": int,
    "tried": [{"n": int, "occurrences": int}], "trie": [TRIE_NODE], "prompt_lookup_min": int, "prompt_lookup_max": int,
}


def resolve_lookup_bounds(prompt_lookup_min: int | None, prompt_lookup_max: int | None) -> tuple[int, int]:
    """vLLM's defaults: neither bound given -> both 5; one given -> the other copies it.

    Raises ValueError if a bound is < 1 or min > max."""
    if prompt_lookup_min is None and prompt_lookup_max is None:
        lo = hi = 5
    else:
        lo = prompt_lookup_min if prompt_lookup_min is not None else prompt_lookup_max
        hi = prompt_lookup_max if prompt_lookup_max is not None else prompt_lookup_min
    if lo < 1:
        raise ValueError(f"prompt_lookup_min must be >= 1, got {lo}")
    if lo > hi:
        raise ValueError(f"prompt_lookup_min ({lo}) must be <= prompt_lookup_max ({hi}); raise the max or lower the min")
    return int(lo), int(hi)


@dataclass(frozen=True)
class LookupOptions:
    """n-gram (prompt lookup) settings: the n-gram sizes searched, longest first (None: vLLM's default, see
    :func:`resolve_lookup_bounds`). Raises ValueError for bounds out of order or below 1."""

    prompt_lookup_min: int | None = option(None, label="prompt_lookup_min", lo=1, hi=8, ui=2,
                                           help="the shortest n-gram looked up (vLLM's default 5)")
    prompt_lookup_max: int | None = option(None, label="prompt_lookup_max", lo=1, hi=8, ui=4,
                                           help="the longest n-gram looked up, tried first (vLLM's default 5)")

    def __post_init__(self):
        resolve_lookup_bounds(self.prompt_lookup_min, self.prompt_lookup_max)

    def resolved(self) -> dict[str, int]:
        """The bounds a request ran with (the trace records them)."""
        lo, hi = resolve_lookup_bounds(self.prompt_lookup_min, self.prompt_lookup_max)
        return {"prompt_lookup_min": lo, "prompt_lookup_max": hi}
