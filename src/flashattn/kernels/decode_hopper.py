"""Hopper decode attention in Gluon: one GQA group's query rows over a split of a KV cache (contiguous or paged).

The Triton decode kernel (``kernels/decode.py``) issues its own K/V loads from the warps that compute, in 16-row
``mma`` tiles whose softmax crosses the warps at every key block (nine barriers a block). Here, as in the Hopper
forward (``forward_hopper.py``, whose K/V ring this kernel shares), a loader warp streams the split's K and V blocks
through TMA into a ring of ``NUM_STAGES`` shared-memory stages, and one consumer warpgroup runs the products on wgmma.
A GQA group has few query rows at one token (4 for GQA 32/8), and wgmma's rows come 64 at a time; so for groups of
up to 16 rows the consumer swaps the products (``_swapped_consumer``): S^T = K Q^T and O^T += V^T P^T put the keys
and the head dims along the 64 rows and the group's rows along wgmma's N (8 or 16), and the softmax runs down the
keys. Padding the group's rows to 64 instead (``_padded_consumer``, the forward's key loop; larger groups) spends 8-16
times the products and exponentials on rows never stored, and that work holds the stream back: a consumer that only
releases the blocks runs 4-8% faster than it (docs/perf-notes.md). With ``CONSUMERS`` = 2 two swapped
consumer warpgroups take the ring's blocks in turn, so that a block's math does not wait for the one before's, and
the second hands its max, sum and O^T to the first at the end (``_merge_state``).

Program (b x kv head, split) writes its split's normalized output and log-sum-exp for the group's rows, in the
layout of the Triton kernel's partials (``launch/decode.py``: merged by ``kernels/combine.py`` when split), or straight
into the output when unsplit.

The step's new keys (up to 16 a sequence, without rotary) are appended by the same launch: the last split attends to
them from the new k/v (a block of their own, the first through the ring), and split 0 writes them into the cache
before its key loop.

Paged caches are read through one descriptor over the page pool, a block's page looked up by the loader. A contiguous
cache's splits start their whole blocks at offsets of their own (``_block_at``). In launches of few splits each
partition reads the sequence's length itself, and split 0's loader copies block 0 before it arrives
(``EARLY_FIRST_BLOCK``).

Limits, checked by the launcher (``launch.decode.hopper_decode_fits``): one query token, a cache of whole rows per
token (paged: pages one after the other in the pool, their size a multiple of the key block), 16-bit inputs, head
dims 64 and 128, no ALiBi, softcap, left window, rotary, left padding or batch index.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from .. import faults
from .forward_hopper import (
    LOG2E,
    ROWS_PER_WARPGROUP,
    _key_blocks,
    key_ring,
    load_key_block,
    partial_row_sums,
    row_sums,
    wgmma_layout,
    zero_row_sums,
    zero_rows_from,
)

SLOT_CACHE_SEQLENS = gl.constexpr(faults.SLOT_CACHE_SEQLENS)
SLOT_BLOCK_TABLE = gl.constexpr(faults.SLOT_BLOCK_TABLE)


@gluon.constexpr_function
def swapped_layout(query_rows):
    """A swapped product's result in the consumer warpgroup's registers: keys (S^T) or head dims (O^T) along the 4
    warps' rows, the group's ``query_rows`` (8-64) along the columns. S^T and O^T share it, so that a per-query vector
    (max, sum, rescale factor) of one serves the other without a conversion."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, query_rows, 16])


