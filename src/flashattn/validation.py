"""Argument checks shared by the public functions: what every call is given is checked here, before any launch
plan is looked up or any kernel runs, and a bad value raises naming the argument and what was expected.

Checks that need index values on the host (cu_seqlens, block tables, cache indices) read them only where that costs
no GPU synchronization or the caller asked for it.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch

from . import faults

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


MAX_HEAD_DIM = 256


def check_tensor(name: str, x, rank: int, layout: str = "(batch, seqlen, nheads, headdim)") -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != rank:
        raise ValueError(f"{name} must have {rank} dimensions {layout}, got shape {tuple(x.shape)}")
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{name} must be float16, bfloat16 or float32, got {x.dtype}")


def check_kv_like_q(q, k, v) -> None:
    """k and v against q: dtype, device, shapes and heads (GQA), whatever the layout's rank."""
    for name, x in (("k", k), ("v", v)):
        if x.dtype != q.dtype:
            raise TypeError(f"{name} must have q's dtype {q.dtype}, got {x.dtype}")
        if x.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}, got {x.device}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    nheads, head_dim = q.shape[-2:]
    if k.shape[-1] != head_dim:
        raise ValueError(f"k and v must have q's head dim {head_dim}, got {k.shape[-1]}")
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"head dim must be between 1 and {MAX_HEAD_DIM}, got {head_dim}")
    nheads_k = k.shape[-2]
    if nheads_k == 0 or nheads % nheads_k != 0:
        raise ValueError(f"the number of query heads ({nheads}) must be a multiple of the number of "
                         f"key/value heads ({nheads_k}){transposed_hint(q, k)}")


def transposed_hint(q, k) -> str:
    """A hint for 4-dim inputs whose dims 1 and 2 would fit as (nheads, seqlen), torch SDPA's order: a condition, since
    (batch, seqlen, nheads, headdim) inputs with bad head counts can fit that order too."""
    if q.dim() != 4 or k.dim() != 4 or k.shape[1] == 0 or q.shape[1] % k.shape[1] != 0:
        return ""
    return ("; if q, k and v are (batch, nheads, seqlen, headdim), torch's scaled_dot_product_attention layout: "
            "flashattn takes (batch, seqlen, nheads, headdim), pass x.transpose(1, 2) (a view, read in place)")


def _real(name: str, value, expected: str) -> float:
    """``value`` as a float, or TypeError naming the argument: a real number (not a bool) was expected."""
    scalar_tensor = isinstance(value, torch.Tensor) and value.dim() == 0 and value.dtype.is_floating_point
    if (isinstance(value, bool) or not isinstance(value, numbers.Real)) and not scalar_tensor:
        raise TypeError(f"{name} must be {expected}, got {type(value).__name__} {value!r}")
    return float(value)


def check_scale(name: str, value) -> None:
    """A softmax scale: None (1 / sqrt(headdim)) or a number finite in float32 (NaN or infinity: every output NaN)."""
    if value is None:
        return
    if not abs(_real(name, value, "a finite float or None")) <= torch.finfo(torch.float32).max:  # NaN fails too
        raise ValueError(f"{name} must be a finite float (in float32) or None (1 / sqrt(headdim)), got {value}")


def check_options(dropout_p, window_size, softcap) -> None:
    if not 0.0 <= _real("dropout_p", dropout_p, "a float in [0, 1)") < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    pair = "window_size must be a pair (left, right) of ints (negative: unbounded), got"
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        raise TypeError(f"{pair} {type(window_size).__name__} {window_size!r}")
    for w in window_size:
        if isinstance(w, bool) or not isinstance(w, numbers.Real) or not math.isfinite(w) or int(w) != w:
            raise TypeError(f"{pair} {window_size!r}")
        if not -2**63 <= w < 2**63:  # an int64; negative is unbounded (flash-attn's rule), as is a wide one
            raise ValueError(f"{pair} {window_size!r}, each in [-2**63, 2**63)")
    capped = _real("softcap", softcap, "a float >= 0 (0: off)")
    if not 0 <= capped < math.inf:  # NaN fails the comparisons
        raise ValueError(f"softcap must be a finite float >= 0 (0: off), got {softcap}")


