"""Decode kernels: append new keys/values into a KV cache, and attention of a few queries over the cache.

Two kernels, launched one after the other on the same stream (``launch/decode.py``):

* ``kvcache_append_kernel`` writes the new k (rotated, when rotary tables are given) and v into the cache
  at positions ``cache_seqlens[b] + t``, through the block table when the cache is paged.
* ``kvcache_attention_kernel`` runs the online softmax over the valid keys of the cache. One program
  owns one kv head of one batch element and packs the query heads that share it into its tile: row
  ``r`` of the tile is query token ``r // group_size`` of query head ``kv_head * group_size + r % group_size``.
  Each K/V tile is then loaded once for the whole group, which is what makes GQA decoding fast (one
  query token per head would leave a tile of 1 row). A third grid axis splits the key range
  (flash-decoding); each split writes a normalized partial output and its log-sum-exp, merged by
  ``kernels/combine.py``.

Positions: the cache holds keys at absolute positions ``[leftpad, cache_seqlens + seqlen_new)``; the
attention sees them as keys ``0 .. seqlen_k - 1`` with ``seqlen_k = cache_seqlens + seqlen_new - leftpad``,
and the masks are aligned to the bottom-right corner of that range (``masks.visible``). Rotary angles are
looked up at absolute positions, as flash-attn does.
"""

import triton
import triton.language as tl

from .. import faults
from .common import (
    LOG2E,
    chain_launch,
    divide_rows,
    dot,
    dot_short_chains,
    key_block_bounds,
    load_kt_v,
    online_softmax_step,
    paged_kv_rows,
    record_fault,
    stage_range,
)

SLOT_CACHE_SEQLENS = tl.constexpr(faults.SLOT_CACHE_SEQLENS)
SLOT_CACHE_BATCH_IDX = tl.constexpr(faults.SLOT_CACHE_BATCH_IDX)
SLOT_CACHE_LEFTPAD = tl.constexpr(faults.SLOT_CACHE_LEFTPAD)
SLOT_BLOCK_TABLE = tl.constexpr(faults.SLOT_BLOCK_TABLE)


@triton.jit
def load_rotated(row_ptrs, row_mask, positions, Cos, Sin, stride_cos, stride_sin, rotary_dim, seqlen_ro,
                 HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, HAS_ROTARY: tl.constexpr,
                 INTERLEAVED: tl.constexpr):
    """Load rows [R, BLOCK_D] from ``row_ptrs`` ([R, 1] pointers to element 0 of each row), rotated.

    The first ``rotary_dim`` dims of row r turn by the angles of position ``positions[r]``: pairs
    (2j, 2j+1) when INTERLEAVED (GPT-J), pairs (j, j + rotary_dim / 2) otherwise (GPT-NeoX); the rest of
    the row is unchanged. Computed in float32; returned in float32.
    """
    offs_d = tl.arange(0, BLOCK_D)[None, :]
    mask = row_mask & (offs_d < HEAD_DIM)
    x = tl.load(row_ptrs + offs_d, mask=mask, other=0.0).to(tl.float32)
    if HAS_ROTARY:
        half = rotary_dim // 2
        in_rotary = offs_d < rotary_dim
        if INTERLEAVED:
            partner = offs_d ^ 1
            freq = offs_d // 2
            sign = tl.where(offs_d % 2 == 0, -1.0, 1.0)
        else:
            first_half = offs_d < half
            partner = tl.where(first_half, offs_d + half, offs_d - half)
            freq = tl.where(first_half, offs_d, offs_d - half)
            sign = tl.where(first_half, -1.0, 1.0)
        rotary_mask = mask & in_rotary
        x_partner = tl.load(row_ptrs + partner, mask=rotary_mask, other=0.0).to(tl.float32)
        # positions past the tables (only reachable with inputs the host check refuses) read angle 0
        table_mask = rotary_mask & (positions[:, None] < seqlen_ro) & (positions[:, None] >= 0)
        position = positions[:, None].to(tl.int64)
        cos = tl.load(Cos + position * stride_cos + freq, mask=table_mask, other=1.0).to(tl.float32)
        sin = tl.load(Sin + position * stride_sin + freq, mask=table_mask, other=0.0).to(tl.float32)
        x = tl.where(in_rotary, x * cos + sign * x_partner * sin, x)
    return x


