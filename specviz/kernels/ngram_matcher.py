"""Triton batched n-gram (prompt lookup) matcher.

Same semantics and signature as :func:`specviz.methods.ngram.match.ngram_match_reference`
(vLLM ``v1/spec_decode/ngram_proposer.py`` / ``ngram_proposer_gpu.py``): longest n in
[prompt_lookup_min, prompt_lookup_max] whose earlier occurrence exists, earliest occurrence
among those, draft = up to k following tokens.

Algorithm (end-aligned matching). An occurrence of the row's last n tokens that ends at
position e satisfies ctx[e - j] == ctx[len - 1 - j] for j = 0..n-1, and must end at e <= len - 2
(so it is not the suffix itself and a token follows it). So one pass over candidate end
positions e computes, for every n at once, whether "the last n tokens match backwards from e"
(a running AND over j), and the earliest such e per n.

* ``_ngram_first_end_kernel``, grid (B, cdiv(L, BLOCK_L)): per (row, chunk of end positions),
  the smallest matching e per n in the chunk (or a sentinel) into a partial buffer
  [B, num_chunks, N]. No atomics, so results are deterministic.
* ``_ngram_finalize_kernel``, grid (B,): min over chunks (a loop over blocks of chunks), pick the
  longest n with a match, write the start position, n and the draft (gathered from the context,
  -1 padded).

Compiled once per device and token dtype: every per-request or per-step value (the context's
length and row stride, the number of chunks, k, prompt_lookup_min / max) is a runtime argument
excluded from Triton's integer specialisation (``do_not_specialize``: Triton otherwise compiles a
variant per value == 1 and per divisibility by 16), and the compile-time block sizes do not depend
on them (:func:`launch_constants`): on CUDA BLOCK_L is fixed, the n and draft lanes are padded to
:data:`MAX_LOOKUP` and :data:`MAX_DRAFT`. The first launch of each variant is timed and added to
:data:`compile_seconds` (the proposer reports it as its one-time ``capture_s``). Contexts up to
2**31 - 1 tokens. Tested on: the CPU interpreter (TRITON_INTERPRET=1), sm_90 compilation on CPU,
and an NVIDIA H200 (equality tests and timings: results/kernels/README.md).
"""

from __future__ import annotations

import time

import torch
import triton
import triton.language as tl

from specviz.methods.ngram.match import NgramMatch, check_ngram_args

_NO_MATCH = tl.constexpr(2**31 - 1)  # sentinel "no end position" (int32 max)
MAX_LOOKUP = 8  # n-gram lengths per lookup (max - min + 1) covered by one compiled variant; more get a wider one
MAX_DRAFT = 32  # draft lanes (k) covered by one compiled variant (the engine's MAX_SPECULATIVE_TOKENS)
CUDA_BLOCK_L = 1024  # end positions per program on a GPU, whatever the context's length
CHUNK_BLOCK = 16  # chunks reduced per iteration of the finalize kernel's loop
_RUNTIME_INTS = ["tok_stride", "NUM_CHUNKS", "K", "MIN_N", "MAX_N"]  # names absent from a kernel are ignored
compile_seconds = 0.0  # seconds spent in first launches (compilation) so far, this process
_launched: set[tuple] = set()  # (device, dtypes, constants) launched at least once