def check_cu_seqlens_pair(cu_seqlens_q, cu_seqlens_k, device: torch.device) -> int:
    """Both offset tensors valid and of one length; returns the batch."""
    check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, device)
    check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, device)
    batch = cu_seqlens_q.shape[0] - 1
    if cu_seqlens_k.shape[0] != batch + 1:
        raise ValueError(f"cu_seqlens_k must have cu_seqlens_q's length batch + 1 = {batch + 1}, "
                         f"got {cu_seqlens_k.shape[0]}")
    return batch


def check_alibi(alibi_slopes, batch: int, nheads: int, device: torch.device) -> None:
    if alibi_slopes is None:
        return
    if not isinstance(alibi_slopes, torch.Tensor):
        raise TypeError(f"alibi_slopes must be a torch.Tensor, got {type(alibi_slopes).__name__}")
    if alibi_slopes.dtype != torch.float32:
        raise TypeError(f"alibi_slopes must be float32, got {alibi_slopes.dtype}")
    if tuple(alibi_slopes.shape) not in ((nheads,), (batch, nheads)):
        raise ValueError(f"alibi_slopes must have shape ({nheads},) or ({batch}, {nheads}), "
                         f"got {tuple(alibi_slopes.shape)}")
    if alibi_slopes.device != device:
        raise ValueError(f"alibi_slopes must be on q's device {device}, got {alibi_slopes.device}")


def check_dense(q, k, v, dropout_p, window_size, softcap, alibi_slopes, softmax_scale=None, empty_ok=False) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, x, 4)
    check_kv_like_q(q, k, v)
    batch, _, nheads, _ = q.shape
    if k.shape[0] != batch:
        raise ValueError(f"k must have q's batch size {batch}, got {k.shape[0]}")
    if not empty_ok and (q.shape[1] == 0 or k.shape[1] == 0):
        raise ValueError(f"seqlens must be >= 1, got seqlen_q={q.shape[1]}, seqlen_k={k.shape[1]}")
    check_options(dropout_p, window_size, softcap)
    check_scale("softmax_scale", softmax_scale)
    check_alibi(alibi_slopes, batch, nheads, q.device)



PACKED = "(total_tokens, nheads, headdim)"


PAGED = "(num_pages, page_size, nheads_k, headdim) with a block_table"


