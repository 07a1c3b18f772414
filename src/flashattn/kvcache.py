"""Inference entry points with flash-attn's signatures: attention over a KV cache, and the merge of
attention results computed over disjoint key sets.

``flash_attn_with_kvcache`` appends the new keys/values into the cache in place and attends over the
valid part of the cache. Batch element b sees the cache positions ``[leftpad_b, cache_seqlens_b +
seqlen_new)`` as its keys ``0 .. seqlen_k_b - 1``, and causal/window masks are aligned to the
bottom-right corner of that range, as in ``flash_attn_func``. For seqlen_q = 2 and a cache holding 3
keys before 2 new ones are appended (seqlen_k = 5), causal=True gives::

    keys:  c0 c1 c2 n0 n1
    q0:     1  1  1  1  0
    q1:     1  1  1  1  1

``flash_attn_combine`` merges partial results by their log-sum-exps (split-KV decoding, ring attention).
"""

from __future__ import annotations

import torch

from . import decode_ops, ops
from .interface import MAX_HEAD_DIM, SUPPORTED_DTYPES, _check_alibi, _check_options, _check_tensor
from .options import AttentionOptions

PAGE_MULTIPLE = 16
COMBINE_DTYPES = (*SUPPORTED_DTYPES, torch.float64)


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------


def _check_like(name: str, x, reference: torch.Tensor, reference_name: str) -> None:
    if x.dtype != reference.dtype:
        raise TypeError(f"{name} must have {reference_name}'s dtype {reference.dtype}, got {x.dtype}")
    if x.device != reference.device:
        raise ValueError(f"{name} must be on {reference_name}'s device {reference.device}, got {x.device}")


