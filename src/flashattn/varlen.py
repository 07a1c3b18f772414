"""Public functions for packed (variable-length) batches, with the flash-attn 2 signatures.

Layout: the sequences of a batch are concatenated along the token axis, q of shape
(total_q, nheads, headdim) and k, v of shape (total_k, nheads_k, headdim); sequence b holds the query
rows ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]`` and the key rows ``cu_seqlens_k[b]:cu_seqlens_k[b + 1]``.
No padding is stored or computed. Each sequence is attended to on its own, as
:func:`flashattn.flash_attn_func` would attend to it alone: causal and window masks are aligned to the
bottom-right corner of *each sequence's* score matrix. For a sequence with 2 queries and 5 keys,
causal=True::

    1 1 1 1 0
    1 1 1 1 1

and with 5 queries and 2 keys (rows 0-2 see no key: their output is 0 and their lse +inf)::

    0 0
    0 0
    0 0
    1 0
    1 1

Sequences may be empty (length 0 on either side); a query sequence whose key sequence is empty gives
out = 0 and lse = +inf, and no gradient.

Paged keys (``block_table``, forward only, flash-attn 2's convention): k and v are then page pools of
shape (num_pages, page_size, nheads_k, headdim) and block_table is int32 (batch, max_pages_per_seq).
Sequence b's key j is row ``j % page_size`` of page ``block_table[b, j // page_size]``; cu_seqlens_k
still gives the key lengths (``cu_seqlens_k[b + 1] - cu_seqlens_k[b]``), but no longer offsets into k.
With page_size 16 and block_table[b] = [7, 2, ...], a sequence of 20 keys reads::

    keys  0..15  -> k[7, 0:16]
    keys 16..19  -> k[2, 0:4]

Entries past a sequence's last page are never read (they may hold anything).
"""

from __future__ import annotations

import torch

from . import fp8, ops_fp8
from .autograd import FlashAttnVarlenFunction, FlashAttnVarlenPagedFunction
from .options import AttentionOptions
from .sinks import apply_sinks, check_sinks
from .validation import (
    check_cu_seqlens_pair,
    check_kv_like_q,
    check_options,
    check_paging,
    check_scale,
    check_tensor,
    check_varlen,
    max_seqlen_argument,
)


def flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int | torch.Tensor,
    max_seqlen_k: int | torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    block_table: torch.Tensor | None = None,
    *,
    q_descale: torch.Tensor | None = None,
    k_descale: torch.Tensor | None = None,
    v_descale: torch.Tensor | None = None,
    learnable_sink: torch.Tensor | None = None,
):
    """Exact attention over a packed batch of sequences of different lengths (see the module docstring).

    Args:
        q: (total_q, nheads, headdim), float16 / bfloat16 / float32, headdim 1..256.
        k, v: (total_k, nheads_k, headdim), nheads divisible by nheads_k (GQA/MQA: query head h uses kv
            head h // (nheads // nheads_k)).
        cu_seqlens_q, cu_seqlens_k: int32 (batch + 1,) on q's device: 0, then the running sums of the
            sequence lengths; the last entry is total_q (total_k).
        max_seqlen_q, max_seqlen_k: the longest query (key) sequence, or any larger bound; the kernels'
            grids are sized by them. An int, or a 0-d integer tensor (as torch.compile produces without
            ``.item()``): a tensor's value is not read, the exact maximum is taken from cu_seqlens
            instead (on the GPU, one small device-to-host copy).
        dropout_p, softmax_scale, causal, window_size, softcap: as in :func:`flashattn.flash_attn_func`,
            per sequence: query i of a sequence sees its key j when
            i + Sk - Sq - left <= j <= i + Sk - Sq + right, with that sequence's Sq and Sk.
        alibi_slopes: float32 (nheads,) or (batch, nheads); adds -slope * |i + Sk - Sq - j| per sequence.
        deterministic: accepted for compatibility; the backward is always deterministic (no atomics).
        return_attn_probs: also return the log-sum-exp.
        block_table: optional int32 (batch, max_pages_per_seq): paged keys (see the module docstring).
            k and v are then (num_pages, page_size, nheads_k, headdim) with page_size a multiple of 16
            (flash-attn 2 needs 256), and sequence b's key j is ``k[block_table[b, j // page_size],
            j % page_size]``; cu_seqlens_k gives the key lengths, each at most max_pages_per_seq *
            page_size, and max_seqlen_k must not exceed that either. Forward only, as in flash-attn: a
            backward through the output raises RuntimeError. Dropout keys Philox as if the keys were
            packed (key j of sequence b is packed key ``cu_seqlens_k[b] + j``), so a paged call gives
            the unpaged call's result on the gathered keys.
        q_descale, k_descale, v_descale: FP8 inputs only (q, k, v ``torch.float8_e4m3fn``): float32 descales of
            shape (batch, nheads_k), one per sequence and kv head (see :func:`flashattn.flash_attn_func`); the
            call is forward only and returns bfloat16. On the GPU, FP8 paged keys are refused (no kernel).
        learnable_sink: attention sinks, (nheads,), as in :func:`flashattn.flash_attn_func` (with paged keys the
            call stays forward only). Not with FP8 inputs.

    Returns:
        out of q's shape and dtype (bfloat16 for FP8 inputs); or, with ``return_attn_probs``,
        ``(out, softmax_lse, None)`` where softmax_lse is float32 (nheads, total_q), flash-attn 2's varlen
        layout, in natural log (+inf for a row that sees no key). The third item, flash-attn's ``S_dmask``, is
        always None.

    Dropout draws from the packed stream: the score of query token tq (a row of q) and key token tk (a
    row of k) in head h takes Philox counter ``offset + (h * total_q + tq) * total_k + tk``
    (``flashattn.dropout``), so the CPU path, the kernels and the reference drop the same scores.

    On the GPU with integer max lengths, cu_seqlens' values are trusted, as in flash-attn (checking them
    would synchronize every call); on the CPU, or when a max length is a tensor, they are checked. The
    same holds for block_table: its entries for the pages in use are checked (in [0, num_pages)) when it
    is on the CPU (or the torch path reads it anyway), the key lengths against its capacity wherever
    cu_seqlens are read. On the GPU the
    kernel reads page 0 for a page index outside the pool and cuts a too long sequence at the table's
    capacity: a bad index gives a wrong answer, never a read outside k and v.
    """
    paged = block_table is not None
    descales = {"q_descale": q_descale, "k_descale": k_descale, "v_descale": v_descale}
    if fp8.is_fp8(q) or any(d is not None for d in descales.values()):
        fp8.refuse_options(learnable_sink=learnable_sink)
        out, lse = _fp8_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                               softmax_scale, causal, window_size, softcap, alibi_slopes, block_table, descales)
        return (out, lse, None) if return_attn_probs else out
    check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, dropout_p, window_size, softcap, alibi_slopes, paged,
                 softmax_scale)
    check_sinks("learnable_sink", learnable_sink, q.shape[1], q.device)
    max_q = max_seqlen_argument("max_seqlen_q", max_seqlen_q)
    max_k = max_seqlen_argument("max_seqlen_k", max_seqlen_k)
    opts = AttentionOptions.build(q.shape[-1], softmax_scale, causal, window_size, softcap, dropout_p,
                                  deterministic)
    if paged:
        check_paging(block_table, k, cu_seqlens_q.shape[0] - 1, max_k, q.device)
        out, lse = FlashAttnVarlenPagedFunction.apply(q, k, v, cu_seqlens_q, cu_seqlens_k, max_q, max_k,
                                                      alibi_slopes, block_table, opts)
        out, lse, _ = apply_sinks(out, lse, learnable_sink)  # a backward still raises, as without sinks
        return (out, lse, None) if return_attn_probs else out
    # torch.compile refuses one tensor passed twice to an autograd.Function (qkvpacked does): None stands
    # for "the same as cu_seqlens_q"
    shared_cu_seqlens = None if cu_seqlens_k is cu_seqlens_q else cu_seqlens_k
    out, lse = FlashAttnVarlenFunction.apply(q, k, v, cu_seqlens_q, shared_cu_seqlens, max_q, max_k, alibi_slopes,
                                             opts, None, learnable_sink)
    return (out, lse, None) if return_attn_probs else out