@triton.jit(do_not_specialize=_RUNTIME_INTS)
def _ngram_first_end_kernel(
    tok_ptr,  # int32/int64 [B, L] contexts
    len_ptr,  # int [B] valid lengths
    part_ptr,  # int32 [B, NUM_CHUNKS, MAX_N - MIN_N + 1] out: earliest matching end position per n
    tok_stride,  # row stride of tok (elements)
    NUM_CHUNKS,  # cdiv(L, BLOCK_L)
    MIN_N,  # prompt_lookup_min
    MAX_N,  # prompt_lookup_max
    BLOCK_L: tl.constexpr,
):
    b = tl.program_id(0)
    c = tl.program_id(1)
    length = tl.load(len_ptr + b).to(tl.int32)
    row = tok_ptr + b.to(tl.int64) * tok_stride
    e = c * BLOCK_L + tl.arange(0, BLOCK_L)  # [BLOCK_L] candidate end positions
    alive = e <= length - 2  # an occurrence must end before the last token
    out = part_ptr + (b * NUM_CHUNKS + c) * (MAX_N - MIN_N + 1)
    for j in range(0, MAX_N):
        suffix_pos = length - 1 - j
        s_tok = tl.load(row + tl.maximum(suffix_pos, 0))  # scalar ctx[len - 1 - j]
        alive = alive & (e - j >= 0) & (suffix_pos >= 0)
        tok = tl.load(row + (e - j), mask=alive, other=0)
        alive = alive & (tok == s_tok)
        if j + 1 >= MIN_N:  # n = j + 1 is a tried length
            first = tl.min(tl.where(alive, e, _NO_MATCH), axis=0)
            tl.store(out + (j + 1 - MIN_N), first)


@triton.jit(do_not_specialize=_RUNTIME_INTS)
def _ngram_finalize_kernel(
    tok_ptr,  # int32/int64 [B, L]
    len_ptr,  # int [B]
    part_ptr,  # int32 [B, NUM_CHUNKS, NUM_N]
    draft_ptr,  # int64 [B, K] out
    num_draft_ptr,  # int64 [B] out
    ngram_len_ptr,  # int64 [B] out
    pos_ptr,  # int64 [B] out
    tok_stride,
    NUM_CHUNKS,
    K,  # num_speculative_tokens
    MIN_N,
    MAX_N,
    CHUNK_BLOCK: tl.constexpr,  # chunks per loop iteration
    N_P2: tl.constexpr,  # >= MAX_N - MIN_N + 1, a power of 2
    K_P2: tl.constexpr,  # >= K, a power of 2
):
    NUM_N = MAX_N - MIN_N + 1
    b = tl.program_id(0)
    length = tl.load(len_ptr + b).to(tl.int32)
    nn = tl.arange(0, N_P2)[None, :]  # [1, N_P2]
    first_end = tl.full([N_P2], _NO_MATCH, tl.int32)  # earliest end per n, over the chunks seen so far
    for c0 in range(0, NUM_CHUNKS, CHUNK_BLOCK):
        ch = c0 + tl.arange(0, CHUNK_BLOCK)[:, None]  # [CHUNK_BLOCK, 1]
        part = tl.load(
            part_ptr + (b * NUM_CHUNKS + ch) * NUM_N + nn, mask=(ch < NUM_CHUNKS) & (nn < NUM_N), other=_NO_MATCH
        )
        first_end = tl.minimum(first_end, tl.min(part, axis=0))
    n_idx = tl.arange(0, N_P2)
    best = tl.max(tl.where(first_end != _NO_MATCH, n_idx, -1), axis=0)  # longest n with a match
    matched = best >= 0
    end = tl.min(tl.where(n_idx == best, first_end, _NO_MATCH), axis=0)
    n = tl.where(matched, best + MIN_N, 0)
    start = tl.where(matched, end - n + 1, -1)
    num = tl.where(matched, tl.minimum(length - (end + 1), K), 0)
    tl.store(ngram_len_ptr + b, n.to(tl.int64))
    tl.store(pos_ptr + b, start.to(tl.int64))
    tl.store(num_draft_ptr + b, num.to(tl.int64))
    t = tl.arange(0, K_P2)
    row = tok_ptr + b.to(tl.int64) * tok_stride
    tok = tl.load(row + (end + 1 + t), mask=t < num, other=-1).to(tl.int64)
    tl.store(draft_ptr + b * K + t, tok, mask=t < K)