def check_cu_seqlens(name: str, cu_seqlens, device: torch.device) -> None:
    if not isinstance(cu_seqlens, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of dtype int32, got {type(cu_seqlens).__name__}")
    if cu_seqlens.dtype != torch.int32:
        raise TypeError(f"{name} must have dtype torch.int32, got {cu_seqlens.dtype}")
    if cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 2:
        raise ValueError(f"{name} must have shape (batch + 1,) with batch >= 1, got {tuple(cu_seqlens.shape)}")
    if cu_seqlens.device != device:
        raise ValueError(f"{name} must be on q's device {device}, got {cu_seqlens.device}")


def max_seqlen_argument(name: str, value) -> int:
    """The op's integer: the value itself, or DERIVE_MAX_SEQLEN for a tensor (never read in the graph)."""
    if isinstance(value, torch.Tensor):
        if value.dim() != 0 or value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
            raise TypeError(f"{name} must be an int or a 0-d integer tensor, got a {value.dtype} tensor of "
                            f"shape {tuple(value.shape)}")
        return DERIVE_MAX_SEQLEN
    if isinstance(value, bool) or not isinstance(value, (numbers.Integral, torch.SymInt)):  # numpy's ints too
        raise TypeError(f"{name} must be an int or a 0-d integer tensor, got {type(value).__name__}")
    if not 0 <= value < 2**31:  # cu_seqlens are int32: no sequence is longer
        raise ValueError(f"{name} must be in [0, 2**31), got {value}")
    return value if isinstance(value, torch.SymInt) else int(value)


def check_paging(block_table, k, batch: int, max_seqlen_k: int, device: torch.device) -> None:
    """block_table's dtype, shape and device, the page size, and a max_seqlen_k that the table can hold."""
    check_index("block_table", block_table, (batch, None), device)
    page_size = k.shape[1]
    if page_size == 0 or page_size % PAGE_MULTIPLE != 0:
        raise ValueError(f"with a block_table, the page size k.shape[1] must be a positive multiple of "
                         f"{PAGE_MULTIPLE}, got {page_size}")
    capacity = block_table.shape[1] * page_size
    if max_seqlen_k != DERIVE_MAX_SEQLEN and max_seqlen_k > capacity:
        raise ValueError(f"max_seqlen_k must be at most the keys a block_table row can hold, block_table.shape[1] "
                         f"* page_size = {block_table.shape[1]} * {page_size} = {capacity}, got {max_seqlen_k}")


def check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, dropout_p, window_size, softcap, alibi_slopes,
                 paged: bool = False, softmax_scale=None) -> None:
    """Everything that can be checked without reading cu_seqlens' values.

    The values (non-decreasing, ending at the token counts, within max_seqlen) are checked by the op,
    where reading them costs no GPU synchronization (see :func:`resolve_packing`).
    """
    check_tensor("q", q, 3, PACKED)
    for name, x in (("k", k), ("v", v)):
        check_tensor(name, x, 4 if paged else 3, PAGED if paged else PACKED)
    check_kv_like_q(q, k, v)
    batch = check_cu_seqlens_pair(cu_seqlens_q, cu_seqlens_k, q.device)
    check_options(dropout_p, window_size, softcap)
    check_scale("softmax_scale", softmax_scale)
    check_alibi(alibi_slopes, batch, q.shape[1], q.device)



PAGE_MULTIPLE = 16


COMBINE_DTYPES = (*SUPPORTED_DTYPES, torch.float64)


def check_like(name: str, x, reference: torch.Tensor, reference_name: str) -> None:
    if x.dtype != reference.dtype:
        raise TypeError(f"{name} must have {reference_name}'s dtype {reference.dtype}, got {x.dtype}")
    if x.device != reference.device:
        raise ValueError(f"{name} must be on {reference_name}'s device {reference.device}, got {x.device}")


def check_index(name: str, x, shape: tuple[int, ...], device: torch.device) -> None:
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


def check_decode_options(q: torch.Tensor, window_size, softcap: float, alibi_slopes, softmax_scale=None) -> None:
    batch, _, nheads, _ = q.shape
    check_options(0.0, window_size, softcap)  # no dropout at inference
    check_scale("softmax_scale", softmax_scale)
    check_alibi(alibi_slopes, batch, nheads, q.device)


def check_cache(q, k_cache, v_cache, k, v, block_table, cache_batch_idx, cache_dtype=None) -> int:
    """Checks q, the caches and new keys (``cache_dtype``: theirs, the FP8 step's e4m3); returns the capacity."""
    check_tensor("q", q, 4)
    batch, seqlen_q, nheads, head_dim = q.shape
    if seqlen_q == 0:
        raise ValueError("q must hold at least one query (seqlen_q >= 1)")
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"head dim must be between 1 and {MAX_HEAD_DIM}, got {head_dim}")
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        _check_cache_tensor(name, cache, q, cache_dtype)
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
        check_index("block_table", block_table, (None, None), q.device)
        page_size = k_cache.shape[1]
        if page_size % PAGE_MULTIPLE != 0:
            raise ValueError(f"with a block_table, the page size k_cache.shape[1] must be a multiple of "
                             f"{PAGE_MULTIPLE}, got {page_size}")
        if cache_rows is not None and block_table.shape[0] < cache_rows:
            raise ValueError(f"block_table must have a row per batch element ({batch}), got {block_table.shape[0]}")
        if k_cache.shape[0] == 0:
            raise ValueError("with a block_table, k_cache and v_cache must hold at least one page, got 0")
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
            _check_cache_tensor(name, x, q, cache_dtype)
            if x.shape[0] != batch or x.shape[2:] != k_cache.shape[2:] or x.shape[1] == 0:
                raise ValueError(f"{name} must have shape (batch={batch}, seqlen_new >= 1, nheads_k={nheads_k}, "
                                 f"headdim={head_dim}), got {tuple(x.shape)}")
        if k.shape != v.shape:
            raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    return capacity


