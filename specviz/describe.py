"""The trace's words about a request: its config (settings, models, runner, the method's and the head's own
entries) and the texts of every token it mentions."""

from __future__ import annotations

from typing import Any, Iterator

from . import methods
from .loading import runner_options
from .static_runner import capture_notes


def describe_request(decoder: Any, cfg: Any, ids: list[int]) -> dict[str, Any]:
    """The trace's ``config`` for request ``cfg`` on ``decoder`` with prompt ``ids``: generate()'s keywords
    (:meth:`~specviz.config.GenerationConfig.flat`), the models, device, dtype, runner, the method's own description
    and, for a method with a head, which head drafted and which target features it read."""
    d = cfg.flat()
    names, opts = decoder.names, runner_options(decoder.runner_factory)
    d.update(target=names.get("target", type(decoder.target_model).__name__), draft=names.get("draft", ""),
             device=str(decoder.device),
             dtype=names.get("dtype", str(next(decoder.target_model.parameters()).dtype).split(".")[-1]),
             runner=opts["runner"], prompt_length=len(ids),
             compile=bool(opts.get("compile")) or _stage_started(decoder), vocab_size=decoder.vocab_size)
    d["logits_dtype"] = names.get("logits_dtype", d["dtype"])  # float32 with specviz.precision.use_fp32_logits
    if "model_sources" in names:  # file format, GGUF file and quantisation type
        d["model_sources"] = names["model_sources"]
    notes = [n for m in (decoder.target_model, decoder.draft_model) if m is not None for n in capture_notes(m)]
    if notes:  # CUDA-graph captures that failed in this process (those forwards run eagerly): the speedup panel
        d["graph_notes"] = notes
    method = methods.get(cfg.method)
    if method.describe is not None:
        d.update(method.describe(cfg))
    if cfg.verify == "typical":
        from .sampling.typical import LOSSY_NOTE

        d["verify_note"] = LOSSY_NOTE
    if method.head is not None and cfg.method in decoder.heads:
        head = decoder.heads[cfg.method]
        d["head"] = {"path": names.get(f"{cfg.method}_head", ""), "kind": getattr(head.config, "kind", cfg.method),
                     **method.head.describe(head), **(getattr(head, "source", None) or {})}  # its published layout
        note = draft_note(method, head, cfg)
        if note:
            d["draft_note"] = note
    return d


def draft_note(method: Any, head: Any, cfg: Any) -> str | None:
    """What a chain whose k exceeds the head's :attr:`~specviz.methods.base.HeadSpec.max_drafts` drafts, or None."""
    if method.head.max_drafts is None or getattr(cfg, "tree", None) is not None:
        return None
    limit, why = method.head.max_drafts(head)
    k = cfg.num_speculative_tokens
    if k <= limit:
        return None
    never = f"position {k} is" if k == limit + 1 else f"positions {limit + 1}-{k} are"
    return (f"{cfg.method} drafts at most {limit} tokens per step ({why}): num_speculative_tokens = {k} was asked, "
            f"so draft {never} never filled")


def _stage_started(decoder: Any) -> bool:
    """Whether a background compile stage has started (``runner_compiled`` then says what a request replayed)."""
    status = getattr(decoder, "compile_status", None)
    return status is not None and status.mode == "auto" and status.active


def add_texts(tokenizer: Any, trace: Any, generated: list[int]) -> None:
    """Fill the trace's text fields: ``prompt_text``, ``text`` (the output so far) and ``token_texts`` for every id
    the trace mentions (decoding only ids not seen before), so partial traces streamed during a request are as
    readable as the final one."""
    if trace is None:
        return
    texts = trace.token_texts
    if not trace.prompt_text:
        trace.prompt_text = tokenizer.decode(trace.prompt_token_ids, skip_special_tokens=True)
    trace.text = tokenizer.decode(generated, skip_special_tokens=True)
    ids = set(trace.prompt_token_ids) if not texts else set()
    ids.update(generated[-64:] if texts else generated)
    for s in trace.steps[-1:] if texts else trace.steps:
        ids.update(s.draft_token_ids)
        ids.update(n.token_id for n in s.nodes)  # a tree's nodes off the row (the tree view names them)
        ids.update(match_ids(s.match))  # tokens a proposer's details name (Medusa candidates, DFlash top tokens)
        ids.update(int(t) for pos in s.positions for top in (pos.p_top, pos.q_top, pos.residual_top) for t, _ in top)
        ids.update(int(t) for t, _ in s.emitted.top)
    for t in sorted(i for i in ids if str(i) not in texts):
        texts[str(t)] = tokenizer.decode([t])


def match_ids(obj: Any) -> Iterator[int]:
    """Token ids named in a step's draft details (``Step.match``): values of keys ending in ``token_id`` /
    ``token_ids`` and the ids of ``candidates`` lists ([[id, prob], ...]), at any depth."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            if key.endswith("token_id") and isinstance(value, int) and value >= 0:
                yield value
            elif key.endswith("token_ids") and isinstance(value, list):
                yield from (int(t) for t in value if isinstance(t, int) and t >= 0)
            elif key == "candidates" and isinstance(value, list):
                yield from (int(c[0]) for c in value if isinstance(c, (list, tuple)) and c and isinstance(c[0], int))
            else:
                yield from match_ids(value)
    elif isinstance(obj, list):
        for item in obj:
            yield from match_ids(item)