def launch_constants(L: int, k: int, num_n: int, device: torch.device) -> dict[str, int]:
    """The compile-time constants of both kernels for a context of L tokens, k drafts and ``num_n`` n-gram lengths:
    {"BLOCK_L", "N_P2", "K_P2"}. On CUDA they depend on none of these while k <= MAX_DRAFT and num_n <= MAX_LOOKUP,
    so one compiled variant serves every request and step. The interpreter (no compilation) takes one block of
    end positions up to 8192 instead: its cost grows with the number of programs."""
    block_l = CUDA_BLOCK_L if device.type == "cuda" else max(16, min(8192, triton.next_power_of_2(max(L, 1))))
    return {"BLOCK_L": block_l, "N_P2": max(MAX_LOOKUP, triton.next_power_of_2(num_n)),
            "K_P2": max(MAX_DRAFT, triton.next_power_of_2(max(k, 1)))}


def ngram_match_triton(
    token_ids: torch.Tensor,
    lengths: torch.Tensor,
    *,
    prompt_lookup_min: int,
    prompt_lookup_max: int,
    num_speculative_tokens: int,
    validate_lengths: bool = True,
) -> NgramMatch:
    """Batched n-gram match with Triton; same contract as ``ngram_match_reference``.

    Args:
        token_ids: int32/int64 [B, L] contexts, padded past ``lengths`` (any padding value).
        lengths: int [B] valid length per row, 0 <= lengths <= L.
        prompt_lookup_min, prompt_lookup_max: n-gram lengths tried (1 <= min <= max).
        num_speculative_tokens: k, the most drafts per row.
        validate_lengths: check the lengths on the host (a device sync).

    Returns:
        NgramMatch(draft_token_ids int64 [B, k] -1 padded, num_draft int64 [B],
        ngram_len int64 [B] (0 = none), match_position int64 [B] (-1 = none)).

    Raises:
        ValueError: see ``check_ngram_args``.
    """
    k = num_speculative_tokens
    check_ngram_args(token_ids, lengths, prompt_lookup_min, prompt_lookup_max, k, validate_lengths)
    if token_ids.stride(1) != 1:
        token_ids = token_ids.contiguous()
    B, L = token_ids.shape
    device = token_ids.device
    lengths = lengths.to(device).contiguous()
    num_n = prompt_lookup_max - prompt_lookup_min + 1
    const = launch_constants(L, k, num_n, device)
    num_chunks = triton.cdiv(max(L, 1), const["BLOCK_L"])
    part = torch.empty(B, num_chunks, num_n, dtype=torch.int32, device=device)
    draft = torch.empty(B, k, dtype=torch.int64, device=device)
    num_draft, ngram_len, pos = (torch.empty(B, dtype=torch.int64, device=device) for _ in range(3))
    if B == 0:
        return NgramMatch(draft, num_draft, ngram_len, pos)
    key = (str(device), token_ids.dtype, lengths.dtype, tuple(const.values()))
    first = device.type == "cuda" and key not in _launched
    if first:  # a compile: timed (with the waits a one-time cost may have) and reported, never in a step's time
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
    stride, n_range = token_ids.stride(0), (prompt_lookup_min, prompt_lookup_max)
    _ngram_first_end_kernel[(B, num_chunks)](
        token_ids, lengths, part, stride, num_chunks, *n_range, BLOCK_L=const["BLOCK_L"], num_warps=4,
    )  # fmt: skip
    _ngram_finalize_kernel[(B,)](
        token_ids, lengths, part, draft, num_draft, ngram_len, pos, stride, num_chunks, k, *n_range,
        CHUNK_BLOCK=CHUNK_BLOCK, N_P2=const["N_P2"], K_P2=const["K_P2"], num_warps=1,
    )  # fmt: skip
    if first:
        global compile_seconds
        torch.cuda.synchronize(device)
        compile_seconds += time.perf_counter() - t0
        _launched.add(key)
    return NgramMatch(draft, num_draft, ngram_len, pos)
