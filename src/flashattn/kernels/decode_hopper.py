"""Hopper decode attention in Gluon: one GQA group's query rows over a split of a contiguous KV cache.

The Triton decode kernel (``kernels/decode.py``) issues its own K/V loads from the warps that compute, in 16-row
``mma`` tiles whose softmax crosses the warps at every key block (nine barriers a block). Here, as in the Gluon
forward (``forward_hopper.py``, whose key loop and K/V ring this kernel shares), a loader warp streams the split's
K and V blocks through TMA into a ring of ``NUM_STAGES`` shared-memory stages, and one consumer warpgroup runs
S = Q K^T and O += P V as 64-row wgmma products. A group has only ``group_size x seqlen_q`` real rows (4 for GQA
32/8 at one token): the other rows of the 64 are computed and never stored. That work is free here: a decode
step reads each K/V byte once, and its time is the time to stream the cache.

Program (b x kv head, split) writes its split's normalized output and log-sum-exp for the group's rows, in the
layout of the Triton kernel's partials (``decode_ops``: merged by ``kernels/combine.py`` when split), or straight
into the output when unsplit.

Limits, checked by the launcher (``decode_ops._gluon_decode_fits``): one query token, no new keys to append, a
contiguous cache with whole rows per token, 16-bit inputs, head dims 64 and 128, no ALiBi, softcap, window, rotary,
left padding or batch index.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from .forward_hopper import LOG2E, ROWS_PER_WARPGROUP, _key_blocks, key_ring, load_key_block, wgmma_layout


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
def _decode_loader(q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_ready, k_ready, v_ready, k_free, v_free,
                   q_row, kv_row, column, lo, hi, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr):
    """The group's 64 query rows (from ``q_row``), then the split's key blocks [lo, hi) of this kv head (rows from
    ``kv_row``, columns from ``column``) into the ring."""
    mbarrier.expect(q_ready, q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [q_row, 0], q_ready, q_smem)
    for j in range(lo, hi):
        load_key_block(k_desc, v_desc, k_bufs, v_bufs, k_ready, v_ready, k_free, v_free, j - lo,
                       kv_row + j * BLOCK_N, column, NUM_STAGES)


@gluon.jit
def _decode_consumer(q_smem, k_bufs, v_bufs, q_ready, q_free, k_ready, v_ready, k_free, v_free, turn, Out, Lse,
                     out_offset, lse_offset, stride_oh, stride_lh, rows, seqlen_k, lo, full_hi, hi, qk_scale_log2,
                     HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr):
    s_layout: gl.constexpr = wgmma_layout(BLOCK_N)
    o_layout: gl.constexpr = wgmma_layout(HEAD_DIM)
    row_ids = gl.arange(0, ROWS_PER_WARPGROUP, layout=gl.SliceLayout(1, s_layout))
    m_i = gl.full([ROWS_PER_WARPGROUP], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([ROWS_PER_WARPGROUP], gl.float32, gl.SliceLayout(1, s_layout))
    acc = gl.zeros([ROWS_PER_WARPGROUP, HEAD_DIM], gl.float32, o_layout)
    mbarrier.wait(q_ready, 0)
    # the blocks of whole keys, then the sequence's last, partly filled one (ring positions count from lo); the
    # count of product issues (ping-pong turns, unused with one consumer) starts as a run-time zero
    m_i, l_i, acc, t = _key_blocks(q_smem, k_bufs, v_bufs, k_ready, v_ready, k_free, v_free, q_free, turn, lo * 0, -lo,
                                   m_i, l_i, acc, row_ids, lo, full_hi, False, 1, seqlen_k, qk_scale_log2, BLOCK_N,
                                   HEAD_DIM, NUM_STAGES, False, False, 0, False)
    m_i, l_i, acc, t = _key_blocks(q_smem, k_bufs, v_bufs, k_ready, v_ready, k_free, v_free, q_free, turn, t, -lo,
                                   m_i, l_i, acc, row_ids, full_hi, hi, False, 1, seqlen_k, qk_scale_log2, BLOCK_N,
                                   HEAD_DIM, NUM_STAGES, False, True, 0, False)
    # -- normalize; a split that saw no key gives 0 and lse = +inf, as the Triton kernel --
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
def kvcache_decode_hopper_kernel(
    q_desc, k_desc, v_desc, Out, Lse, CacheSeqlens,
    stride_os, stride_ob, stride_oh, stride_ls, stride_lb, stride_lh,
    nheads, nheads_k, capacity, num_splits, qk_scale_log2,
    HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr, LOADER_REGISTERS: gl.constexpr,
):
    """Grid (batch x kv heads, splits). q_desc: the queries as (batch x heads, HEAD_DIM) rows, 64 a block; k/v_desc:
    the caches as (batch x capacity, kv heads x HEAD_DIM), BLOCK_N rows a block. Out/Lse: split s's output
    (batch, 1, heads, HEAD_DIM) and lse (batch, heads, 1) at s x stride_os / stride_ls."""
    batch_head = gl.program_id(0)
    split = gl.program_id(1)
    batch = batch_head // nheads_k
    head_k = batch_head % nheads_k
    group_size = nheads // nheads_k
    seqlen_k = gl.minimum(gl.maximum(gl.load(CacheSeqlens + batch), 0), capacity)
    lo, full_hi, hi = _split_blocks(seqlen_k, split, num_splits, BLOCK_N)
    first_head = head_k * group_size
    out_offset = split.to(gl.int64) * stride_os + batch.to(gl.int64) * stride_ob + first_head.to(gl.int64) * stride_oh
    lse_offset = split.to(gl.int64) * stride_ls + batch.to(gl.int64) * stride_lb + first_head.to(gl.int64) * stride_lh

    q_smem = gl.allocate_shared_memory(q_desc.dtype, [ROWS_PER_WARPGROUP, HEAD_DIM], q_desc.layout)
    k_bufs, v_bufs, k_ready, v_ready, k_free, v_free = key_ring(k_desc, v_desc, HEAD_DIM, BLOCK_N, NUM_STAGES, 1)
    q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    # the forward's key loop takes a Q-release barrier and ping-pong turns: one consumer uses neither
    q_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_ready, count=1)
    mbarrier.init(q_free, count=1)
    mbarrier.init(turn.index(0), count=1)
    mbarrier.init(turn.index(1), count=1)

    gl.warp_specialize([
        (_decode_consumer, (q_smem, k_bufs, v_bufs, q_ready, q_free, k_ready, v_ready, k_free, v_free, turn, Out,
                            Lse, out_offset, lse_offset, stride_oh, stride_lh, group_size, seqlen_k, lo, full_hi, hi,
                            qk_scale_log2, HEAD_DIM, BLOCK_N, NUM_STAGES)),
        (_decode_loader, (q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_ready, k_ready, v_ready, k_free, v_free,
                          batch * nheads + first_head, batch * capacity, head_k * HEAD_DIM, lo, hi, BLOCK_N,
                          NUM_STAGES)),
    ], [1], [LOADER_REGISTERS])
