"""Dump a target's hidden states to safetensors: specviz's counterpart of vLLM's
``extract_hidden_states`` (vllm PR #33736, ``vllm/v1/spec_decode/extract_hidden_states.py``;
docs/design/methods.md 8). vLLM runs it as a pseudo-speculator that accepts everything; here it is a plain
function and CLI, since it drafts nothing.

File layout (``save_hidden_states``; the same tensor names as vLLM's connector output)::

    token_ids      int64 [T]                   the tokens, in order
    hidden_states  [T, n_taps, d]              dimension order: token, tap, hidden  (vLLM's docs had
                                               the first two swapped; this is the order its code writes)
    metadata       {"layers": "final,2,10,17", "dim_order": "token,tap,hidden", "dtype": ..., "target": ...}

Taps (transformers 5.17, :mod:`specviz.methods.eagle.features`): ``final`` = f_t, the output of the final
RMSNorm (what the LM head multiplies; EAGLE-1's feature); an integer l in [0, L) = HF
``hidden_states[l]``, the INPUT of decoder layer l (0 = embeddings; EAGLE-3's taps, vLLM's
``aux_hidden_states``). Texts longer than the target's context are cut into consecutive windows of
``max_position_embeddings`` tokens, each run with a fresh context (positions restart at 0).

:func:`features_from_dump` turns a dump into exactly the first-pass features a head reads
(tests/test_heads_extract.py checks it against :func:`specviz.heads.target_features`).

CLI: ``python -m specviz.methods.eagle.extract --target DIR (--text-file F | --trace run.json)
--layers final,2,10,17 --out file.safetensors [--device cpu|cuda] [--dtype float32|bfloat16]``.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Sequence, Union

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from specviz.methods.eagle.config import EAGLE1, HeadConfig

Tap = Union[str, int]
DIM_ORDER = "token,tap,hidden"


def parse_layers(spec: str | Sequence[Tap], num_layers: int) -> list[Tap]:
    """"final,2,10,17" (or a list) -> ["final", 2, 10, 17]. Raises ValueError for an unknown name,
    an id outside [0, L) or an empty list."""
    items = [s.strip() for s in spec.split(",")] if isinstance(spec, str) else list(spec)
    out: list[Tap] = []
    for it in items:
        if it == "final":
            out.append("final")
            continue
        try:
            layer = int(it)
        except (TypeError, ValueError):
            raise ValueError(f"layer {it!r}: use 'final' or a decoder-layer index in [0, {num_layers})") from None
        if not 0 <= layer < num_layers:
            raise ValueError(f"layer {layer} out of range: taps are inputs of decoder layers 0..{num_layers - 1} "
                             f"(0 = embeddings); use 'final' for the final-norm output")
        out.append(layer)
    if not out:
        raise ValueError("no layers given; e.g. --layers final,2,10,17")
    return out


@torch.no_grad()
def extract_hidden_states(target, token_ids: torch.Tensor, layers: Sequence[Tap]) -> torch.Tensor:
    """Hidden states of ``token_ids`` int64 [T] at ``layers`` (see :func:`parse_layers`).
    Returns [T, n_taps, d] in the target's dtype, on the target's device."""
    if token_ids.dim() != 1 or token_ids.numel() == 0:
        raise ValueError(f"token_ids must be a non-empty 1-D tensor, got shape {tuple(token_ids.shape)}")
    taps = parse_layers(layers, target.config.num_hidden_layers)
    device = next(target.parameters()).device
    ctx = target.config.max_position_embeddings
    chunks = []
    for start in range(0, token_ids.numel(), ctx):
        ids = token_ids[start : start + ctx].to(device)[None]  # [1, t]
        out = target.model(input_ids=ids, output_hidden_states=True, use_cache=False)
        per_tap = [out.last_hidden_state if t == "final" else out.hidden_states[t] for t in taps]
        chunks.append(torch.stack(per_tap, dim=2)[0])  # [t, n_taps, d]
    return torch.cat(chunks, dim=0)


def save_hidden_states(path: str | os.PathLike, token_ids: torch.Tensor, hidden_states: torch.Tensor,
                       layers: Sequence[Tap], target_name: str = "") -> None:
    """Write the dump (layout in the module docstring). Raises ValueError for mismatched shapes."""
    if hidden_states.dim() != 3 or hidden_states.shape[:2] != (token_ids.numel(), len(layers)):
        raise ValueError(f"hidden_states must be [T={token_ids.numel()}, n_taps={len(layers)}, d], "
                         f"got {tuple(hidden_states.shape)}")
    meta = {"layers": ",".join(str(t) for t in layers), "dim_order": DIM_ORDER,
            "dtype": str(hidden_states.dtype).replace("torch.", ""), "target": str(target_name)}
    tensors = {"token_ids": token_ids.detach().to("cpu", torch.int64).contiguous(),
               "hidden_states": hidden_states.detach().cpu().contiguous()}
    save_file(tensors, str(path), metadata=meta)


def load_hidden_states(path: str | os.PathLike) -> tuple[torch.Tensor, torch.Tensor, list[Tap]]:
    """(token_ids int64 [T], hidden_states [T, n_taps, d], layers) from a dump written by
    :func:`save_hidden_states`. Raises ValueError for a file without that layout."""
    with safe_open(str(path), "pt") as f:
        meta = f.metadata() or {}
        if meta.get("dim_order") != DIM_ORDER or not {"token_ids", "hidden_states"} <= set(f.keys()):
            raise ValueError(f"{path} is not a specviz hidden-state dump (token_ids, hidden_states, {DIM_ORDER})")
        ids, hs = f.get_tensor("token_ids"), f.get_tensor("hidden_states")
    layers = [t if t == "final" else int(t) for t in meta["layers"].split(",")]
    return ids, hs, layers


def features_from_dump(hidden_states: torch.Tensor, layers: Sequence[Tap], config: HeadConfig) -> torch.Tensor:
    """The head's first-pass features [T, F] from a dump [T, n_taps, d]: the ``final`` tap for
    eagle, the aux taps concatenated in ``config.aux_layer_ids`` order for eagle3.
    Raises ValueError if the dump lacks a tap the head needs."""
    need: list[Tap] = ["final"] if config.kind == EAGLE1 else list(config.aux_layer_ids)
    missing = [t for t in need if t not in layers]
    if missing:
        raise ValueError(f"the dump has taps {list(layers)}; a {config.kind} head needs {need} "
                         f"(missing {missing}): re-extract with --layers {','.join(map(str, need))}")
    idx = [list(layers).index(t) for t in need]
    return hidden_states[:, idx].flatten(1)  # [T, len(need) * d]


def _token_ids(args, tokenizer) -> torch.Tensor:
    if args.trace:
        from specviz.trace import Trace

        with open(args.trace, "rb") as fh:
            tr = Trace.from_json(fh.read())
        ids = list(tr.prompt_token_ids) + list(tr.output_token_ids)  # the run's committed tokens
    else:
        with open(args.text_file, encoding="utf-8") as fh:
            ids = tokenizer(fh.read(), add_special_tokens=True, verbose=False)["input_ids"]
    return torch.tensor(ids, dtype=torch.int64)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m specviz.methods.eagle.extract",
                                 description="Dump a target's hidden states (token, tap, hidden) to safetensors.")
    ap.add_argument("--target", required=True, help="target model directory (safetensors)")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--text-file", help="UTF-8 text, encoded with the target's tokenizer (with bos)")
    src.add_argument("--trace", help="a specviz trace JSON: its prompt + output token ids")
    ap.add_argument("--layers", default="final", help="comma-separated taps: final and/or layer indices")
    ap.add_argument("--out", required=True, help="output .safetensors file")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = ap.parse_args(argv)
    from specviz.models import load_model, load_tokenizer, resolve_device

    device = resolve_device(args.device)
    target = load_model(args.target, device, getattr(torch, args.dtype))
    layers = parse_layers(args.layers, target.config.num_hidden_layers)
    ids = _token_ids(args, load_tokenizer(args.target) if args.text_file else None)
    hs = extract_hidden_states(target, ids, layers)
    save_hidden_states(args.out, ids, hs, layers, target_name=os.path.basename(os.path.normpath(args.target)))
    summary = {"out": args.out, "tokens": int(ids.numel()), "layers": layers, "shape": list(hs.shape),
               "dtype": args.dtype}
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