@gluon.jit
def _split_blocks(seqlen_k, split, num_splits, BLOCK_N: gl.constexpr):
    """This split's key blocks [lo, hi) of a sequence of ``seqlen_k`` keys, and ``full_hi``: blocks before it hold
    keys of the sequence only (no mask)."""
    n_blocks = gl.cdiv(seqlen_k, BLOCK_N)
    per_split = gl.cdiv(n_blocks, num_splits)
    lo = gl.minimum(split * per_split, n_blocks)
    hi = gl.minimum(lo + per_split, n_blocks)
    full_hi = gl.maximum(gl.minimum(hi, seqlen_k // BLOCK_N), lo)
    return lo, full_hi, hi


@gluon.jit
def _sequence_span(span, BLOCK_N: gl.constexpr):
    """This program's keys: (seqlen_k, lo, full_hi, hi, the new tokens to attend to and append). ``span``: the
    sequence's CacheSeqlens entry, the keys a launch before this one appended, the capacity, this split, the splits,
    the step's new tokens and ``fault`` (``_record``'s arguments for cache_seqlens).

    A length out of range (below 0, or leaving the step's keys no room in the cache) is clamped into the cache, and
    the step's new tokens are then neither attended to nor written: a bad index never writes."""
    seqlens, extra_keys, capacity, split, num_splits, seqlen_new, fault = span
    raw = gl.load(seqlens)
    fits = (raw >= 0) & (raw <= capacity - extra_keys - seqlen_new)
    _record(fault, ~fits)
    seqlen_k = gl.minimum(gl.maximum(raw + extra_keys, 0), capacity)
    lo, full_hi, hi = _split_blocks(seqlen_k, split, num_splits, BLOCK_N)
    return seqlen_k, lo, full_hi, hi, gl.where(fits, seqlen_new, 0)


@gluon.jit
def _record(fault, bad):
    """Where ``bad``, record a fault (``flashattn.faults``): ``fault`` holds the slot's address, the value to store
    (the batch element + 1) and whether this program records."""
    address, value, records = fault
    gl.store(address, value, mask=records & bad)


@gluon.jit
def _program_keys(span, EARLY_FIRST_BLOCK: gl.constexpr, BLOCK_N: gl.constexpr):
    """``_sequence_span`` in a partition: computed there with EARLY_FIRST_BLOCK (``span`` its arguments), else
    computed before the partitions (``span`` its result)."""
    if EARLY_FIRST_BLOCK:
        return _sequence_span(span, BLOCK_N)
    else:
        return span


@gluon.jit
def _cache_row(position, valid, kv_row, table_row, page_size, num_pages, page_fault, PAGED: gl.constexpr):
    """The cache row (of the descriptors' rows) of key ``position`` of the sequence: ``kv_row`` + position in a
    contiguous cache; in a paged one, the row in its page of the pool (``table_row``: the sequence's block-table row;
    read only where ``valid``, a position inside the sequence). A page index outside the pool reads page 0, and is
    recorded (``page_fault``: ``_record``'s arguments for block_table)."""
    if PAGED:
        page = gl.load(table_row + position // page_size, mask=valid, other=0)
        page_ok = (page >= 0) & (page < num_pages)
        _record(page_fault, valid & ~page_ok)
        page = gl.where(page_ok, page, 0)
        return page * page_size + position % page_size
    else:
        return kv_row + position


@gluon.jit
def _block_at(i, first, full_hi, rotation, ROTATE: gl.constexpr):
    """The key block a split loads i-th (i from its first block): with ROTATE its whole blocks from ``first`` on,
    [first, full_hi), from first + ``rotation`` on, wrapping around; the blocks before ``first`` and the masked ones
    in place. The consumer takes whole blocks in any order (the softmax does not depend on it)."""
    if ROTATE:
        rotated = first + (i - first + rotation) % gl.maximum(full_hi - first, 1)
        return gl.where((i >= first) & (i < full_hi), rotated, i)
    else:
        return i


@gluon.jit
def _decode_loader(loads, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr, PAGED: gl.constexpr,
                   EARLY_FIRST_BLOCK: gl.constexpr):
    """The group's query rows (a q_desc block from ``q_row``); with ``has_new`` a block of the step's new keys and
    values from their own tensors (rows from ``new_row``), first, so that its copy overlaps the cache's stream instead
    of following it; then the split's key blocks [lo, hi) of this kv head (``_cache_row``; columns from ``column``), a
    contiguous cache's whole blocks from ``rotation`` on (``_block_at``). A paged block lies in one page (BLOCK_N
    divides the page size). ``loads``: the descriptors, buffers, barriers and this program's rows, split and keys
    (``span``, ``_program_keys``), in the kernel's order.

    The split's partly filled last block, if it has one, holds rows past the sequence: whatever the cache holds there
    (NaN in a cache allocated empty), which would reach the O^T product as 0 x NaN however the scores are masked.
    Once that block's V has landed the loader zeroes those rows and arrives on ``zeroed``, which its consumer waits
    for before the product. Its copy is the loader's last (or split 0's early block 0), so the wait holds back no
    other copy.

    With EARLY_FIRST_BLOCK split 0's first block is block 0 whatever the sequence's length: its copy (and a paged
    cache's lookup of its page) is issued before the length arrives, which the other copies wait for; the whole
    blocks after it rotate."""
    (q_desc, k_desc, v_desc, kn_desc, vn_desc, q_smem, k_bufs, v_bufs, q_ready, k_ready, v_ready, k_free, v_free,
     zeroed, q_row, kv_row, table_row, page_size, num_pages, sequence, column, split, span, has_new, rotation,
     page_fault) = loads
    mbarrier.expect(q_ready, q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [q_row, 0], q_ready, q_smem)
    first = split * 0  # the ring position of the cache's first block
    if has_new:
        load_key_block(kn_desc, vn_desc, k_bufs, v_bufs, k_ready, v_ready, k_free, v_free, 0, sequence, 0, 0, column,
                       NUM_STAGES)
        first += 1
    if EARLY_FIRST_BLOCK:  # noqa: SIM102 - a build's choice (constexpr) around a program's (run time)
        if split == 0:
            load_key_block(k_desc, v_desc, k_bufs, v_bufs, k_ready, v_ready, k_free, v_free, first, 0,
                           _cache_row(0, split == 0, kv_row, table_row, page_size, num_pages, page_fault, PAGED), 0,
                           column, NUM_STAGES)
    seqlen_k, lo, full_hi, hi, _ = _program_keys(span, EARLY_FIRST_BLOCK, BLOCK_N)
    start = lo
    if EARLY_FIRST_BLOCK:
        if (split == 0) & (hi == 0):
            # an empty sequence: no consumer takes block 0, whose copies land before the program ends
            mbarrier.wait(k_ready.index(first % NUM_STAGES), 0)
            mbarrier.wait(v_ready.index(first % NUM_STAGES), 0)
        start += gl.where((split == 0) & (hi > lo), 1, 0)
    # each block's row is looked up one block ahead: a paged lookup (a load) then waits behind the block before's
    # copies instead of in front of its own
    row = _cache_row(_block_at(start, start, full_hi, rotation, not PAGED) * BLOCK_N, start < hi, kv_row, table_row,
                     page_size, num_pages, page_fault, PAGED)
    for j in range(start, hi):
        next_row = _cache_row(_block_at(j + 1, start, full_hi, rotation, not PAGED) * BLOCK_N, j + 1 < hi, kv_row,
                              table_row, page_size, num_pages, page_fault, PAGED)
        load_key_block(k_desc, v_desc, k_bufs, v_bufs, k_ready, v_ready, k_free, v_free, first + j - lo, 0, row, 0,
                       column, NUM_STAGES)
        row = next_row
    if hi > full_hi:
        # block hi - 1 (the masked one, never rotated) at its ring position, as every block: split 0's early block 0
        # too, which the loop starts after
        stage, phase = _ring_slot(first + hi - 1 - lo, NUM_STAGES)
        mbarrier.wait(v_ready.index(stage), phase)
        zero_rows_from(v_bufs.index(stage), seqlen_k - (hi - 1) * BLOCK_N, 32)
        fence_async_shared()  # the stores, made through the generic proxy, before wgmma reads them
        gl.thread_barrier()  # every lane's stores before the arrival (issued by the warp's first thread)
        mbarrier.arrive(zeroed, count=1)


@gluon.jit
def _append_new_keys(new_src, new_dst, first_position, seqlen_new, appends, HEAD_DIM: gl.constexpr,
                     NEW_KEYS: gl.constexpr, PAGED: gl.constexpr):
    """The append: where ``appends`` (one program of each sequence and kv head), the step's ``seqlen_new`` new keys and
    values (``new_src``: k and v pointers to the first new token's row of this head, and the token stride) into the
    cache rows from ``first_position``, the sequence's length, on (``new_dst``: k and v pointers to this head's
    column of cache row 0, the row stride and the ``_cache_row`` arguments). Other programs of the launch read those
    cache rows only in the masked part of a block (keys past the cache's old length), so they never see the stores."""
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (HEAD_DIM // 8), HEAD_DIM // 8], [4, 1], [1, 0])
    tokens = gl.arange(0, NEW_KEYS, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, layout))
    ok = (tokens < seqlen_new) & appends
    k_src, v_src, stride_src = new_src
    k_dst, v_dst, stride_dst, kv_row, table_row, page_size, num_pages, page_fault = new_dst
    positions = first_position + tokens
    if PAGED:
        page = gl.load(table_row + positions // page_size, mask=ok, other=0)
        page_ok = (page >= 0) & (page < num_pages)
        _record(page_fault, gl.max((ok & ~page_ok).to(gl.int32), axis=0) > 0)
        ok = ok & page_ok
        rows = gl.where(ok, page, 0).to(gl.int64) * page_size + positions % page_size
    else:
        rows = kv_row + positions.to(gl.int64)
    mask = ok[:, None]
    src = tokens.to(gl.int64)[:, None] * stride_src + cols[None, :]
    dst = rows[:, None] * stride_dst + cols[None, :]
    gl.store(k_dst + dst, gl.load(k_src + src, mask=mask), mask=mask)
    gl.store(v_dst + dst, gl.load(v_src + src, mask=mask), mask=mask)


@gluon.jit
def _padded_consumer(q_smem, k_bufs, v_bufs, q_ready, q_free, k_ready, v_ready, k_free, v_free, zeroed, Out, Lse,
                     out_offset, lse_offset, stride_oh, stride_lh, rows, span, has_new, appends, new_src, new_dst,
                     qk_scale_log2, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
                     NEW_KEYS: gl.constexpr, PAGED: gl.constexpr, EARLY_FIRST_BLOCK: gl.constexpr):
    """The consumer of groups of more than 16 query rows: the group's rows padded to wgmma's 64, the forward's key loop
    (``_key_blocks``)."""
    seqlen_k, lo, full_hi, hi, seqlen_new = _program_keys(span, EARLY_FIRST_BLOCK, BLOCK_N)
    s_layout: gl.constexpr = wgmma_layout(BLOCK_N)
    o_layout: gl.constexpr = wgmma_layout(HEAD_DIM)
    row_ids = gl.arange(0, ROWS_PER_WARPGROUP, layout=gl.SliceLayout(1, s_layout))
    m_i = gl.full([ROWS_PER_WARPGROUP], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = zero_row_sums(ROWS_PER_WARPGROUP, BLOCK_N, s_layout, partial_row_sums(HEAD_DIM))
    acc = gl.zeros([ROWS_PER_WARPGROUP, HEAD_DIM], gl.float32, o_layout)
    first = lo * 0  # the ring position of the cache's first block
    if NEW_KEYS > 0:
        # the append's stores before the key loop, where their loads' latency hides behind the loader's first copies;
        # then the new keys' block, the ring's first (the loader's order)
        _append_new_keys(new_src, new_dst, seqlen_k, seqlen_new, appends, HEAD_DIM, NEW_KEYS, PAGED)
        new_blocks = gl.where(has_new, 1, 0)
        mbarrier.wait(q_ready, 0)
        m_i, l_i, acc = _key_blocks(q_smem, k_bufs, v_bufs, k_ready, v_ready, k_free, v_free, q_free, 0, m_i, l_i,
                                    acc, row_ids, new_blocks * 0, new_blocks, False, 1, seqlen_new, qk_scale_log2,
                                    zeroed, BLOCK_N, HEAD_DIM, NUM_STAGES, False, True, False)
        first = new_blocks
    else:
        mbarrier.wait(q_ready, 0)
    # the blocks of whole keys (in the loader's order: only their count matters here), then the sequence's last,
    # partly filled one
    m_i, l_i, acc = _key_blocks(q_smem, k_bufs, v_bufs, k_ready, v_ready, k_free, v_free, q_free, first - lo, m_i,
                                l_i, acc, row_ids, lo, full_hi, False, 1, seqlen_k, qk_scale_log2, zeroed, BLOCK_N,
                                HEAD_DIM, NUM_STAGES, False, False, False)
    m_i, l_i, acc = _key_blocks(q_smem, k_bufs, v_bufs, k_ready, v_ready, k_free, v_free, q_free, first - lo, m_i,
                                l_i, acc, row_ids, full_hi, hi, False, 1, seqlen_k, qk_scale_log2, zeroed, BLOCK_N,
                                HEAD_DIM, NUM_STAGES, False, True, True)
    # -- normalize; a split that saw no key gives 0 and lse = +inf, as the Triton kernel --
    l_i = row_sums(l_i, s_layout)
    empty = l_i == 0.0
    l_safe = gl.where(empty, 1.0, l_i)
    acc = acc / gl.convert_layout(l_safe, gl.SliceLayout(1, o_layout))[:, None]
    lse = gl.where(empty, float("inf"), (m_i + gl.log2(l_safe)) / LOG2E)
    gl.store(Lse + lse_offset + row_ids.to(gl.int64) * stride_lh, lse, mask=row_ids < rows)
    out_rows = gl.arange(0, ROWS_PER_WARPGROUP, layout=gl.SliceLayout(1, o_layout))
    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
    offsets = out_offset + out_rows.to(gl.int64)[:, None] * stride_oh + cols[None, :]
    gl.store(Out + offsets, acc.to(Out.dtype.element_ty), mask=(out_rows < rows)[:, None])


@gluon.jit
def _swapped_softmax(s, m_i, l_acc, j, seqlen_k, qk_scale_log2, BLOCK_N: gl.constexpr, MASKED: gl.constexpr,
                     layout: gl.constexpr):
    """Online softmax of one S^T block (keys x query rows) in base 2, down the keys: (new max, the sums' partials
    rescaled and grown by P, P^T, the old accumulator's factor). The sums stay per element until the epilogue, so
    that a block crosses the warps once (its max), not twice."""
    if MASKED:
        keys = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, layout))
        s = gl.where((keys < seqlen_k)[:, None], s, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, axis=0) * qk_scale_log2)
        # a query row that has seen no key keeps max -inf: subtract 0 instead, so that exp2 gives 0, not NaN
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_new = gl.maximum(m_i, gl.max(s, axis=0) * qk_scale_log2)
        m_use = m_new
    p = gl.exp2(s * qk_scale_log2 - m_use[None, :])
    alpha = gl.exp2(m_i - m_use)
    l_acc = l_acc * alpha[None, :] + p
    return m_new, l_acc, p, alpha


@gluon.jit
def _stage_probabilities(p, p_smem):
    """P^T into shared memory, the B operand of the next O^T product: every warp's stores land (and are visible to
    the tensor cores' reads) before any warp issues it."""
    p_smem.store(p.to(p_smem.dtype))
    fence_async_shared()
    gl.thread_barrier()


@gluon.jit
def _ring_slot(position, NUM_STAGES: gl.constexpr):
    """The ring stage of key block ``position`` (the blocks loaded before it) and the phase of its barriers."""
    return position % NUM_STAGES, (position // NUM_STAGES) & 1


@gluon.jit
def _swapped_blocks(q_smem, k_bufs, v_bufs, p_smem, k_ready, v_ready, k_free, v_free, zeroed, ring, m_i, l_acc, acc,
                    lo, hi, seqlen_k, qk_scale_log2, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                    QUERY_ROWS: gl.constexpr, NUM_STAGES: gl.constexpr, MASKED: gl.constexpr, ZEROED: gl.constexpr,
                    CONSUMER: gl.constexpr, CONSUMERS: gl.constexpr):
    """This consumer's key blocks of [lo, hi) (block j at ring position ``ring`` + j; with CONSUMERS consumers, those
    at positions CONSUMER mod CONSUMERS) as swapped products: S^T = K Q^T (BLOCK_N x QUERY_ROWS) and O^T += V^T P^T
    (HEAD_DIM x QUERY_ROWS), P^T through shared memory. A block's S^T runs while the block before's O^T product is in
    flight, as in the forward's loop. ``ZEROED``: the run's last block is the sequence's partly filled one, whose O^T
    product waits for the loader's zeroing of the values past the sequence (barrier ``zeroed``)."""
    lo = lo + (CONSUMER + CONSUMERS - (ring + lo) % CONSUMERS) % CONSUMERS
    layout: gl.constexpr = swapped_layout(QUERY_ROWS)
    s_zero = gl.zeros([BLOCK_N, QUERY_ROWS], gl.float32, layout)
    q_t = q_smem.permute((1, 0))
    if hi > lo:
        stage, phase = _ring_slot(ring + lo, NUM_STAGES)
        mbarrier.wait(k_ready.index(stage), phase)
        s = warpgroup_mma(k_bufs.index(stage), q_t, s_zero, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
        mbarrier.arrive(k_free.index(stage), count=1)
        m_i, l_acc, p, alpha = _swapped_softmax(s, m_i, l_acc, lo, seqlen_k, qk_scale_log2, BLOCK_N, MASKED, layout)
        acc = acc * alpha[None, :]
        _stage_probabilities(p, p_smem)
        for j in range(lo + CONSUMERS, hi, CONSUMERS):
            prev_stage, prev_phase = stage, phase
            stage, phase = _ring_slot(ring + j, NUM_STAGES)
            mbarrier.wait(k_ready.index(stage), phase)
            mbarrier.wait(v_ready.index(prev_stage), prev_phase)
            s = warpgroup_mma(k_bufs.index(stage), q_t, s_zero, use_acc=False, is_async=True)
            acc = warpgroup_mma(v_bufs.index(prev_stage).permute((1, 0)), p_smem, acc, is_async=True)
            s = warpgroup_mma_wait(num_outstanding=1, deps=(s, ))
            mbarrier.arrive(k_free.index(stage), count=1)
            m_i, l_acc, p, alpha = _swapped_softmax(s, m_i, l_acc, j, seqlen_k, qk_scale_log2, BLOCK_N, MASKED,
                                                    layout)
            # P^T's buffer is free once the product before has read it
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
            mbarrier.arrive(v_free.index(prev_stage), count=1)
            acc = acc * alpha[None, :]
            _stage_probabilities(p, p_smem)
        mbarrier.wait(v_ready.index(stage), phase)
        if ZEROED:
            mbarrier.wait(zeroed, 0)
        acc = warpgroup_mma(v_bufs.index(stage).permute((1, 0)), p_smem, acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        mbarrier.arrive(v_free.index(stage), count=1)
    return m_i, l_acc, acc


@gluon.jit
def _swapped_consumer(step, p_smem, merge, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
                      NEW_KEYS: gl.constexpr, PAGED: gl.constexpr, QUERY_ROWS: gl.constexpr, CONSUMER: gl.constexpr,
                      CONSUMERS: gl.constexpr, EARLY_FIRST_BLOCK: gl.constexpr):
    """The consumer with the products swapped: the keys (and for O the head dims) along wgmma's 64-row side, the
    group's few query rows along its 8-64 columns, so that no product or exponential is spent on rows of no query.
    With CONSUMERS = 2 two of them take the ring's blocks in turn; the second hands its max, sum and O^T to the
    first through ``merge`` (shared buffers and a barrier), which merges them and writes the result. ``step``: what
    every consumer of the program shares (the kernel's ``consumer_step``); ``p_smem``: this consumer's P^T buffer."""
    (q_smem, k_bufs, v_bufs, q_ready, k_ready, v_ready, k_free, v_free, zeroed, Out, Lse, out_offset, lse_offset,
     stride_oh, stride_lh, rows, span, has_new, appends, new_src, new_dst, qk_scale_log2) = step
    gl.static_assert(BLOCK_N == 64, "64-key blocks: the swapped products of 128-key ones faulted on the GPU")
    # consumer c takes ring positions c mod CONSUMERS; a stage count that they do not divide hands a stage to each in
    # turn, and a consumer ahead of the other may then pass its parity wait on a stage whose copy for the other's block
    # has not landed (the phase before looks complete): a 5-stage ring faults on the GPU (docs/perf-notes.md)
    gl.static_assert(NUM_STAGES % CONSUMERS == 0, "each consumer keeps its own stages")
    seqlen_k, lo, full_hi, hi, seqlen_new = _program_keys(span, EARLY_FIRST_BLOCK, BLOCK_N)
    layout: gl.constexpr = swapped_layout(QUERY_ROWS)
    m_i = gl.full([QUERY_ROWS], float("-inf"), gl.float32, gl.SliceLayout(0, layout))
    l_acc = gl.zeros([BLOCK_N, QUERY_ROWS], gl.float32, layout)
    acc = gl.zeros([HEAD_DIM, QUERY_ROWS], gl.float32, layout)
    first = lo * 0  # the ring position of the cache's first block
    if NEW_KEYS > 0:
        if CONSUMER == 0:
            _append_new_keys(new_src, new_dst, seqlen_k, seqlen_new, appends, HEAD_DIM, NEW_KEYS, PAGED)
        new_blocks = gl.where(has_new, 1, 0)
        mbarrier.wait(q_ready, 0)
        m_i, l_acc, acc = _swapped_blocks(q_smem, k_bufs, v_bufs, p_smem, k_ready, v_ready, k_free, v_free, zeroed, 0,
                                          m_i, l_acc, acc, new_blocks * 0, new_blocks, seqlen_new, qk_scale_log2,
                                          BLOCK_N, HEAD_DIM, QUERY_ROWS, NUM_STAGES, True, False, CONSUMER, CONSUMERS)
        first = new_blocks
    else:
        mbarrier.wait(q_ready, 0)
    m_i, l_acc, acc = _swapped_blocks(q_smem, k_bufs, v_bufs, p_smem, k_ready, v_ready, k_free, v_free, zeroed,
                                      first - lo, m_i, l_acc, acc, lo, full_hi, seqlen_k, qk_scale_log2, BLOCK_N,
                                      HEAD_DIM, QUERY_ROWS, NUM_STAGES, False, False, CONSUMER, CONSUMERS)
    m_i, l_acc, acc = _swapped_blocks(q_smem, k_bufs, v_bufs, p_smem, k_ready, v_ready, k_free, v_free, zeroed,
                                      first - lo, m_i, l_acc, acc, full_hi, hi, seqlen_k, qk_scale_log2, BLOCK_N,
                                      HEAD_DIM, QUERY_ROWS, NUM_STAGES, True, True, CONSUMER, CONSUMERS)
    l_i = gl.sum(l_acc, axis=0)
    if CONSUMER == 1:
        _hand_over_state(m_i, l_i, acc, merge)
    else:
        if CONSUMERS == 2:
            m_i, l_i, acc = _merge_state(m_i, l_i, acc, merge, HEAD_DIM, QUERY_ROWS)
        _swapped_epilogue(m_i, l_i, acc, Out, Lse, out_offset, lse_offset, stride_oh, stride_lh, rows, HEAD_DIM,
                          QUERY_ROWS)


@gluon.jit
def _hand_over_state(m_i, l_i, acc, merge):
    """The second consumer's running max, sum and O^T into the merge buffers, every warp's stores before the
    barrier's arrival (issued by the partition's first thread)."""
    m_buf, l_buf, acc_buf, merged = merge
    m_buf.store(m_i)
    l_buf.store(l_i)
    acc_buf.store(acc)
    gl.thread_barrier()
    mbarrier.arrive(merged, count=1)


@gluon.jit
def _merge_state(m_i, l_i, acc, merge, HEAD_DIM: gl.constexpr, QUERY_ROWS: gl.constexpr):
    """This consumer's state merged with the other's (``_hand_over_state``) by their maxima, in base 2."""
    layout: gl.constexpr = swapped_layout(QUERY_ROWS)
    m_buf, l_buf, acc_buf, merged = merge
    mbarrier.wait(merged, 0)
    m_other = m_buf.load(gl.SliceLayout(0, layout))
    l_other = l_buf.load(gl.SliceLayout(0, layout))
    acc_other = acc_buf.load(layout)
    m_new = gl.maximum(m_i, m_other)
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)  # neither saw a key: both factors 0
    own = gl.exp2(m_i - m_use)
    other = gl.exp2(m_other - m_use)
    acc = acc * own[None, :] + acc_other * other[None, :]
    return m_new, l_i * own + l_other * other, acc


@gluon.jit
def _swapped_epilogue(m_i, l_i, acc, Out, Lse, out_offset, lse_offset, stride_oh, stride_lh, rows,
                      HEAD_DIM: gl.constexpr, QUERY_ROWS: gl.constexpr):
    """Normalize and store; a split that saw no key gives 0 and lse = +inf, as the Triton kernel."""
    layout: gl.constexpr = swapped_layout(QUERY_ROWS)
    empty = l_i == 0.0
    l_safe = gl.where(empty, 1.0, l_i)
    acc = acc / l_safe[None, :]
    lse = gl.where(empty, float("inf"), (m_i + gl.log2(l_safe)) / LOG2E)
    queries = gl.arange(0, QUERY_ROWS, layout=gl.SliceLayout(0, layout))
    gl.store(Lse + lse_offset + queries.to(gl.int64) * stride_lh, lse, mask=queries < rows)
    dims = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(1, layout))
    offsets = out_offset + queries.to(gl.int64)[None, :] * stride_oh + dims[:, None]
    gl.store(Out + offsets, acc.to(Out.dtype.element_ty), mask=(queries < rows)[None, :])


@gluon.jit
def kvcache_decode_hopper_kernel(
    q_desc, k_desc, v_desc, kn_desc, vn_desc, Out, Lse, CacheSeqlens, KCache, VCache, KNew, VNew, BlockTable, Faults,
    stride_os, stride_ob, stride_oh, stride_ls, stride_lb, stride_lh,
    stride_kcn, stride_kch, stride_knb, stride_knn, stride_knh, stride_btb,
    nheads, nheads_k, capacity, num_splits, seqlen_new, extra_keys, page_size, num_pages, record_faults, qk_scale_log2,
    HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr, LOADER_REGISTERS: gl.constexpr,
    NEW_KEYS: gl.constexpr, PAGED: gl.constexpr, QUERY_ROWS: gl.constexpr, CONSUMERS: gl.constexpr,
    CONSUMER_REGISTERS: gl.constexpr, EARLY_FIRST_BLOCK: gl.constexpr,
):
    """Grid (batch x kv heads, splits). q_desc: the queries as (batch x heads, HEAD_DIM) rows, QUERY_ROWS a block for
    swapped products (``_swapped_consumer``), 64 with QUERY_ROWS = 0 (``_padded_consumer``); k/v_desc:
    the caches as (batch x capacity, kv heads x HEAD_DIM), BLOCK_N rows a block, or with PAGED the page pool as
    (num_pages x page_size, kv heads x HEAD_DIM) rows, sequence b's pages in BlockTable row b. Out/Lse: split s's
    output (batch, 1, heads, HEAD_DIM) and lse (batch, heads, 1) at s x stride_os / stride_ls. stride_kcn: the
    caches' row stride (K's and V's alike, whole rows), stride_kch their head stride.

    NEW_KEYS > 0: the step appends ``seqlen_new`` (<= NEW_KEYS, at most BLOCK_N) new keys and values at
    CacheSeqlens (KNew/VNew, (batch, seqlen_new, kv heads, HEAD_DIM), and kn/vn_desc over them as (batch,
    seqlen_new, kv heads x HEAD_DIM) sequence descriptors, whose rows past seqlen_new read zeros): the last split
    attends to them from KNew/VNew, split 0 writes them into the caches (KCache/VCache, whose V strides are K's).

    CONSUMERS: swapped consumer warpgroups (1 or 2; CONSUMER_REGISTERS, the second one's registers a thread).

    Indices are clamped into the cache; with ``record_faults`` != 0, those out of range are recorded in Faults
    (``flashattn.faults``).

    EARLY_FIRST_BLOCK: each partition reads the sequence's length itself, and split 0's loader copies block 0 before
    it arrives (``_decode_loader``). Values computed before ``warp_specialize`` reach the worker partitions only
    once all are ready: read here, the length holds every copy of the program behind it, but its latency overlaps
    the setup of the barriers, which a partition's own read follows. Launches of many short splits, whose splits but
    the first gain nothing from the early copy, read it here (``configs.hopper_decode_early_first_block``)."""
    batch_head = gl.program_id(0)
    split = gl.program_id(1)
    batch = batch_head // nheads_k
    head_k = batch_head % nheads_k
    group_size = nheads // nheads_k
    # the keys in the cache: CacheSeqlens, plus ``extra_keys`` that a launch before this one appended
    records = record_faults != 0
    span = (CacheSeqlens + batch, extra_keys, capacity, split, num_splits, seqlen_new,
            (Faults + SLOT_CACHE_SEQLENS, batch + 1, records & (split == 0) & (head_k == 0)))
    page_fault = (Faults + SLOT_BLOCK_TABLE, batch + 1, records)
    if not EARLY_FIRST_BLOCK:
        span = _sequence_span(span, BLOCK_N)
    has_new = (NEW_KEYS > 0) & (split == num_splits - 1)
    new_src = (KNew + batch.to(gl.int64) * stride_knb + head_k.to(gl.int64) * stride_knh,
               VNew + batch.to(gl.int64) * stride_knb + head_k.to(gl.int64) * stride_knh, stride_knn)
    kv_row = batch * capacity  # a contiguous cache's first row of this sequence
    table_row = BlockTable + batch.to(gl.int64) * stride_btb
    head_column = head_k.to(gl.int64) * stride_kch
    new_dst = (KCache + head_column, VCache + head_column, stride_kcn, kv_row, table_row, page_size, num_pages,
               page_fault)
    first_head = head_k * group_size
    # a contiguous cache's (sequence, split) streams, each of its kv heads' programs alike, start their whole blocks
    # at offsets of their own (a 2-4% shorter step at batch 2, whose 8 splits start 1 MB apart: docs/perf-notes.md)
    rotation = (batch * num_splits + split) * 37
    out_offset = split.to(gl.int64) * stride_os + batch.to(gl.int64) * stride_ob + first_head.to(gl.int64) * stride_oh
    lse_offset = split.to(gl.int64) * stride_ls + batch.to(gl.int64) * stride_lb + first_head.to(gl.int64) * stride_lh

    q_smem = gl.allocate_shared_memory(q_desc.dtype, q_desc.block_type.shape, q_desc.layout)
    k_bufs, v_bufs, k_ready, v_ready, k_free, v_free = key_ring(k_desc, v_desc, HEAD_DIM, BLOCK_N, NUM_STAGES, 1)
    q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(q_ready, count=1)
    zeroed = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())  # ``_decode_loader``
    mbarrier.init(zeroed, count=1)

    # the loader's constexprs are written out in each launch below: held in a variable's tuple, Triton 3.6's Gluon
    # passes them to the partition as run-time values (the compiler folded these back; a static_range over one fails)
    loads = (q_desc, k_desc, v_desc, kn_desc, vn_desc, q_smem, k_bufs, v_bufs, q_ready, k_ready, v_ready, k_free,
             v_free, zeroed, batch * nheads + first_head, kv_row, table_row, page_size, num_pages, batch,
             head_k * HEAD_DIM, split, span, has_new, rotation, page_fault)
    if QUERY_ROWS > 0:
        consumer_step = (q_smem, k_bufs, v_bufs, q_ready, k_ready, v_ready, k_free, v_free, zeroed, Out, Lse,
                         out_offset, lse_offset, stride_oh, stride_lh, group_size, span, has_new, split == 0, new_src,
                         new_dst, qk_scale_log2)
        p_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, QUERY_ROWS], q_desc.dtype)
        p_smem = gl.allocate_shared_memory(q_desc.dtype, [CONSUMERS, BLOCK_N, QUERY_ROWS], p_layout)
        if CONSUMERS == 2:
            vector_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
            merged = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
            mbarrier.init(merged, count=1)
            merge = (gl.allocate_shared_memory(gl.float32, [QUERY_ROWS], vector_layout),
                     gl.allocate_shared_memory(gl.float32, [QUERY_ROWS], vector_layout),
                     gl.allocate_shared_memory(gl.float32, [HEAD_DIM, QUERY_ROWS],
                                               gl.SwizzledSharedLayout(1, 1, 1, [1, 0])), merged)
            gl.warp_specialize([
                (_swapped_consumer, (consumer_step, p_smem.index(0), merge, HEAD_DIM, BLOCK_N, NUM_STAGES, NEW_KEYS,
                                     PAGED, QUERY_ROWS, 0, 2, EARLY_FIRST_BLOCK)),
                (_swapped_consumer, (consumer_step, p_smem.index(1), merge, HEAD_DIM, BLOCK_N, NUM_STAGES, NEW_KEYS,
                                     PAGED, QUERY_ROWS, 1, 2, EARLY_FIRST_BLOCK)),
                (_decode_loader, (loads, BLOCK_N, NUM_STAGES, PAGED, EARLY_FIRST_BLOCK)),
            ], [4, 1], [CONSUMER_REGISTERS, LOADER_REGISTERS])
        else:
            gl.warp_specialize([
                (_swapped_consumer, (consumer_step, p_smem.index(0), 0, HEAD_DIM, BLOCK_N, NUM_STAGES, NEW_KEYS, PAGED,
                                     QUERY_ROWS, 0, 1, EARLY_FIRST_BLOCK)),
                (_decode_loader, (loads, BLOCK_N, NUM_STAGES, PAGED, EARLY_FIRST_BLOCK)),
            ], [1], [LOADER_REGISTERS])
    else:
        # the forward's key loop takes a Q-release barrier, which the one consumer here never arrives on: left
        # uninitialized, since the compiler gives an unused barrier's memory to other shared memory, and an initialized
        # barrier's must not be used as data (forward_hopper.zeroing_barrier)
        q_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        gl.warp_specialize([
            (_padded_consumer, (q_smem, k_bufs, v_bufs, q_ready, q_free, k_ready, v_ready, k_free, v_free, zeroed,
                                Out, Lse, out_offset, lse_offset, stride_oh, stride_lh, group_size, span, has_new,
                                split == 0, new_src, new_dst, qk_scale_log2, HEAD_DIM, BLOCK_N, NUM_STAGES, NEW_KEYS,
                                PAGED, EARLY_FIRST_BLOCK)),
            (_decode_loader, (loads, BLOCK_N, NUM_STAGES, PAGED, EARLY_FIRST_BLOCK)),
        ], [1], [LOADER_REGISTERS])
