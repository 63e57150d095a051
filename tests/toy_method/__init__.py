"""Method repeat_last: a toy drafter that exists to show, and to test, how a method plugs into specviz.

It drafts by assuming the text repeats with a period of ``repeat_lag`` tokens: x_i = the token ``repeat_lag``
positions before it (lag 1: the last token, again and again). No model runs, so q is one-hot. Register it with
``specviz.methods.register(METHOD)``; docs/adding-a-method.md walks through these three files.
"""

from __future__ import annotations

from dataclasses import dataclass

from specviz.methods import Method, Texts, option


@dataclass(frozen=True)
class RepeatOptions:
    """repeat_last's own generate() keyword (the CLI's --repeat-lag, a slider in the app)."""

    repeat_lag: int = option(1, label="repeat lag", help="the period the draft assumes: x_i = the token this many "
                             "positions before it", lo=1, hi=8)


def _make(build):
    from .proposer import RepeatProposer

    return RepeatProposer(build.options.repeat_lag, build.config.num_speculative_tokens)


METHOD = Method(
    "repeat_last", "toy: drafts the last repeat_lag tokens again", make=_make,
    texts=Texts("the repeat rule", "The draft assumes the text repeats: it copies the token repeat_lag positions "
                "back, then the one after it, and so on, wrapping around the last repeat_lag tokens.",
                "method repeat_last (a toy rule: the draft repeats the last repeat_lag tokens)"),
    style=("#8c564b", "star"), options=RepeatOptions,
    details_schema={"repeat_lag": int, "copied_from": [int]}, view="toy_method.view")