def _check_cache_tensor(name: str, x, q: torch.Tensor, cache_dtype) -> None:
    """A 4-d cache or new-key tensor of q's dtype and device, or of ``cache_dtype`` (its caller checked the rest)."""
    if cache_dtype is None:
        check_tensor(name, x, 4)
        check_like(name, x, q, "q")
    elif x.dtype != cache_dtype or x.device != q.device:
        raise TypeError(f"{name} must be {cache_dtype} on q's device {q.device}, got {x.dtype} on {x.device}")


def check_rotary(rotary_cos, rotary_sin, q, k, capacity: int) -> None:
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


def cache_seqlens_tensor(cache_seqlens, batch: int, capacity: int, seqlen_new: int, device) -> torch.Tensor:
    """cache_seqlens as an int32 (batch,) tensor; an int (or None: a full cache) is checked here."""
    if cache_seqlens is None or (isinstance(cache_seqlens, int) and not isinstance(cache_seqlens, bool)):
        length = capacity if cache_seqlens is None else cache_seqlens
        if length < 0:
            raise ValueError(f"cache_seqlens must be >= 0, got {length}")
        if length + seqlen_new > capacity:
            raise ValueError(f"the cache is too small for the append: cache_seqlens ({length}) + seqlen_new "
                             f"({seqlen_new}) > cache capacity {capacity}")
        return torch.full((batch,), length, dtype=torch.int32, device=device)
    check_index("cache_seqlens", cache_seqlens, (batch,), device)
    return cache_seqlens


