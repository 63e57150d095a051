"""Where the drafting head came from: one line per fact of the trace's ``config["head"]`` record (the layout
the loader recognised, its source, and what the layout implies: EAGLE-3's taps, norm flags and draft
vocabulary with its mapping to target ids, Medusa's LM heads and token map, DFlash's block and taps).
Reads only the trace (:mod:`specviz.heads.formats` writes the record at load)."""

from __future__ import annotations

import html
from typing import Any

from specviz.trace import Trace

NORMS = ("norm_before_residual", "fc_norm", "norm_before_fc", "feed_normed")  # shown when on (default off)


def head_source_html(trace: Trace) -> str:
    """A small paragraph on the head's layout, or "" when the trace records no head."""
    rec = trace.config.get("head") or {}
    if not rec.get("format"):
        return ""
    lines = [f"layout <b>{html.escape(rec['format'])}</b> ({html.escape(str(rec.get('source', '')))})"
             + (f" from <code>{html.escape(_shown_path(str(rec['path'])))}</code>" if rec.get("path") else "")]
    lines += _eagle1(rec) + _eagle3(rec) + _medusa(rec) + _dflash(rec)
    body = "<br>".join(lines)
    return (f"<p class='sv-head-source' style='font-size:12px;color:#4b5563;margin:4px 0;overflow-wrap:anywhere'>"
            f"Head: {body}</p>")  # long paths wrap inside the half-page panel


def _shown_path(path: str) -> str:
    """A bundled head's directory from the repository root (assets/models/<a method's bundled head>), not this
    machine's absolute path; any other path as recorded."""
    from specviz import methods

    bundled = {m.head.bundled for m in methods.all_methods() if m.head is not None and m.head.bundled}
    _, sep, tail = path.replace("\\", "/").rpartition("/assets/models/")
    return f"assets/models/{tail}" if sep and tail.rstrip("/") in bundled else path


def _vocab(rec: dict[str, Any]) -> list[str]:
    V, Vd = rec.get("vocab_size"), rec.get("draft_vocab_size")
    if not Vd:
        return []
    if Vd == V:
        return [f"draft vocabulary: all {V} target tokens ({html.escape(str(rec.get('draft_to_target', '')))})"]
    examples = ", ".join(f"{d}→{t}" for d, t in rec.get("d2t_examples", []))
    return [f"draft vocabulary: {Vd} of {V} target tokens ({100 * Vd / V:.0f}%); the head's LM head scores only "
            f"these, every other token gets logit -inf; {html.escape(str(rec.get('draft_to_target', '')))}"
            + (f", e.g. {examples}, …" if examples else "")]


def _eagle1(rec: dict[str, Any]) -> list[str]:
    if rec.get("format") != "eagle-safeailab":
        return []
    return [f"fc {'with' if rec.get('fc_bias') else 'without'} bias; layer 0 without input norm; RoPE base "
            f"{rec.get('rope_theta')}; embedding: {html.escape(str(rec.get('embedding', '')))}; logits: the target's "
            "LM head on the un-normed output"]


def _eagle3(rec: dict[str, Any]) -> list[str]:
    if not rec.get("format", "").startswith("eagle3-"):
        return []
    taps = ", ".join(map(str, rec.get("taps", [])))
    out = [f"taps: inputs of target layers {taps}"
           + (f" (the file says {rec['taps_in_file']}: {html.escape(rec.get('tap_convention', ''))})"
              if rec.get("taps_in_file") else f" ({html.escape(rec.get('tap_convention', ''))})")]
    on = [name for name in NORMS if rec.get(name)] + ([] if rec.get("norm_logits", True) else ["no norm before the LM head"])
    out.append("norm flags: " + (", ".join(on) if on else "none beyond SafeAILab's") +
               f"; RoPE base {rec.get('rope_theta')}; embedding: {html.escape(str(rec.get('embedding', '')))}")
    return out + _vocab(rec)


def _medusa(rec: dict[str, Any]) -> list[str]:
    if not rec.get("format", "").startswith("medusa"):
        return []
    out = [f"{rec.get('num_heads')} heads x {rec.get('num_layers')} ResBlock(s)"
           f"{'' if rec.get('fc_bias', True) else ' without bias'}; LM head: {html.escape(str(rec.get('lm_head', '')))}"]
    if rec.get("token_map"):
        examples = ", ".join(f"{d}→{t}" for d, t in rec.get("token_map_examples", []))
        out.append(f"truncated vocabulary: {rec['truncated_vocab_size']} of {rec['vocab_size']} tokens, token_map "
                   f"row → target id (e.g. {examples}, …); other tokens get logit -inf")
    if rec.get("config_num_heads") not in (None, rec.get("num_heads")):
        out.append(f"config.json says {rec['config_num_heads']} heads; the weights hold {rec['num_heads']}")
    return out


DFLASH_SCALES = (("input_embedding_scale", "block embeddings are multiplied by it"),
                 ("output_multiplier", "logits are multiplied by it"),
                 ("final_logit_softcapping", "logits are soft-capped: c tanh(z / c)"))


def _dflash(rec: dict[str, Any]) -> list[str]:
    if not rec.get("format", "").startswith("dflash-"):
        return []
    ids = ", ".join(map(str, rec.get("target_layer_ids", [])))
    return [f"fuses the outputs of target layers {ids} ({html.escape(rec.get('tap_convention', ''))}); block "
            f"{rec.get('block_size')} (from the {rec.get('block_size_in')}), MASK id {rec.get('mask_token_id')}, "
            f"non-causal; RoPE base {rec.get('rope_theta')}"] + [
        f"{name.replace('_', ' ')} {rec[name]} (z-lab's {what})" for name, what in DFLASH_SCALES if name in rec]