@triton.jit
def _load_new_tokens(
    K, V, KCache, VCache, BlockTable, Cos, Sin, Faults, batch, head_k, cache_len, cache_batch, offs_t, active,
    stride_kb, stride_kn, stride_kh, stride_vb, stride_vn, stride_vh,
    stride_kcb, stride_kcn, stride_kch, stride_vcb, stride_vcn, stride_vch,
    stride_btb, stride_cos, stride_sin,
    seqlen_new, capacity, batch_cache, num_blocks, page_size, rotary_dim, seqlen_ro,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    PAGED: tl.constexpr, HAS_ROTARY: tl.constexpr, INTERLEAVED: tl.constexpr, RECORD_FAULTS: tl.constexpr,
):
    """New tokens ``offs_t`` of (batch, kv head), rotary(k) and v, and where they go in the caches (positions
    cache_len + t): (k_dst, k_new, v_dst, v_new, store_mask) for :func:`_store_new_tokens`. A program that
    is not ``active`` (not the writer, or an index of its batch element out of range: see ``_cache_indices``)
    loads nothing, and its mask stores nothing; a row whose block-table entry lies outside the pool is not
    written either (and is recorded with RECORD_FAULTS)."""
    positions = cache_len + offs_t
    ok = active & (offs_t < seqlen_new) & (positions >= 0) & (positions < capacity)
    if PAGED:
        block = tl.load(BlockTable + cache_batch.to(tl.int64) * stride_btb + positions // page_size, mask=ok, other=0)
        page_ok = (block >= 0) & (block < num_blocks)
        if RECORD_FAULTS:
            record_fault(Faults, SLOT_BLOCK_TABLE, batch, tl.max((ok & ~page_ok).to(tl.int32)) > 0)
        ok = ok & page_ok
        in_page = (positions % page_size).to(tl.int64)
        k_rows = block.to(tl.int64) * stride_kcb + in_page * stride_kcn
        v_rows = block.to(tl.int64) * stride_vcb + in_page * stride_vcn
    else:
        k_rows = cache_batch.to(tl.int64) * stride_kcb + positions.to(tl.int64) * stride_kcn
        v_rows = cache_batch.to(tl.int64) * stride_vcb + positions.to(tl.int64) * stride_vcn
    row_mask = ok[:, None]
    offs_d = tl.arange(0, BLOCK_D)[None, :]
    store_mask = row_mask & (offs_d < HEAD_DIM)

    tokens = offs_t[:, None].to(tl.int64)
    k_src = K + batch.to(tl.int64) * stride_kb + head_k.to(tl.int64) * stride_kh + tokens * stride_kn
    k_new = load_rotated(k_src, row_mask, positions, Cos, Sin, stride_cos, stride_sin, rotary_dim, seqlen_ro,
                         HEAD_DIM, BLOCK_D, HAS_ROTARY, INTERLEAVED)
    k_dst = KCache + head_k.to(tl.int64) * stride_kch + k_rows[:, None] + offs_d
    v_src = V + batch.to(tl.int64) * stride_vb + head_k.to(tl.int64) * stride_vh + tokens * stride_vn
    v_new = tl.load(v_src + offs_d, mask=store_mask, other=0.0)
    v_dst = VCache + head_k.to(tl.int64) * stride_vch + v_rows[:, None] + offs_d
    return k_dst, k_new, v_dst, v_new, store_mask


@triton.jit
def _store_new_tokens(k_dst, k_new, v_dst, v_new, store_mask):
    """The stores of :func:`_load_new_tokens`' rows."""
    tl.store(k_dst, k_new.to(k_dst.dtype.element_ty), mask=store_mask)
    tl.store(v_dst, v_new.to(v_dst.dtype.element_ty), mask=store_mask)


@triton.jit
def _cache_indices(CacheSeqlens, CacheBatchIdx, CacheLeftpad, Faults, batch, records, seqlen_new, capacity, batch_cache,
                   HAS_BATCH_IDX: tl.constexpr, HAS_LEFTPAD: tl.constexpr, RECORD_FAULTS: tl.constexpr):
    """Batch element ``batch``'s indices, clamped into range whatever they hold: (cache_len in [0, capacity -
    seqlen_new], cache_batch, leftpad in [0, cache_len], total: the keys it sees in the cache, including the new ones,
    and ``writes``: whether its append may write, which needs every index in range). A cache row outside the cache
    gives no keys at all. With RECORD_FAULTS, where ``records``, each index out of range is recorded
    (``flashattn.faults``)."""
    raw_len = tl.load(CacheSeqlens + batch)
    len_ok = (raw_len >= 0) & (raw_len <= capacity - seqlen_new)
    cache_len = tl.minimum(tl.maximum(raw_len, 0), tl.maximum(capacity - seqlen_new, 0))
    total = tl.minimum(cache_len + seqlen_new, capacity)
    cache_batch = batch
    batch_ok = tl.full([], 1, tl.int1)
    if HAS_BATCH_IDX:
        raw_batch = tl.load(CacheBatchIdx + batch)
        batch_ok = (raw_batch >= 0) & (raw_batch < batch_cache)
        total = tl.where(batch_ok, total, 0)
        cache_batch = tl.where(batch_ok, raw_batch, 0)
    leftpad = 0
    pad_ok = tl.full([], 1, tl.int1)
    if HAS_LEFTPAD:
        raw_pad = tl.load(CacheLeftpad + batch)
        pad_ok = (raw_pad >= 0) & (raw_pad <= raw_len)
        leftpad = tl.minimum(tl.maximum(raw_pad, 0), tl.minimum(cache_len, total))
    if RECORD_FAULTS:
        record_fault(Faults, SLOT_CACHE_SEQLENS, batch, records & ~len_ok)
        record_fault(Faults, SLOT_CACHE_BATCH_IDX, batch, records & ~batch_ok)
        record_fault(Faults, SLOT_CACHE_LEFTPAD, batch, records & ~pad_ok)
    return cache_len, cache_batch, leftpad, total, len_ok & batch_ok & pad_ok


@triton.jit
def kvcache_append_kernel(
    K, V, KCache, VCache, CacheSeqlens, CacheBatchIdx, BlockTable, Cos, Sin, Faults,
    stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh,
    stride_kcb, stride_kcn, stride_kch,
    stride_vcb, stride_vcn, stride_vch,
    stride_btb, stride_cos, stride_sin,
    seqlen_new, nheads_k, capacity, batch_cache, num_blocks, page_size, rotary_dim, seqlen_ro,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    PAGED: tl.constexpr, HAS_BATCH_IDX: tl.constexpr, HAS_ROTARY: tl.constexpr, INTERLEAVED: tl.constexpr,
    RECORD_FAULTS: tl.constexpr,
):
    """One program per (block of new tokens, batch x kv head): cache[pos] = rotary(k), v at pos. A batch element
    with an index out of range appends nothing (``_cache_indices``)."""
    bh = tl.program_id(1)
    batch = bh // nheads_k
    head_k = bh % nheads_k
    cache_len, cache_batch, _, _, writes = _cache_indices(
        CacheSeqlens, CacheBatchIdx, CacheSeqlens, Faults, batch, (tl.program_id(0) == 0) & (head_k == 0), seqlen_new,
        capacity, batch_cache, HAS_BATCH_IDX, False, RECORD_FAULTS)
    offs_t = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    new_tokens = _load_new_tokens(K, V, KCache, VCache, BlockTable, Cos, Sin, Faults, batch, head_k, cache_len,
                                  cache_batch, offs_t, writes, stride_kb, stride_kn, stride_kh, stride_vb, stride_vn,
                                  stride_vh,
                                  stride_kcb, stride_kcn, stride_kch, stride_vcb, stride_vcn, stride_vch,
                                  stride_btb, stride_cos, stride_sin,
                                  seqlen_new, capacity, batch_cache, num_blocks, page_size, rotary_dim, seqlen_ro,
                                  HEAD_DIM, BLOCK_D, PAGED, HAS_ROTARY, INTERLEAVED, RECORD_FAULTS)
    _store_new_tokens(*new_tokens)


@triton.jit
def _key_rows(offs_n, start_n, leftpad, cache_batch, BlockTable, stride_btb, page_size, num_blocks,
              stride_kcb, stride_kcn, stride_vcb, stride_vcn, PAGED: tl.constexpr, ONE_PAGE: tl.constexpr):
    """Element offsets of the K and V rows of keys ``offs_n`` (effective positions), and which rows exist.

    Contiguous caches have every row; in a paged cache a key whose block-table entry is out of range
    (refused on the host unless the caller turned the check off) is never read. ONE_PAGE (no left pad,
    and BLOCK_N divides the page size): the block starting at ``start_n`` lies in one page, whose entry
    is read once for the block, and its rows are consecutive.
    """
    positions = offs_n + leftpad
    if PAGED:
        # without ONE_PAGE a left pad shifts the positions off the page grid: one table read per row
        return paged_kv_rows(positions, start_n, BlockTable + cache_batch.to(tl.int64) * stride_btb, page_size,
                             num_blocks, stride_kcb, stride_kcn, stride_vcb, stride_vcn, ONE_PAGE)
    rows = positions.to(tl.int64)
    return (cache_batch.to(tl.int64) * stride_kcb + rows * stride_kcn,
            cache_batch.to(tl.int64) * stride_vcb + rows * stride_vcn, offs_n >= 0)


@triton.jit
def _decode_block(
    acc, acc_comp, row_sum, row_max, q, kt, v, offs_n, query_idx, seqlen_q, seqlen_k,
    qk_scale, softcap_log2, alibi_slope_log2, window_left, window_right,
    BLOCK_D: tl.constexpr, MASKED: tl.constexpr,
    WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
    UPCAST_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr, COMPENSATED: tl.constexpr,
):
    """One key block (K^T and V loaded) into the running softmax of the tile's rows."""
    # an e4m3 cache (the FP8 step's) is widened to q's 16-bit dtype here, exactly; otherwise a no-op
    kt = kt.to(q.dtype)
    v = v.to(q.dtype)
    # -- scores: the rows are (token, head) pairs, masks and ALiBi follow each row's token --
    if COMPENSATED and BLOCK_D > 32:  # float32: short reduction chains, see dot_short_chains
        qk = dot_short_chains(q, kt, 32)
    else:
        qk = dot(q, kt, UPCAST_DOT, DOT_PRECISION)
    return online_softmax_step(
        acc, acc_comp, row_sum, row_max, qk, v, query_idx, offs_n, seqlen_q, seqlen_k, qk_scale, softcap_log2,
        alibi_slope_log2, window_left, window_right, 0.0, 0, 0, 0,
        MASKED, WINDOW_LEFT, WINDOW_RIGHT, HAS_SOFTCAP, HAS_ALIBI, False, UPCAST_DOT, DOT_PRECISION, COMPENSATED,
        False, None, 0, 0, False, False)


@triton.jit
def _decode_block_range(
    acc, acc_comp, row_sum, row_max, q,
    k_head, v_head, BlockTable, stride_btb, page_size, num_blocks,
    stride_kcb, stride_kcn, stride_vcb, stride_vcn,
    lo, hi, query_idx, leftpad, cache_batch, seqlen_q, seqlen_k,
    qk_scale, softcap_log2, alibi_slope_log2, window_left, window_right,
    new_lo, k_new_head, v_new_head, stride_knn, stride_vnn, table_entries, Faults, batch,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr, PAGED: tl.constexpr, ONE_PAGE: tl.constexpr,
    WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
    UPCAST_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr, COMPENSATED: tl.constexpr, FUSE_APPEND: tl.constexpr,
    TABLE_CHUNK: tl.constexpr, RECORD_FAULTS: tl.constexpr,
):
    """Key blocks lo, lo + BLOCK_N, ... < hi of the cache. FUSE_APPEND: keys from new_lo on are this
    step's new tokens, which the same launch is writing into the cache: their rows are read from the new
    k/v (k_new_head, v_new_head), never from the cache rows being written. Only masked blocks hold them.

    TABLE_CHUNK (paged, ONE_PAGE): the block table is read TABLE_CHUNK entries at a time into registers,
    and one loop runs over the key blocks of those pages, so that the loads are pipelined across page
    boundaries (``table_entries``: the length of a block-table row).

    A block-table entry outside the pool reads page 0 (recorded with RECORD_FAULTS: ``flashattn.faults``)."""
    offs_d = tl.arange(0, BLOCK_D)
    if PAGED and ONE_PAGE and TABLE_CHUNK > 0 and not MASKED:
        table_row = BlockTable + cache_batch.to(tl.int64) * stride_btb
        offs_entry = tl.arange(0, TABLE_CHUNK)
        chunk_lo = lo
        while chunk_lo < hi:
            first_entry = chunk_lo // page_size
            entries = tl.load(table_row + first_entry + offs_entry, mask=first_entry + offs_entry < table_entries,
                              other=0)
            entries_ok = (entries >= 0) & (entries < num_blocks)
            if RECORD_FAULTS:  # among the entries of pages holding keys: the rest of the row is padding
                used = (first_entry + offs_entry) * page_size < hi
                record_fault(Faults, SLOT_BLOCK_TABLE, batch, tl.max((used & ~entries_ok).to(tl.int32)) > 0)
            entries = tl.where(entries_ok, entries, 0)
            chunk_hi = tl.minimum((first_entry + TABLE_CHUNK) * page_size, hi)
            for start_n in range(chunk_lo, chunk_hi, BLOCK_N):
                offs_n = start_n + tl.arange(0, BLOCK_N)
                # the block's page, picked out of the registers: no load feeds this loop's addresses
                page = tl.sum(tl.where(offs_entry == start_n // page_size - first_entry, entries, 0))
                # the block's first row, then consecutive rows: the loads stay vectorized
                first_row = (start_n % page_size).to(tl.int64)
                rows = tl.arange(0, BLOCK_N).to(tl.int64)
                k_block = k_head + page.to(tl.int64) * stride_kcb + first_row * stride_kcn
                v_block = v_head + page.to(tl.int64) * stride_vcb + first_row * stride_vcn
                kt, v = load_kt_v(k_block + rows[None, :] * stride_kcn + offs_d[:, None],
                                  v_block + rows[:, None] * stride_vcn + offs_d[None, :],
                                  offs_d, offs_n >= 0, HEAD_DIM, BLOCK_D, False)
                acc, acc_comp, row_sum, row_max = _decode_block(
                    acc, acc_comp, row_sum, row_max, q, kt, v, offs_n, query_idx, seqlen_q, seqlen_k,
                    qk_scale, softcap_log2, alibi_slope_log2, window_left, window_right, BLOCK_D, MASKED,
                    WINDOW_LEFT, WINDOW_RIGHT, HAS_SOFTCAP, HAS_ALIBI, UPCAST_DOT, DOT_PRECISION, COMPENSATED)
            chunk_lo = chunk_hi
    elif PAGED and ONE_PAGE and not MASKED:
        # page by page: the table is read in the outer loop, so that the inner loop's K/V addresses are
        # affine in its index and Triton's pipeliner can keep several blocks in flight (a load whose
        # address comes from another load of the same loop gets a single stage)
        table_row = BlockTable + cache_batch.to(tl.int64) * stride_btb
        page_lo = lo
        while page_lo < hi:
            page_index = page_lo // page_size
            page_hi = tl.minimum((page_index + 1) * page_size, hi)
            page = tl.load(table_row + page_index)
            page_ok = (page >= 0) & (page < num_blocks)
            if RECORD_FAULTS:
                record_fault(Faults, SLOT_BLOCK_TABLE, batch, ~page_ok)
            page = tl.where(page_ok, page, 0).to(tl.int64)
            k_page = k_head + page * stride_kcb
            v_page = v_head + page * stride_vcb
            first_key = page_index * page_size
            for start_n in range(page_lo, page_hi, BLOCK_N):
                offs_n = start_n + tl.arange(0, BLOCK_N)
                rows = (offs_n - first_key).to(tl.int64)
                kt, v = load_kt_v(k_page + rows[None, :] * stride_kcn + offs_d[:, None],
                                  v_page + rows[:, None] * stride_vcn + offs_d[None, :],
                                  offs_d, offs_n >= 0, HEAD_DIM, BLOCK_D, False)
                acc, acc_comp, row_sum, row_max = _decode_block(
                    acc, acc_comp, row_sum, row_max, q, kt, v, offs_n, query_idx, seqlen_q, seqlen_k,
                    qk_scale, softcap_log2, alibi_slope_log2, window_left, window_right, BLOCK_D, MASKED,
                    WINDOW_LEFT, WINDOW_RIGHT, HAS_SOFTCAP, HAS_ALIBI, UPCAST_DOT, DOT_PRECISION, COMPENSATED)
            page_lo = page_hi
    else:
        for start_n in range(lo, hi, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            if MASKED:
                # the block table is read only for keys that exist: past seqlen_k its row may end
                k_rows, v_rows, exists = _key_rows(tl.minimum(offs_n, seqlen_k - 1), start_n, leftpad,
                                                   cache_batch, BlockTable, stride_btb, page_size, num_blocks,
                                                   stride_kcb, stride_kcn, stride_vcb, stride_vcn, PAGED, ONE_PAGE)
                exists_in_pool = exists
                exists = exists & (offs_n < seqlen_k)
            else:
                k_rows, v_rows, exists = _key_rows(offs_n, start_n, leftpad, cache_batch, BlockTable, stride_btb,
                                                   page_size, num_blocks, stride_kcb, stride_kcn, stride_vcb,
                                                   stride_vcn, PAGED, ONE_PAGE)
                exists_in_pool = exists
            if PAGED and RECORD_FAULTS:
                bad_pages = (offs_n < seqlen_k) & ~exists_in_pool
                record_fault(Faults, SLOT_BLOCK_TABLE, batch, tl.max(bad_pages.to(tl.int32)) > 0)
            kt_ptrs = k_head + k_rows[None, :] + offs_d[:, None]
            v_ptrs = v_head + v_rows[:, None] + offs_d[None, :]
            if FUSE_APPEND and MASKED:  # the new keys' rows come from the new k/v, not from the cache
                is_new = offs_n >= new_lo
                new_rows = tl.maximum(offs_n - new_lo, 0).to(tl.int64)
                kt_ptrs = tl.where(is_new[None, :], k_new_head + new_rows[None, :] * stride_knn + offs_d[:, None],
                                   kt_ptrs)
                v_ptrs = tl.where(is_new[:, None], v_new_head + new_rows[:, None] * stride_vnn + offs_d[None, :],
                                  v_ptrs)
            # -- K^T and V: interior blocks of a contiguous cache need no mask on the keys --
            kt, v = load_kt_v(kt_ptrs, v_ptrs, offs_d, exists, HEAD_DIM, BLOCK_D, MASKED or PAGED)
            acc, acc_comp, row_sum, row_max = _decode_block(
                acc, acc_comp, row_sum, row_max, q, kt, v, offs_n, query_idx, seqlen_q, seqlen_k,
                qk_scale, softcap_log2, alibi_slope_log2, window_left, window_right, BLOCK_D, MASKED,
                WINDOW_LEFT, WINDOW_RIGHT, HAS_SOFTCAP, HAS_ALIBI, UPCAST_DOT, DOT_PRECISION, COMPENSATED)
    return acc, acc_comp, row_sum, row_max


@triton.jit
def kvcache_attention_kernel(
    Q, KCache, VCache, Out, Lse, CacheSeqlens, CacheBatchIdx, CacheLeftpad, BlockTable, Cos, Sin, AlibiSlopes,
    KNew, VNew, Faults,
    stride_qb, stride_qm, stride_qh,
    stride_knb, stride_knn, stride_knh, stride_vnb, stride_vnn, stride_vnh,
    stride_kcb, stride_kcn, stride_kch,
    stride_vcb, stride_vcn, stride_vch,
    stride_os, stride_ob, stride_om, stride_oh,
    stride_ls, stride_lb, stride_lh, stride_lm,
    stride_btb, stride_cos, stride_sin, stride_alibi_b,
    seqlen_q, seqlen_new, nheads_k, group_size, capacity, batch_cache, num_blocks, page_size,
    rotary_dim, seqlen_ro, num_splits,
    qk_scale, softcap_log2, window_left, window_right,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PAGED: tl.constexpr, HAS_BATCH_IDX: tl.constexpr, HAS_LEFTPAD: tl.constexpr,
    HAS_ROTARY: tl.constexpr, INTERLEAVED: tl.constexpr, ROTARY_PER_TOKEN: tl.constexpr,
    WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
    UPCAST_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr, COMPENSATED: tl.constexpr,
    ONE_PAGE: tl.constexpr = False, CHAINED: tl.constexpr = False, FUSE_APPEND: tl.constexpr = False,
    NEW_KEYS: tl.constexpr = 16, TABLE_CHUNK: tl.constexpr = 0, RECORD_FAULTS: tl.constexpr = False,
):
    """Grid (row blocks, batch x kv heads, splits). Writes out/lse of split ``program_id(2)``.

    ONE_PAGE (paged, no left pad, BLOCK_N divides page_size): each key block lies in one page.
    FUSE_APPEND: the step's seqlen_new (<= NEW_KEYS) new keys/values (KNew, VNew, without rotary) are
    appended by this launch: program (0, b x h, 0) writes them into the cache (as
    ``kvcache_append_kernel`` does) after its key loop, and every program reads their rows from KNew/VNew,
    never from the cache rows being written.
    CHAINED: launched with programmatic dependent launch (see ``common.chain_launch``).
    TABLE_CHUNK: how a paged cache's interior key blocks are loaded (``_decode_block_range``).
    RECORD_FAULTS: indices out of range are recorded in Faults (``flashattn.faults``); clamped either way."""
    chain_launch(CHAINED)
    start_r = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    split = tl.program_id(2)
    batch = bh // nheads_k
    head_k = bh % nheads_k

    # -- this batch element's keys; clamped so that no index, even a bad one, leaves the cache --
    writer = (tl.program_id(0) == 0) & (split == 0)
    cache_len, cache_batch, leftpad, total, writes = _cache_indices(
        CacheSeqlens, CacheBatchIdx, CacheLeftpad, Faults, batch, writer & (head_k == 0), seqlen_new, capacity,
        batch_cache, HAS_BATCH_IDX, HAS_LEFTPAD, RECORD_FAULTS)
    seqlen_k = total - leftpad
    new_lo = cache_len - leftpad  # the first new key, as the attention counts keys
    k_new_head = KNew + batch.to(tl.int64) * stride_knb + head_k.to(tl.int64) * stride_knh
    v_new_head = VNew + batch.to(tl.int64) * stride_vnb + head_k.to(tl.int64) * stride_vnh
    if FUSE_APPEND:
        # program (0, b x h, 0) appends: its loads are issued now and its stores after the key loop, so that
        # their latency hides behind the attention instead of adding to this program's
        new_tokens = _load_new_tokens(KNew, VNew, KCache, VCache, BlockTable, Cos, Sin, Faults, batch, head_k,
                                      cache_len, cache_batch, tl.arange(0, NEW_KEYS), writer & writes,
                                      stride_knb, stride_knn, stride_knh, stride_vnb, stride_vnn, stride_vnh,
                                      stride_kcb, stride_kcn, stride_kch, stride_vcb, stride_vcn, stride_vch,
                                      stride_btb, stride_cos, stride_sin,
                                      seqlen_new, capacity, batch_cache, num_blocks, page_size, rotary_dim,
                                      seqlen_ro, HEAD_DIM, BLOCK_D, PAGED, HAS_ROTARY, INTERLEAVED, RECORD_FAULTS)

    # -- the tile's rows: (query token, query head of this kv head's group) --
    offs_r = start_r + tl.arange(0, BLOCK_M)
    query_idx = offs_r // group_size
    head = head_k * group_size + offs_r % group_size
    row_ok = offs_r < seqlen_q * group_size
    q_rows = Q + batch.to(tl.int64) * stride_qb + query_idx[:, None].to(tl.int64) * stride_qm \
        + head[:, None].to(tl.int64) * stride_qh
    if ROTARY_PER_TOKEN:  # causal or local: query i sits at position cache_seqlens + i
        q_positions = cache_len + query_idx
    else:  # otherwise every query sits at position cache_seqlens (flash-attn's convention)
        q_positions = cache_len + query_idx * 0
    q = load_rotated(q_rows, row_ok[:, None], q_positions, Cos, Sin, stride_cos, stride_sin, rotary_dim, seqlen_ro,
                     HEAD_DIM, BLOCK_D, HAS_ROTARY, INTERLEAVED)
    q = q.to(Q.dtype.element_ty)  # rounded like the rotated keys in the cache; q stays on chip throughout

    alibi_slope_log2 = 0.0
    if HAS_ALIBI:
        slopes = tl.load(AlibiSlopes + batch * stride_alibi_b + head, mask=row_ok, other=0.0)
        alibi_slope_log2 = (slopes.to(tl.float32) * LOG2E)[:, None]

    row_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    acc_comp = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    # -- the keys any row of the tile sees, then this split's share of their blocks --
    first_query = start_r // group_size
    lo, full_lo, full_hi, hi = key_block_bounds(first_query, seqlen_q, seqlen_k, window_left, window_right,
                                                BLOCK_M, BLOCK_N, WINDOW_LEFT, WINDOW_RIGHT)
    if FUSE_APPEND:  # the blocks that hold new keys take the masked path, which reads them from KNew/VNew
        full_hi = tl.maximum(full_lo, tl.minimum(full_hi, tl.maximum(new_lo, 0) // BLOCK_N * BLOCK_N))
    blocks_per_split = tl.cdiv(tl.cdiv(hi - lo, BLOCK_N), num_splits)
    split_lo = tl.minimum(lo + split * blocks_per_split * BLOCK_N, hi)
    split_hi = tl.minimum(split_lo + blocks_per_split * BLOCK_N, hi)

    k_head = KCache + head_k.to(tl.int64) * stride_kch
    v_head = VCache + head_k.to(tl.int64) * stride_vch
    for stage in tl.static_range(3):
        start, end = stage_range(stage, lo, full_lo, full_hi, hi)
        start = tl.minimum(tl.maximum(start, split_lo), split_hi)
        end = tl.maximum(tl.minimum(end, split_hi), start)
        acc, acc_comp, row_sum, row_max = _decode_block_range(
            acc, acc_comp, row_sum, row_max, q, k_head, v_head, BlockTable, stride_btb, page_size, num_blocks,
            stride_kcb, stride_kcn, stride_vcb, stride_vcn, start, end, query_idx, leftpad, cache_batch,
            seqlen_q, seqlen_k, qk_scale, softcap_log2, alibi_slope_log2, window_left, window_right,
            new_lo, k_new_head, v_new_head, stride_knn, stride_vnn, capacity // page_size, Faults, batch, HEAD_DIM,
            BLOCK_D, BLOCK_N, stage != 1, PAGED, ONE_PAGE, WINDOW_LEFT, WINDOW_RIGHT, HAS_SOFTCAP, HAS_ALIBI,
            UPCAST_DOT, DOT_PRECISION, COMPENSATED, FUSE_APPEND, TABLE_CHUNK, RECORD_FAULTS)

    # -- epilogue: normalize; a row (or a split) that saw no key gives 0 and lse = +inf --
    empty = row_sum == 0.0
    out = divide_rows(acc, tl.where(empty, 1.0, row_sum), COMPENSATED)
    lse = tl.where(empty, float("inf"), (row_max + tl.math.log2(tl.where(empty, 1.0, row_sum))) / LOG2E)
    split_offset = split.to(tl.int64)
    lse_ptrs = Lse + split_offset * stride_ls + batch.to(tl.int64) * stride_lb + head.to(tl.int64) * stride_lh \
        + query_idx.to(tl.int64) * stride_lm
    tl.store(lse_ptrs, lse, mask=row_ok)
    offs_d = tl.arange(0, BLOCK_D)
    out_ptrs = Out + split_offset * stride_os + batch.to(tl.int64) * stride_ob \
        + query_idx[:, None].to(tl.int64) * stride_om + head[:, None].to(tl.int64) * stride_oh + offs_d[None, :]
    tl.store(out_ptrs, out.to(Out.dtype.element_ty), mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM))
    if FUSE_APPEND:
        _store_new_tokens(*new_tokens)