def _fp8_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
                window_size, softcap, alibi_slopes, block_table, descales: dict):
    """flash_attn_varlen_func's checks and op for float8 inputs."""
    if not fp8.is_fp8(q):
        raise TypeError(f"q_descale, k_descale and v_descale apply to float8_e4m3fn inputs, but q is {q.dtype}")
    fp8.check_inputs({"q": q, "k": k, "v": v})
    paged = block_table is not None
    for name, x, rank in (("q", q, 3), ("k", k, 4 if paged else 3), ("v", v, 4 if paged else 3)):
        if x.dim() != rank:
            raise ValueError(f"{name} must have {rank} dimensions, got shape {tuple(x.shape)}")
    check_kv_like_q(q, k, v)
    batch = check_cu_seqlens_pair(cu_seqlens_q, cu_seqlens_k, q.device)
    fp8.refuse_options(dropout_p=dropout_p, alibi_slopes=alibi_slopes)
    check_options(0.0, window_size, softcap)
    check_scale("softmax_scale", softmax_scale)
    fp8.check_descales(q, k, descales, batch, None)
    max_q = max_seqlen_argument("max_seqlen_q", max_seqlen_q)
    max_k = max_seqlen_argument("max_seqlen_k", max_seqlen_k)
    if paged:
        check_paging(block_table, k, batch, max_k, q.device)
    opts = AttentionOptions.build(q.shape[-1], softmax_scale, causal, window_size, softcap, 0.0, False)
    return ops_fp8.varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_q, max_k, *descales.values(), opts, block_table)


def flash_attn_varlen_qkvpacked_func(
    qkv: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int | torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
):
    """:func:`flash_attn_varlen_func` on qkv of shape (total, 3, nheads, headdim); no copies are made."""
    check_tensor("qkv", qkv, 4, "(total_tokens, 3, nheads, headdim)")
    if qkv.shape[1] != 3:
        raise ValueError(f"qkv must have shape (total_tokens, 3, nheads, headdim), got {tuple(qkv.shape)}")
    q, k, v = qkv.unbind(dim=1)
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, softmax_scale,
                                  causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs)


def flash_attn_varlen_kvpacked_func(
    q: torch.Tensor,
    kv: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int | torch.Tensor,
    max_seqlen_k: int | torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
):
    """:func:`flash_attn_varlen_func` on q and kv of shape (total_k, 2, nheads_k, headdim)."""
    check_tensor("kv", kv, 4, "(total_tokens, 2, nheads_k, headdim)")
    if kv.shape[1] != 2:
        raise ValueError(f"kv must have shape (total_tokens, 2, nheads_k, headdim), got {tuple(kv.shape)}")
    k, v = kv.unbind(dim=1)
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                  softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs)