def check_cache_indices(cache_seqlens, cache_batch_idx, cache_leftpad, block_table, k_cache, capacity: int,
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



DERIVE_MAX_SEQLEN = -1
"""A max_seqlen the caller gave as a tensor: the launcher takes the exact maximum from cu_seqlens."""


@dataclass(frozen=True)
class Packing:
    """A varlen batch as the kernels see it: device cu_seqlens, and the max lengths that size the grid."""

    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int

    @property
    def batch(self) -> int:
        return self.cu_seqlens_q.shape[0] - 1


def check_host_cu_seqlens(name: str, cu_seqlens: list[int], total: int | None, total_name: str) -> int:
    """Check one host copy of cu_seqlens; return its longest sequence. ``total`` None: any end (paged keys)."""
    if cu_seqlens[0] != 0:
        raise ValueError(f"{name} must start at 0, got {cu_seqlens[0]}")
    lengths = [end - start for start, end in zip(cu_seqlens, cu_seqlens[1:], strict=False)]
    for b, length in enumerate(lengths):
        if length < 0:
            raise ValueError(f"{name} must be non-decreasing (sequence lengths >= 0), but sequence {b} goes "
                             f"from {cu_seqlens[b]} to {cu_seqlens[b + 1]}")
    if total is not None and cu_seqlens[-1] != total:
        raise ValueError(f"{name} must end at the number of tokens, {total_name} = {total}, "
                         f"got {cu_seqlens[-1]}")
    return max(lengths)


def resolve_packing(cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, total_q: int, total_k: int | None,
                    max_seqlen_q: int, max_seqlen_k: int, need_host: bool = False,
                    ) -> tuple[Packing, list[int] | None, list[int] | None]:
    """Packing for the kernels, plus host copies of cu_seqlens where they were read.

    ``total_k`` None: the keys are paged, not packed, and cu_seqlens_k may end anywhere.

    cu_seqlens are read on the host, and checked, when that costs no GPU synchronization (CPU tensors),
    when a max_seqlen came as a tensor (the grid needs a host value: one small copy gives both), or
    when ``need_host`` (the CPU path loops over them). Otherwise, on the GPU with integer max lengths,
    they are trusted, as flash-attn does: checking them would stall every call on the device.
    """
    cu_seqlens_q, cu_seqlens_k = cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous()
    derive = DERIVE_MAX_SEQLEN in (max_seqlen_q, max_seqlen_k)
    host_q = host_k = None
    if need_host or derive or cu_seqlens_q.device.type == "cpu":
        # the device's recorded index faults ride along in the same copy: reported where the host waits anyway
        recorded = faults.pending_buffer(cu_seqlens_q.device)
        parts = [cu_seqlens_q, cu_seqlens_k] + ([] if recorded is None else [recorded])
        host = torch.cat(parts).tolist()
        if recorded is not None:
            faults.raise_from_values(cu_seqlens_q.device, host[-recorded.numel():])
        size = cu_seqlens_q.numel()
        host_q, host_k = host[:size], host[size : 2 * size]
        longest_q = check_host_cu_seqlens("cu_seqlens_q", host_q, total_q, "q.shape[0]")
        longest_k = check_host_cu_seqlens("cu_seqlens_k", host_k, total_k, "k.shape[0]")
        for name, given, longest in (("max_seqlen_q", max_seqlen_q, longest_q), ("max_seqlen_k", max_seqlen_k,
                                                                               longest_k)):
            if given != DERIVE_MAX_SEQLEN and given < longest:
                raise ValueError(f"{name} must be at least the longest sequence's length {longest}, got {given}")
        max_seqlen_q = longest_q if max_seqlen_q == DERIVE_MAX_SEQLEN else max_seqlen_q
        max_seqlen_k = longest_k if max_seqlen_k == DERIVE_MAX_SEQLEN else max_seqlen_k
    return Packing(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k), host_q, host_k


def check_block_table(block_table: torch.Tensor, cu_seqlens_k: list[int], num_pages: int, page_size: int,
                      read_entries: bool) -> None:
    """Refuse key lengths that the block table cannot hold, and (``read_entries``) page indices outside the
    pool among the pages the sequences use: the rest of a row is padding and may hold anything.

    ``cu_seqlens_k`` is the host copy. Reading the entries of a GPU table synchronizes: the caller asks for
    it where that costs nothing (a CPU table) or happens anyway (the torch path gathers through the table).
    """
    lengths = torch.tensor(cu_seqlens_k).diff()
    capacity = block_table.shape[1] * page_size
    longest = int(lengths.max())
    if longest > capacity:
        b = int(lengths.argmax())
        raise ValueError(f"cu_seqlens_k gives sequence {b} {longest} keys, more than block_table can hold: "
                         f"block_table.shape[1] * page_size = {block_table.shape[1]} * {page_size} = {capacity}")
    if not read_entries:
        return
    pages_used = (lengths + page_size - 1) // page_size
    used = torch.arange(block_table.shape[1]) < pages_used.view(-1, 1)
    block_table = block_table.cpu()
    bad = used & ((block_table < 0) | (block_table >= num_pages))
    if bad.any():
        b, column = (int(i) for i in bad.nonzero()[0])
        raise ValueError(f"block_table[{b}, {column}] = {int(block_table[b, column])} is not a page of k and v: "
                         f"the pages a sequence uses must lie in [0, {num_pages}) (k.shape[0])")



INDEX_CHECK_MODES = (True, False, "deferred")


def check_indices_mode(check_indices) -> None:
    if not any(check_indices is mode or (isinstance(mode, str) and check_indices == mode)
               for mode in INDEX_CHECK_MODES):
        raise ValueError(f"check_indices must be True (strict), False (off) or 'deferred' (recorded on the device, "
                         f"raised by flashattn.raise_recorded_faults), got {check_indices!r}")


def check_num_splits(num_splits) -> None:
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 0:
        raise ValueError(f"num_splits must be an int >= 0 (0: automatic), got {num_splits!r}")


def check_combine(out_partial, lse_partial) -> None:
    """out_partial (num_splits, batch, seqlen, nheads, headdim) and lse_partial (num_splits, batch, nheads, seqlen)."""
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