def _check_index(name: str, x, shape: tuple[int, ...], device: torch.device) -> None:
    """An int32 index tensor of the given shape (None for an unchecked dimension) on ``device``."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of int32, got {type(x).__name__}")
    if x.dtype != torch.int32:
        raise TypeError(f"{name} must be int32, got {x.dtype}")
    if x.dim() != len(shape) or any(s is not None and s != n for s, n in zip(shape, x.shape, strict=False)):
        wanted = ", ".join("*" if s is None else str(s) for s in shape)
        raise ValueError(f"{name} must have shape ({wanted}), got {tuple(x.shape)}")
    if x.device != device:
        raise ValueError(f"{name} must be on q's device {device}, got {x.device}")


def _validate_options(q: torch.Tensor, window_size, softcap: float, alibi_slopes) -> None:
    batch, _, nheads, _ = q.shape
    _check_options(0.0, window_size, softcap)  # no dropout at inference
    _check_alibi(alibi_slopes, batch, nheads, q.device)


def _validate_cache(q, k_cache, v_cache, k, v, block_table, cache_batch_idx) -> int:
    """Checks shapes, dtypes and devices of q, the caches and the new keys; returns the cache capacity."""
    _check_tensor("q", q, 4)
    batch, seqlen_q, nheads, head_dim = q.shape
    if seqlen_q == 0:
        raise ValueError("q must hold at least one query (seqlen_q >= 1)")
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"head dim must be between 1 and {MAX_HEAD_DIM}, got {head_dim}")
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        _check_tensor(name, cache, 4)
        _check_like(name, cache, q, "q")
        if cache.stride(-1) != 1:
            raise ValueError(f"{name} must have a contiguous last dimension (it is read and written in place), "
                             f"got strides {cache.stride()}")
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache and v_cache must have the same shape, got {tuple(k_cache.shape)} and "
                         f"{tuple(v_cache.shape)}")
    if k_cache.shape[3] != head_dim:
        raise ValueError(f"k_cache and v_cache must have q's head dim {head_dim}, got {k_cache.shape[3]}")
    nheads_k = k_cache.shape[2]
    if nheads_k == 0 or nheads % nheads_k != 0:
        raise ValueError(f"the number of query heads ({nheads}) must be a multiple of the number of "
                         f"key/value heads in k_cache ({nheads_k})")
    cache_rows = batch if cache_batch_idx is None else None  # rows the cache (or block table) must have
    if block_table is not None:
        _check_index("block_table", block_table, (None, None), q.device)
        page_size = k_cache.shape[1]
        if page_size % PAGE_MULTIPLE != 0:
            raise ValueError(f"with a block_table, the page size k_cache.shape[1] must be a multiple of "
                             f"{PAGE_MULTIPLE}, got {page_size}")
        if cache_rows is not None and block_table.shape[0] < cache_rows:
            raise ValueError(f"block_table must have a row per batch element ({batch}), got {block_table.shape[0]}")
        capacity = block_table.shape[1] * page_size
    else:
        if cache_rows is not None and k_cache.shape[0] < cache_rows:
            raise ValueError(f"k_cache must hold a sequence per batch element ({batch}), got {k_cache.shape[0]} "
                             f"(pass cache_batch_idx to address the cache's rows)")
        capacity = k_cache.shape[1]
    if (k is None) != (v is None):
        raise ValueError("k and v must be given together (new keys and values to append), or both be None")
    if k is not None:
        for name, x in (("k", k), ("v", v)):
            _check_tensor(name, x, 4)
            _check_like(name, x, q, "q")
            if x.shape[0] != batch or x.shape[2:] != k_cache.shape[2:] or x.shape[1] == 0:
                raise ValueError(f"{name} must have shape (batch={batch}, seqlen_new >= 1, nheads_k={nheads_k}, "
                                 f"headdim={head_dim}), got {tuple(x.shape)}")
        if k.shape != v.shape:
            raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    return capacity


def _validate_rotary(rotary_cos, rotary_sin, q, k, capacity: int) -> None:
    if rotary_cos is None and rotary_sin is None:
        return
    if rotary_cos is None or rotary_sin is None:
        raise ValueError("rotary_cos and rotary_sin must be given together")
    if k is None:
        raise ValueError("rotary_cos/rotary_sin rotate the new keys k and the queries: they need k and v")
    for name, table in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
        if not isinstance(table, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(table).__name__}")
        if not table.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {table.dtype}")
        if table.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}, got {table.device}")
        if table.dim() != 2 or table.shape[1] == 0 or 2 * table.shape[1] > q.shape[-1]:
            raise ValueError(f"{name} must have shape (seqlen_ro, rotary_dim / 2) with rotary_dim <= head dim "
                             f"{q.shape[-1]}, got {tuple(table.shape)}")
        if table.shape[0] < capacity:
            raise ValueError(f"{name} must cover every cache position: seqlen_ro >= {capacity}, "
                             f"got {table.shape[0]}")
        if table.stride(-1) != 1:
            raise ValueError(f"{name} must have a contiguous last dimension, got strides {table.stride()}")
    if rotary_cos.shape != rotary_sin.shape:
        raise ValueError(f"rotary_cos and rotary_sin must have the same shape, got {tuple(rotary_cos.shape)} "
                         f"and {tuple(rotary_sin.shape)}")


def _cache_seqlens_tensor(cache_seqlens, batch: int, capacity: int, seqlen_new: int, device) -> torch.Tensor:
    """cache_seqlens as an int32 (batch,) tensor; an int (or None: a full cache) is checked here."""
    if cache_seqlens is None or isinstance(cache_seqlens, int):
        length = capacity if cache_seqlens is None else cache_seqlens
        if length < 0:
            raise ValueError(f"cache_seqlens must be >= 0, got {length}")
        if length + seqlen_new > capacity:
            raise ValueError(f"the cache is too small for the append: cache_seqlens ({length}) + seqlen_new "
                             f"({seqlen_new}) > cache capacity {capacity}")
        return torch.full((batch,), length, dtype=torch.int32, device=device)
    _check_index("cache_seqlens", cache_seqlens, (batch,), device)
    return cache_seqlens


def _check_indices(cache_seqlens, cache_batch_idx, cache_leftpad, block_table, k_cache, capacity: int,
                   seqlen_new: int) -> None:
    """Refuse index values that would reach outside the cache, with one device-to-host copy.

    The kernels clamp and mask every index anyway (a bad one never writes out of bounds): this check is
    what turns a bad index into an error rather than a silently wrong answer.
    """
    total = cache_seqlens.long() + seqlen_new
    problems: list[tuple[torch.Tensor, str]] = [
        ((cache_seqlens < 0) | (total > capacity),
         f"the cache is too small for the append: cache_seqlens + seqlen_new ({seqlen_new}) must be <= the "
         f"cache capacity {capacity} (and cache_seqlens >= 0)"),
    ]
    rows_available = block_table.shape[0] if block_table is not None else k_cache.shape[0]
    rows = torch.arange(cache_seqlens.shape[0], device=cache_seqlens.device)
    if cache_batch_idx is not None:
        problems.append(((cache_batch_idx < 0) | (cache_batch_idx >= rows_available),
                         f"cache_batch_idx must index the cache's {rows_available} rows"
                         + (" (rows of block_table)" if block_table is not None else "")))
        rows = cache_batch_idx.long().clamp(0, max(rows_available - 1, 0))
    if cache_leftpad is not None:
        problems.append(((cache_leftpad < 0) | (cache_leftpad > cache_seqlens),
                         "cache_leftpad must satisfy 0 <= cache_leftpad <= cache_seqlens"))
    if block_table is not None:
        page_size = k_cache.shape[1]
        pages_used = (total.clamp(0, capacity) + page_size - 1) // page_size
        used = torch.arange(block_table.shape[1], device=block_table.device) < pages_used.view(-1, 1)
        entries = block_table[rows]
        problems.append((used & ((entries < 0) | (entries >= k_cache.shape[0])),
                         f"block_table holds a block index outside [0, {k_cache.shape[0]}) (k_cache.shape[0]) "
                         f"among the pages the sequences use"))
    flags = torch.stack([bad.any() for bad, _ in problems]).tolist()
    for flagged, (bad, message) in zip(flags, problems, strict=True):
        if flagged:
            where = tuple(int(i) for i in bad.nonzero()[0])
            raise ValueError(f"{message}; first bad entry at index {where}")


# ---------------------------------------------------------------------------------------------
# flash_attn_with_kvcache
# ---------------------------------------------------------------------------------------------


def flash_attn_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    rotary_cos: torch.Tensor | None = None,
    rotary_sin: torch.Tensor | None = None,
    cache_seqlens: int | torch.Tensor | None = None,
    cache_batch_idx: torch.Tensor | None = None,
    cache_leftpad: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    alibi_slopes: torch.Tensor | None = None,
    num_splits: int = 0,
    return_softmax_lse: bool = False,
    *,
    check_indices: bool = True,
):
    """Attention of q over a KV cache, after appending the new keys/values k, v to it in place.

    Forward only (no gradient), as in flash-attn. Batch element b attends to the cache positions
    ``[cache_leftpad[b], cache_seqlens[b] + seqlen_new)``, the new keys included; causal and window masks
    are bottom-right aligned to that range (see the module docstring). Query heads sharing a kv head are
    processed together, so each K/V tile is read once per group.

    Args:
        q: (batch, seqlen_q, nheads, headdim), float16 / bfloat16 / float32, headdim 1..256.
        k_cache, v_cache: (batch_cache, seqlen_cache, nheads_k, headdim), or with a ``block_table``
            (num_blocks, page_size, nheads_k, headdim) with page_size a multiple of 16. Same dtype as q,
            last dimension contiguous. Updated in place when k, v are given.
        k, v: optional (batch, seqlen_new, nheads_k, headdim): written into the cache at positions
            ``cache_seqlens[b] + t`` (k rotated first when rotary tables are given); nothing else in
            the cache changes.
        rotary_cos, rotary_sin: optional (seqlen_ro, rotary_dim / 2) with seqlen_ro >= the cache capacity
            and rotary_dim <= headdim. Rotate the new keys at positions ``cache_seqlens[b] + t``, and q at
            positions ``cache_seqlens[b] + i`` when causal or windowed, else all at ``cache_seqlens[b]``
            (flash-attn's convention). Need k and v.
        cache_seqlens: int or int32 (batch,): keys already in each cache row; None means full.
        cache_batch_idx: optional int32 (batch,): the cache row (or block-table row) of each batch element.
            With duplicate rows and an append, which write lands is unspecified.
        cache_leftpad: optional int32 (batch,): cache positions before it are not keys.
        block_table: optional int32 (batch or batch_cache, max_blocks): the cache blocks of each sequence,
            position p living at ``k_cache[block_table[row, p // page_size], p % page_size]``.
        softmax_scale, causal, window_size, softcap, alibi_slopes: as in :func:`flash_attn_func`, with
            seqlen_k = the number of keys each batch element sees.
        rotary_interleaved: True rotates dims (2j, 2j+1) (GPT-J); False rotates (j, j + rotary_dim / 2)
            (GPT-NeoX).
        num_splits: split each sequence's keys into this many chunks merged by their log-sum-exps
            (flash-decoding); 0 chooses from the GPU's processor count; 1 never splits. The torch path
            ignores it (it computes the unsplit result).
        return_softmax_lse: also return the float32 (batch, nheads, seqlen_q) log-sum-exp (natural log,
            +inf for a row that sees no key).
        check_indices: refuse cache_seqlens / cache_batch_idx / cache_leftpad / block_table values that
            reach outside the cache (ValueError). Costs one device-to-host copy (a synchronization) when
            any of them is a tensor; pass False for CUDA graphs or to keep the host ahead of the GPU. The
            kernels never access memory outside the cache either way.

    Returns:
        out (batch, seqlen_q, nheads, headdim) in q's dtype, or ``(out, softmax_lse)``.
    """
    tensors = (q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, cache_leftpad, block_table, rotary_cos,
               rotary_sin, alibi_slopes)
    options = (softmax_scale, causal, window_size, softcap, rotary_interleaved, num_splits)
    if not check_indices and _plannable_step(tensors, options):
        # the whole step (its checks and choices, then its launches) replayed from the plan of an earlier step of
        # the same signature: a serving loop's step, whose host time is otherwise several times its GPU time
        out, lse = ops.planned("flash_attn_with_kvcache", tensors, options,
                               lambda: _kvcache_step(*tensors, *options, False), decode_ops.plan_switches())
    else:
        out, lse = _kvcache_step(*tensors, *options, check_indices)
    return (out, lse) if return_softmax_lse else out


def _plannable_step(tensors: tuple, options: tuple) -> bool:
    """Whether a step may take a launch plan as a whole: CUDA tensors (cache_seqlens among them) read in place, none
    requiring grad (the op must then refuse a backward), plain Python scalars and a window tuple, so that a plan key
    (``ops.planned``) holds everything its checks and choices read."""
    q, cache_seqlens = tensors[0], tensors[5]
    window_size = options[2]
    return (type(q) is torch.Tensor and q.is_cuda and type(cache_seqlens) is torch.Tensor
            and all(x is None or (type(x) is torch.Tensor and not x.requires_grad) for x in tensors)
            and all(x is None or type(x) in (bool, int, float) for x in options if x is not window_size)
            and type(window_size) is tuple and len(window_size) == 2 and all(type(w) is int for w in window_size)
            and ops._plannable(tensors, None, None) and not torch.compiler.is_compiling())


def _kvcache_step(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, cache_leftpad, block_table, rotary_cos,
                  rotary_sin, alibi_slopes, softmax_scale, causal, window_size, softcap, rotary_interleaved, num_splits,
                  check_indices):
    """:func:`flash_attn_with_kvcache`'s checks, then its op: (out, lse)."""
    capacity = _validate_cache(q, k_cache, v_cache, k, v, block_table, cache_batch_idx)
    batch = q.shape[0]
    seqlen_new = 0 if k is None else k.shape[1]
    _validate_rotary(rotary_cos, rotary_sin, q, k, capacity)
    _validate_options(q, window_size, softcap, alibi_slopes)
    for name, index in (("cache_batch_idx", cache_batch_idx), ("cache_leftpad", cache_leftpad)):
        if index is not None:
            _check_index(name, index, (batch,), q.device)
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 0:
        raise ValueError(f"num_splits must be an int >= 0 (0: automatic), got {num_splits!r}")
    seqlens = _cache_seqlens_tensor(cache_seqlens, batch, capacity, seqlen_new, q.device)
    index_tensors = (cache_seqlens if isinstance(cache_seqlens, torch.Tensor) else None, cache_batch_idx,
                     cache_leftpad, block_table)
    if check_indices and any(x is not None for x in index_tensors):  # an int cache_seqlens is checked already
        _check_indices(seqlens, cache_batch_idx, cache_leftpad, block_table, k_cache, capacity, seqlen_new)

    opts = AttentionOptions.build(q.shape[-1], softmax_scale, causal, window_size, softcap, 0.0, False)
    if k is not None:  # one op: on the GPU a short append shares the attention's launch
        out, lse = ops.eager_call(
            decode_ops.kvcache_append_attention, decode_ops.kvcache_append_attention_cuda, q, k_cache, v_cache, k,
            v, seqlens, cache_batch_idx, cache_leftpad, block_table, rotary_cos, rotary_sin, alibi_slopes,
            opts.softmax_scale, opts.window_left, opts.window_right, opts.softcap, bool(rotary_interleaved),
            num_splits,
        )
    else:
        out, lse = ops.eager_call(
            decode_ops.kvcache_attention, decode_ops.kvcache_attention_cuda, q, k_cache, v_cache, seqlens,
            cache_batch_idx, cache_leftpad, block_table, rotary_cos, rotary_sin, alibi_slopes, 0, opts.softmax_scale,
            opts.window_left, opts.window_right, opts.softcap, bool(rotary_interleaved), num_splits,
        )
    return out, lse


# ---------------------------------------------------------------------------------------------
# flash_attn_combine
# ---------------------------------------------------------------------------------------------


class CombineFunction(torch.autograd.Function):
    """Bookkeeping only: the backward recomputes the weights from the saved partial log-sum-exps."""

    @staticmethod
    def forward(ctx, out_partial, lse_partial):
        out, lse = decode_ops.attention_combine(out_partial, lse_partial)
        ctx.save_for_backward(out_partial, lse_partial)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        out_partial, lse_partial = ctx.saved_tensors
        return decode_ops.attention_combine_backward(dout, dlse, out_partial, lse_partial)


def flash_attn_combine(out_partial: torch.Tensor, lse_partial: torch.Tensor, out_dtype: torch.dtype | None = None):
    """Merge attention results computed over disjoint key sets, by their log-sum-exps. Differentiable.

    Split s attended to keys K_s and gave the normalized output o_s with log-sum-exp l_s (what
    ``flash_attn_func(..., return_attn_probs=True)`` or ``flash_attn_with_kvcache(...,
    return_softmax_lse=True)`` return). Over the union of the K_s: ``lse = log sum_s exp(l_s)`` and
    ``out = sum_s exp(l_s - lse) o_s``. A split whose l_s is +inf (flashattn's empty row) or -inf saw no
    key: its weight is 0 and its o_s is never read. A row whose splits are all empty gives out = 0 and
    lse = +inf.

    Args:
        out_partial: (num_splits, batch, seqlen, nheads, headdim), float16 / bfloat16 / float32 / float64.
        lse_partial: (num_splits, batch, nheads, seqlen), float32 (or float64), natural log. This is
            flashattn's (and flash-attn 2's) lse layout stacked over splits; flash-attn 3's combine takes
            (num_splits, batch, seqlen, nheads): pass ``lse.transpose(-1, -2)`` (any strides work).
        out_dtype: dtype of ``out``; default out_partial's.

    Returns:
        ``(out, lse)``: out (batch, seqlen, nheads, headdim), lse (batch, nheads, seqlen) in lse_partial's
        dtype. Both carry gradients to out_partial and lse_partial.
    """
    for name, x, rank in (("out_partial", out_partial, 5), ("lse_partial", lse_partial, 4)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != rank:
            raise ValueError(f"{name} must have {rank} dimensions, got shape {tuple(x.shape)}")
    if out_partial.dtype not in COMBINE_DTYPES:
        raise TypeError(f"out_partial must be float16, bfloat16, float32 or float64, got {out_partial.dtype}")
    if lse_partial.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"lse_partial must be float32 or float64, got {lse_partial.dtype}")
    if lse_partial.device != out_partial.device:
        raise ValueError(f"lse_partial must be on out_partial's device {out_partial.device}, got {lse_partial.device}")
    num_splits, batch, seqlen, nheads, _ = out_partial.shape
    if tuple(lse_partial.shape) != (num_splits, batch, nheads, seqlen):
        raise ValueError(f"lse_partial must have shape (num_splits, batch, nheads, seqlen) = "
                         f"{(num_splits, batch, nheads, seqlen)} to match out_partial {tuple(out_partial.shape)}, "
                         f"got {tuple(lse_partial.shape)}")
    if num_splits == 0:
        raise ValueError("out_partial must hold at least one split (num_splits >= 1)")
    out, lse = CombineFunction.apply(out_partial, lse_partial)
    if out_dtype is not None and out_dtype != out.dtype:
        out = out.to(out_dtype)
    return out, lse
