"""The KV-cache entry points in plain PyTorch: the CPU path (and ``FLASHATTN_BACKEND=torch`` anywhere).

Same semantics as ``kernels/decode.py`` and ``kernels/combine.py``: the append writes rotated keys into
the cache (through the block table when paged), the attention gathers each batch element's valid keys
``[leftpad, cache_seqlens + seqlen_new)`` and runs the blocked forward of ``cpu.py`` over them, and the
combine merges partial results by their log-sum-exps. There is no split of the key range here: the
torch path computes the unsplit result, which every split count must match.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import cpu, faults
from .options import AttentionOptions


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """Rotary embedding of x (..., D) with angle tables cos/sin (..., rotary_dim / 2).

    Interleaved (GPT-J): dims (2j, 2j+1) turn by angle j. Not interleaved (GPT-NeoX): dims
    (j, j + rotary_dim / 2). Dims past rotary_dim are unchanged. Computed in float32 (float64 for float64
    x), returned in x's dtype.
    """
    rotary_dim = 2 * cos.shape[-1]
    compute = torch.promote_types(x.dtype, torch.float32)
    xf = x.to(compute)
    head, tail = xf[..., :rotary_dim], xf[..., rotary_dim:]
    cos, sin = cos.to(compute), sin.to(compute)
    if interleaved:
        even, odd = head[..., 0::2], head[..., 1::2]
        rotated = torch.stack((even * cos - odd * sin, odd * cos + even * sin), dim=-1).flatten(-2)
    else:
        first, second = head.chunk(2, dim=-1)
        rotated = torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)
    return torch.cat((rotated, tail), dim=-1).to(x.dtype)


@dataclass(frozen=True)
class CacheIndices:
    """Each batch element's cache indices, clamped into range as the kernels clamp them (``kernels/decode.py``), so
    that no value, however bad, reads or writes outside the caches.

    ``cache_seqlens`` lies in [0, capacity - seqlen_new]; ``total``: the cache positions the element's keys end at
    (0 for a cache row outside the cache, which gives no keys); ``leftpad`` in [0, cache_seqlens]; ``writes``: whether
    the append may write, which needs every index of the element in range; ``pages``: the block table's rows of the
    batch (paged caches), an entry outside the pool replaced by page 0, and ``page_ok`` where it was not.
    """

    cache_seqlens: torch.Tensor
    cache_rows: torch.Tensor
    total: torch.Tensor
    leftpad: torch.Tensor
    writes: torch.Tensor
    pages: torch.Tensor | None
    page_ok: torch.Tensor | None

    @classmethod
    def of(cls, k_cache, cache_seqlens, cache_batch_idx, cache_leftpad, block_table, seqlen_new: int,
           record_faults: bool) -> CacheIndices:
        """Read the indices (a host copy) and clamp them; with ``record_faults`` those out of range are recorded in
        the fault buffer of cache_seqlens' device (``flashattn.faults``)."""
        device = k_cache.device
        batch = cache_seqlens.shape[0]
        paged = block_table is not None
        page_size = k_cache.shape[1]
        capacity = block_table.shape[1] * page_size if paged else page_size
        rows = block_table.shape[0] if paged else k_cache.shape[0]
        raw_len = cache_seqlens.long().cpu()
        len_ok = (raw_len >= 0) & (raw_len <= capacity - seqlen_new)
        cache_len = raw_len.clamp(0, max(capacity - seqlen_new, 0))
        total = (cache_len + seqlen_new).clamp(max=capacity)
        raw_row = torch.arange(batch) if cache_batch_idx is None else cache_batch_idx.long().cpu()
        row_ok = (raw_row >= 0) & (raw_row < rows)
        total = torch.where(row_ok, total, 0)
        cache_rows = torch.where(row_ok, raw_row, 0)
        problems = {"cache_seqlens": ~len_ok, "cache_batch_idx": ~row_ok}
        leftpad = torch.zeros(batch, dtype=torch.long)
        writes = len_ok & row_ok
        if cache_leftpad is not None:
            raw_pad = cache_leftpad.long().cpu()
            problems["cache_leftpad"] = (raw_pad < 0) | (raw_pad > raw_len)
            writes &= ~problems["cache_leftpad"]
            leftpad = torch.minimum(raw_pad.clamp(min=0), torch.minimum(cache_len, total))
        pages = page_ok = None
        if paged:
            pages = block_table.long().cpu()[cache_rows]  # (batch, pages a row)
            first_keys = torch.arange(pages.shape[1]) * page_size
            # the pages that hold a key the element reads, [leftpad, total): the rest of a row is padding
            used = (first_keys < total.view(-1, 1)) & (first_keys + page_size > leftpad.view(-1, 1))
            page_ok = (pages >= 0) & (pages < k_cache.shape[0])
            problems["block_table"] = (used & ~page_ok).any(dim=1)
            pages = torch.where(page_ok, pages, 0).to(device)
            page_ok = page_ok.to(device)
        if record_faults:
            buffer = faults.fault_buffer(cache_seqlens.device)
            for name, bad in problems.items():
                if bad.any():
                    buffer[faults.FAULT_ARGUMENTS.index(name)] = int(bad.nonzero()[0, 0]) + 1
        return cls(cache_len.to(device), cache_rows, total, leftpad, writes, pages, page_ok)

    def rows(self, b: int, positions: torch.Tensor, k_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Indices (first dim, second dim) of the cache rows that hold ``positions`` of batch element ``b``."""
        if self.pages is None:
            return torch.full_like(positions, int(self.cache_rows[b])), positions
        page_size = k_cache.shape[1]
        return self.pages[b][positions // page_size], positions % page_size


def append(k_cache, v_cache, k, v, indices: CacheIndices, rotary_cos, rotary_sin, rotary_interleaved: bool) -> None:
    """Write k (rotated at positions cache_seqlens[b] + t) and v into the caches, in place. An element with an index
    out of range writes nothing, nor does a row whose page lies outside the pool (``CacheIndices``)."""
    seqlen_new = k.shape[1]
    for b in range(k.shape[0]):
        if not indices.writes[b]:
            continue
        positions = int(indices.cache_seqlens[b]) + torch.arange(seqlen_new, device=k.device)
        k_new, v_new = k[b], v[b]
        if rotary_cos is not None:
            # (S_new, D / 2) angles, broadcast over the kv heads
            k_new = rotate(k_new, rotary_cos[positions].unsqueeze(1), rotary_sin[positions].unsqueeze(1),
                           rotary_interleaved)
        if indices.page_ok is not None:
            kept = indices.page_ok[b][positions // k_cache.shape[1]]
            positions, k_new, v_new = positions[kept], k_new[kept], v_new[kept]
        rows = indices.rows(b, positions, k_cache)
        k_cache[rows] = k_new.to(k_cache.dtype)
        v_cache[rows] = v_new.to(v_cache.dtype)


def rotate_queries(q: torch.Tensor, cache_seqlens: torch.Tensor, rotary_cos, rotary_sin, interleaved: bool,
                   per_token: bool) -> torch.Tensor:
    """q (B, Sq, H, D) rotated at positions cache_seqlens + i (per_token) or cache_seqlens (otherwise)."""
    steps = torch.arange(q.shape[1], device=q.device) if per_token else torch.zeros(q.shape[1], dtype=torch.long,
                                                                                     device=q.device)
    positions = cache_seqlens.long().view(-1, 1) + steps.view(1, -1)  # (B, Sq)
    # causal queries past the tables (seqlen_q > seqlen_new at the cache's end) turn by angle 0, as in the kernel
    inside = (positions < rotary_cos.shape[0]).unsqueeze(-1).unsqueeze(-1)
    positions = positions.clamp(max=rotary_cos.shape[0] - 1)
    cos = rotary_cos[positions].unsqueeze(2).masked_fill(~inside, 1.0)  # (B, Sq, 1, R / 2)
    sin = rotary_sin[positions].unsqueeze(2).masked_fill(~inside, 0.0)
    return rotate(q, cos, sin, interleaved)


def attention(q, k_cache, v_cache, indices: CacheIndices, rotary_cos, rotary_sin, alibi_slopes, opts: AttentionOptions,
              rotary_interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of q (B, Sq, H, D) over each batch element's valid cache, per batch element."""
    batch, seqlen_q, nheads, _ = q.shape
    if rotary_cos is not None:
        q = rotate_queries(q, indices.cache_seqlens, rotary_cos, rotary_sin, rotary_interleaved,
                           per_token=opts.masked)
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(batch, nheads, seqlen_q, dtype=torch.float32, device=q.device)
    for b in range(batch):
        positions = torch.arange(int(indices.leftpad[b]), int(indices.total[b]), device=q.device)
        rows = indices.rows(b, positions, k_cache)
        # (1, seqlen_k, Hk, D) in q's dtype: an e4m3 cache (the FP8 step's) is widened as it is read, one sequence
        keys, values = (cache[rows].to(q.dtype).unsqueeze(0) for cache in (k_cache, v_cache))
        slopes = None
        if alibi_slopes is not None:
            slopes = alibi_slopes[b] if alibi_slopes.dim() == 2 else alibi_slopes
        out[b : b + 1], lse[b : b + 1] = cpu.forward(q[b : b + 1], keys, values, opts, slopes, None)
    return out, lse


def _weights(lse_partial: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights w_s = exp(l_s - L) (0 for empty splits, l_s = +-inf) and the merged L (+inf if all empty).

    Computed as a softmax over the splits (shifted by the largest finite l_s), the accurate form.
    """
    finite = lse_partial.masked_fill(torch.isinf(lse_partial), float("-inf"))
    shift = finite.amax(dim=0)
    empty = shift == float("-inf")  # every split of the row is empty
    shift = shift.masked_fill(empty, 0.0)
    exps = torch.exp(finite - shift)  # exp(-inf) = 0 for empty splits
    total = exps.sum(dim=0)
    weights = exps / total.masked_fill(empty, 1.0)
    merged = (shift + torch.log(total)).masked_fill(empty, float("inf"))
    return weights, merged


def combine(out_partial: torch.Tensor, lse_partial: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """out_partial (S, B, Sq, H, D), lse_partial (S, B, H, Sq) -> out (B, Sq, H, D), lse (B, H, Sq)."""
    compute = torch.promote_types(out_partial.dtype, torch.float32)
    weights, merged = _weights(lse_partial.to(compute))
    weighted = weights.transpose(-1, -2).unsqueeze(-1) * out_partial.to(compute)  # (S, B, Sq, H, D)
    weighted = weighted.masked_fill(weights.transpose(-1, -2).unsqueeze(-1) == 0, 0.0)  # never read empty splits
    out = weighted.sum(dim=0).to(out_partial.dtype).contiguous()
    return out, merged.to(lse_partial.dtype).contiguous()


def combine_backward(dout, dlse, out_partial, lse_partial) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of :func:`combine` (see ``kernels/combine.py`` for the formulas)."""
    compute = torch.promote_types(out_partial.dtype, torch.float32)
    weights, _ = _weights(lse_partial.to(compute))  # (S, B, H, Sq)
    used = weights > 0
    partial = out_partial.to(compute)
    dout = dout.to(compute)
    dot = (dout.unsqueeze(0) * partial).sum(-1).transpose(-1, -2)  # dout . o_s, (S, B, H, Sq)
    dot = dot.masked_fill(~used, 0.0)
    dout_dot_out = (weights * dot).sum(dim=0)
    dlse_partial = (weights * (dot - dout_dot_out + dlse.to(compute))).masked_fill(~used, 0.0)
    dout_partial = weights.transpose(-1, -2).unsqueeze(-1) * dout.unsqueeze(0)
    return dout_partial.to(out_partial.dtype).contiguous(), dlse_partial.to(lse_partial.dtype).contiguous()
