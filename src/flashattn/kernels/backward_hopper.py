"""Hopper dK/dV in Gluon: warp-specialized, the two gradients on two warpgroups.

One program owns BLOCK_N keys (64 or 128) of one (batch, kv head) and walks the query blocks of every query head of
its GQA group.
Per query block i, with S^T = K Q_i^T and P^T = exp(S^T * scale - lse_i) (keys along the rows):

- the dV warpgroup computes S^T and P^T, hands P^T to the dK warpgroup through shared memory, and accumulates
  dV += P^T dO_i;
- the dK warpgroup computes dP^T = V dO_i^T, takes P^T, forms dS^T = P^T (dP^T - delta_i) and accumulates
  dK += dS^T Q_i;
- a loader warp fetches K and V once, then Q_i and dO_i through TMA into a ring of ``NUM_STAGES`` stages.

So each warpgroup issues two of the four products and holds one BLOCK_N x HEAD_DIM fp32 accumulator: at hdim 256 a
warpgroup cannot hold both (256 registers a thread at 64 keys), which is what FA3's split of one key block between
two warpgroups would need. 128 keys (two wgmma row blocks per warpgroup) halve how often Q and dO are read, for
head dims up to 128, where the accumulator takes 128 registers a thread. Each warpgroup overlaps its next block's
first product with its last block's second (the forward's intra-warpgroup overlap): the exponentials (dV side) and
dS (dK side) run while a product is in flight. dQ is left to the Triton dQ kernel (``kernels/backward.py``).

A stage's Q is released once S^T (dV side) and dS^T Q (dK side) have read it, its dO once dP^T and P^T dO have.
Query rows past the sequence read lse = +inf, so their P (and dS) is 0 whatever Q and dO hold there (a TMA
tile may run into the next sequence's rows). Keys past the sequence compute rows that are never stored.
Limits, checked by the launcher (``launch.backward.hopper_dq_fits`` and a dense batch): dense (not varlen) 16-bit
inputs, head dims 64, 128 or 256, causal or no mask, no dropout, softcap, ALiBi or SDPA mask.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from .forward_hopper import (
    columns_at_most,
    copy_rows,
    register_operand_layout,
    section_tile,
    tile_layout_of,
    wgmma_layout,
)

LOG2E = gl.constexpr(1.4426950408889634)


@gluon.jit
def _key_tile(seqlen_q, seqlen_k, nheads_k, key_blocks, batch_heads_k, heads_per_section, group_size,
              BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
    """This program's batch and kv head, first key, and its query blocks (the first, how many per query head, and
    over the whole group): every partition derives the same plan. Under a causal mask the tiles run in the order of
    ``sectioned_key_tile``; without one they are equal, there is no tail to balance, and the key blocks of a pair
    are consecutive programs (head-major), which measured faster than sections there (docs/perf-notes.md)."""
    tile_id = gl.program_id(0)
    if CAUSAL:
        pair, key_block = section_tile(tile_id, key_blocks, batch_heads_k, heads_per_section)
    else:
        pair, key_block = tile_id // key_blocks, tile_id % key_blocks
    return key_tile_plan(pair, key_block * BLOCK_N, seqlen_q, seqlen_k, nheads_k, group_size, BLOCK_M, CAUSAL)


@gluon.jit
def sectioned_key_tile(tile_id, seqlen_q, seqlen_k, nheads_k, key_blocks, group_size, batch_heads_k,
                       heads_per_section, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
    """``key_tile_plan`` of tile ``tile_id``: sections of ``heads_per_section`` (batch, kv head) pairs, whose Q and
    dO the programs in flight share in L2, and the key block the slower index inside a section, so that under a
    causal mask (bottom-right aligned: the first key blocks see the most query rows) every pair's longest tiles go
    first. With the pair the slower index, each section is one pair's few tiles, its longest starting as the last
    one's shortest end: a tail on some SMs (docs/perf-notes.md, "L2 head sections")."""
    pair, key_block = section_tile(tile_id, key_blocks, batch_heads_k, heads_per_section)
    return key_tile_plan(pair, key_block * BLOCK_N, seqlen_q, seqlen_k, nheads_k, group_size, BLOCK_M, CAUSAL)


@gluon.jit
def key_tile_plan(batch_head_k, key_start, seqlen_q, seqlen_k, nheads_k, group_size, BLOCK_M: gl.constexpr,
                  CAUSAL: gl.constexpr):
    """The plan of the key tile at ``key_start`` of (batch, kv head) pair ``batch_head_k``: its batch and kv head, first
    key, and its query blocks (the first, how many per query head, and over the whole group)."""
    first_q_block = 0
    if CAUSAL:
        # bottom-right aligned: query i sees keys up to i + seqlen_k - seqlen_q; rows before key_start - (seqlen_k
        # - seqlen_q) see none of this block's keys
        first_q_block = gl.maximum(key_start - (seqlen_k - seqlen_q), 0) // BLOCK_M
    per_head = gl.maximum(gl.cdiv(seqlen_q, BLOCK_M) - first_q_block, 0)
    return (batch_head_k // nheads_k, batch_head_k % nheads_k, key_start, first_q_block, per_head,
            per_head * group_size)


@gluon.jit
def _load_partition(q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, q_bufs, do_bufs, kv_ready, q_ready, do_ready,
                    q_free, do_free, seqlen_q, seqlen_k, nheads_k, key_blocks, batch_heads_k, heads_per_section,
                    group_size,
                    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
                    CAUSAL: gl.constexpr, ONE_FREE_BARRIER: gl.constexpr):
    batch, head_k, key_start, first_q_block, per_head, iterations = _key_tile(
        seqlen_q, seqlen_k, nheads_k, key_blocks, batch_heads_k, heads_per_section, group_size, BLOCK_M, BLOCK_N,
        CAUSAL)
    mbarrier.expect(kv_ready, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    copy_rows(k_desc, batch, batch * seqlen_k, key_start, head_k * HEAD_DIM, kv_ready, k_smem)
    copy_rows(v_desc, batch, batch * seqlen_k, key_start, head_k * HEAD_DIM, kv_ready, v_smem)
    for it in range(iterations):
        head = head_k * group_size + it // per_head
        q_row = (first_q_block + it % per_head) * BLOCK_M
        stage = it % NUM_STAGES
        phase = (it // NUM_STAGES) & 1
        # a fresh barrier passes a wait on the phase before its first: the first round does not wait
        mbarrier.wait(q_free.index(stage), phase ^ 1)
        mbarrier.expect(q_ready.index(stage), q_desc.block_type.nbytes)
        copy_rows(q_desc, batch, batch * seqlen_q, q_row, head * HEAD_DIM, q_ready.index(stage), q_bufs.index(stage))
        if not ONE_FREE_BARRIER:  # otherwise do_free is q_free, just waited on
            mbarrier.wait(do_free.index(stage), phase ^ 1)
        mbarrier.expect(do_ready.index(stage), do_desc.block_type.nbytes)
        copy_rows(do_desc, batch, batch * seqlen_q, q_row, head * HEAD_DIM, do_ready.index(stage),
                  do_bufs.index(stage))


@gluon.jit
def _query_columns(it, per_head, first_q_block, batch, head_k, nheads, group_size, seqlen_q,
                   BLOCK_M: gl.constexpr, s_layout: gl.constexpr):
    """Query rows of iteration ``it`` within the sequence (the columns of S^T), and where their lse / delta sit."""
    head = head_k * group_size + it // per_head
    rows = (first_q_block + it % per_head) * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, s_layout))
    return rows, (batch * nheads + head).to(gl.int64) * seqlen_q + rows


@gluon.jit
def _probabilities(s, it, per_head, first_q_block, batch, head_k, nheads, group_size, seqlen_q, seqlen_k, key_start,
                   Lse, qk_scale_log2, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
                   s_layout: gl.constexpr):
    """P^T of one (BLOCK_N keys, BLOCK_M queries) score tile from the forward's log-sum-exp."""
    rows, offsets = _query_columns(it, per_head, first_q_block, batch, head_k, nheads, group_size, seqlen_q,
                                   BLOCK_M, s_layout)
    lse_log2 = _lse_log2(Lse, offsets, rows, seqlen_q)
    p = gl.exp2(s * qk_scale_log2 - lse_log2[None, :])
    if CAUSAL:
        first_row = (first_q_block + it % per_head) * BLOCK_M
        p = gl.where(hidden_queries(key_start, first_row, seqlen_q, seqlen_k, BLOCK_N, BLOCK_M, s_layout), 0.0, p)
    return p


@gluon.jit
def _lse_log2(Lse, offsets, rows, seqlen_q):
    # rows past the sequence: lse = +inf gives P = 0 (the tile may hold the next sequence's rows)
    return gl.load(Lse + offsets, mask=rows < seqlen_q, other=float("inf")) * LOG2E


@gluon.jit
def hidden_queries(key_start, first_row, seqlen_q, seqlen_k, KEYS: gl.constexpr, BLOCK_M: gl.constexpr,
                   s_layout: gl.constexpr):
    """Where an S^T tile (``s_layout``: keys from ``key_start`` on its rows, queries from ``first_row`` on its
    columns) holds a score the causal mask hides. Bottom-right aligned, query i sees keys up to i + seqlen_k -
    seqlen_q: column c is hidden from key k while c <= k - (seqlen_k - seqlen_q) - first_row - 1, one bound a row
    (``forward_hopper.columns_at_most``)."""
    keys = key_start + gl.arange(0, KEYS, layout=gl.SliceLayout(1, s_layout))
    cols = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, s_layout))
    return columns_at_most(cols, keys - (seqlen_k - seqlen_q) - first_row - 1)


@gluon.jit
def _store_rows(acc, Grad, batch, head_k, key_start, seqlen_k, stride_gb, stride_gm, stride_gh,
                HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, acc_layout: gl.constexpr):
    keys = key_start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, acc_layout))
    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, acc_layout))
    offsets = (batch.to(gl.int64) * stride_gb + head_k * stride_gh + keys.to(gl.int64)[:, None] * stride_gm
               + cols[None, :])
    gl.store(Grad + offsets, acc.to(Grad.dtype.element_ty), mask=(keys < seqlen_k)[:, None])


@gluon.jit
def store_key_slice(dk, dv, DK, DV, batch, head_k, slice_start, seqlen_k, stride_gb, stride_gm, stride_gh,
                    softmax_scale, HEAD_DIM: gl.constexpr, SLICE_KEYS: gl.constexpr, acc_layout: gl.constexpr):
    """A key slice's dV, and its dK times softmax_scale (the scale the scores carried), into DV and DK."""
    _store_rows(dv, DV, batch, head_k, slice_start, seqlen_k, stride_gb, stride_gm, stride_gh, HEAD_DIM, SLICE_KEYS,
                acc_layout)
    _store_rows(dk * softmax_scale, DK, batch, head_k, slice_start, seqlen_k, stride_gb, stride_gm, stride_gh,
                HEAD_DIM, SLICE_KEYS, acc_layout)


@gluon.jit
def _hand_over(p, buffer, ready):
    """P^T to the dK warpgroup: every warp's stores land before one thread signals (an mbarrier arrive is issued by
    the partition's first thread)."""
    buffer.store(p)
    fence_async_shared()
    gl.thread_barrier()
    mbarrier.arrive(ready, count=1)


@gluon.jit
def _dv_partition(k_smem, q_bufs, do_bufs, p_bufs, kv_ready, q_ready, do_ready, q_free, do_free, p_ready, p_free,
                  Lse, DV, stride_gb, stride_gm, stride_gh, seqlen_q, seqlen_k, nheads, nheads_k, key_blocks,
                  batch_heads_k, heads_per_section, group_size, qk_scale_log2,
                  HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
                  CAUSAL: gl.constexpr):
    s_layout: gl.constexpr = wgmma_layout(BLOCK_M)
    acc_layout: gl.constexpr = wgmma_layout(HEAD_DIM)
    p_operand: gl.constexpr = register_operand_layout(HEAD_DIM)
    batch, head_k, key_start, first_q_block, per_head, iterations = _key_tile(
        seqlen_q, seqlen_k, nheads_k, key_blocks, batch_heads_k, heads_per_section, group_size, BLOCK_M, BLOCK_N,
        CAUSAL)
    s_zero = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, s_layout)
    dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, acc_layout)
    mbarrier.wait(kv_ready, 0)
    if iterations > 0:
        # -- prologue: block 0's scores and probabilities --
        mbarrier.wait(q_ready.index(0), 0)
        s = warpgroup_mma(k_smem, q_bufs.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
        mbarrier.arrive(q_free.index(0), count=1)
        p = _probabilities(s, 0, per_head, first_q_block, batch, head_k, nheads, group_size, seqlen_q, seqlen_k,
                           key_start, Lse, qk_scale_log2, BLOCK_M, BLOCK_N, CAUSAL, s_layout).to(k_smem.dtype)
        mbarrier.wait(p_free.index(0), 1)
        _hand_over(p, p_bufs.index(0), p_ready.index(0))
        p_op = gl.convert_layout(p, p_operand)
        stage = 0
        phase = 0
        for it in range(1, iterations):
            prev_stage = stage
            prev_phase = phase
            stage = it % NUM_STAGES
            phase = (it // NUM_STAGES) & 1
            mbarrier.wait(q_ready.index(stage), phase)
            mbarrier.wait(do_ready.index(prev_stage), prev_phase)
            # -- block it's S^T and block it-1's P^T dO in flight together --
            s = warpgroup_mma(k_smem, q_bufs.index(stage).permute((1, 0)), s_zero, use_acc=False, is_async=True)
            dv = warpgroup_mma(p_op, do_bufs.index(prev_stage), dv, is_async=True)
            s = warpgroup_mma_wait(num_outstanding=1, deps=(s, ))
            mbarrier.arrive(q_free.index(stage), count=1)
            p = _probabilities(s, it, per_head, first_q_block, batch, head_k, nheads, group_size, seqlen_q,
                               seqlen_k, key_start, Lse, qk_scale_log2, BLOCK_M, BLOCK_N, CAUSAL,
                               s_layout).to(k_smem.dtype)
            # the dK side reads P^T from a 2-buffer ring
            mbarrier.wait(p_free.index(it % 2), ((it // 2) & 1) ^ 1)
            _hand_over(p, p_bufs.index(it % 2), p_ready.index(it % 2))
            # P^T dO reads p_op from registers until it completes: keep it alive to here
            dv, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(dv, p_op))
            mbarrier.arrive(do_free.index(prev_stage), count=1)
            p_op = gl.convert_layout(p, p_operand)
        # -- epilogue: the last block's P^T dO --
        mbarrier.wait(do_ready.index(stage), phase)
        dv = warpgroup_mma(p_op, do_bufs.index(stage), dv, is_async=True)
        dv = warpgroup_mma_wait(num_outstanding=0, deps=(dv, ))
        mbarrier.arrive(do_free.index(stage), count=1)
    _store_rows(dv, DV, batch, head_k, key_start, seqlen_k, stride_gb, stride_gm, stride_gh, HEAD_DIM, BLOCK_N,
               acc_layout)


@gluon.jit
def _ds(dp, p_bufs, p_ready, p_free, it, per_head, first_q_block, batch, head_k, nheads, group_size, seqlen_q,
        Delta, BLOCK_M: gl.constexpr, s_layout: gl.constexpr):
    """dS^T = P^T (dP^T - delta) of one tile, P^T taken from the dV side."""
    rows, offsets = _query_columns(it, per_head, first_q_block, batch, head_k, nheads, group_size, seqlen_q,
                                   BLOCK_M, s_layout)
    delta = gl.load(Delta + offsets, mask=rows < seqlen_q, other=0.0)
    mbarrier.wait(p_ready.index(it % 2), (it // 2) & 1)
    p = p_bufs.index(it % 2).load(s_layout).to(gl.float32)
    gl.thread_barrier()  # every warp has read the buffer before one thread releases it
    mbarrier.arrive(p_free.index(it % 2), count=1)
    return p * (dp - delta[None, :])


@gluon.jit
def _dk_partition(v_smem, q_bufs, do_bufs, p_bufs, kv_ready, q_ready, do_ready, q_free, do_free, p_ready, p_free,
                  Delta, DK, stride_gb, stride_gm, stride_gh, seqlen_q, seqlen_k, nheads, nheads_k, key_blocks,
                  batch_heads_k, heads_per_section, group_size, softmax_scale,
                  HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
                  CAUSAL: gl.constexpr):
    s_layout: gl.constexpr = wgmma_layout(BLOCK_M)
    acc_layout: gl.constexpr = wgmma_layout(HEAD_DIM)
    ds_operand: gl.constexpr = register_operand_layout(HEAD_DIM)
    batch, head_k, key_start, first_q_block, per_head, iterations = _key_tile(
        seqlen_q, seqlen_k, nheads_k, key_blocks, batch_heads_k, heads_per_section, group_size, BLOCK_M, BLOCK_N,
        CAUSAL)
    dp_zero = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, s_layout)
    dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, acc_layout)
    mbarrier.wait(kv_ready, 0)
    if iterations > 0:
        # -- prologue: block 0's dP^T and dS^T --
        mbarrier.wait(do_ready.index(0), 0)
        dp = warpgroup_mma(v_smem, do_bufs.index(0).permute((1, 0)), dp_zero, use_acc=False, is_async=True)
        dp = warpgroup_mma_wait(num_outstanding=0, deps=(dp, ))
        mbarrier.arrive(do_free.index(0), count=1)
        ds = _ds(dp, p_bufs, p_ready, p_free, 0, per_head, first_q_block, batch, head_k, nheads, group_size,
                 seqlen_q, Delta, BLOCK_M, s_layout)
        ds_op = gl.convert_layout(ds.to(v_smem.dtype), ds_operand)
        stage = 0
        phase = 0
        for it in range(1, iterations):
            prev_stage = stage
            prev_phase = phase
            stage = it % NUM_STAGES
            phase = (it // NUM_STAGES) & 1
            mbarrier.wait(do_ready.index(stage), phase)
            mbarrier.wait(q_ready.index(prev_stage), prev_phase)
            # -- block it's dP^T and block it-1's dS^T Q in flight together --
            dp = warpgroup_mma(v_smem, do_bufs.index(stage).permute((1, 0)), dp_zero, use_acc=False, is_async=True)
            dk = warpgroup_mma(ds_op, q_bufs.index(prev_stage), dk, is_async=True)
            dp = warpgroup_mma_wait(num_outstanding=1, deps=(dp, ))
            mbarrier.arrive(do_free.index(stage), count=1)
            ds = _ds(dp, p_bufs, p_ready, p_free, it, per_head, first_q_block, batch, head_k, nheads, group_size,
                     seqlen_q, Delta, BLOCK_M, s_layout)
            dk, ds_op = warpgroup_mma_wait(num_outstanding=0, deps=(dk, ds_op))
            mbarrier.arrive(q_free.index(prev_stage), count=1)
            ds_op = gl.convert_layout(ds.to(v_smem.dtype), ds_operand)
        # -- epilogue: the last block's dS^T Q --
        mbarrier.wait(q_ready.index(stage), phase)
        dk = warpgroup_mma(ds_op, q_bufs.index(stage), dk, is_async=True)
        dk = warpgroup_mma_wait(num_outstanding=0, deps=(dk, ))
        mbarrier.arrive(q_free.index(stage), count=1)
    _store_rows(dk * softmax_scale, DK, batch, head_k, key_start, seqlen_k, stride_gb, stride_gm, stride_gh,
                HEAD_DIM, BLOCK_N, acc_layout)


@gluon.jit
def _streamed_buffers(q_desc, k_desc, v_desc, do_desc, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                      BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr, ONE_FREE_BARRIER: gl.constexpr):
    """The program's K and V tiles, the ring of Q and dO stages, and their barriers (each stage freed by two
    arrives: both consumer warpgroups read every stage). ONE_FREE_BARRIER: the consumers release a stage's Q and dO
    together, and one barrier array frees both (returned as q_free and as do_free)."""
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [BLOCK_N, HEAD_DIM], tile_layout_of(k_desc.layout))
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [BLOCK_N, HEAD_DIM], tile_layout_of(v_desc.layout))
    q_bufs = gl.allocate_shared_memory(q_desc.dtype, [NUM_STAGES, BLOCK_M, HEAD_DIM], tile_layout_of(q_desc.layout))
    do_bufs = gl.allocate_shared_memory(do_desc.dtype, [NUM_STAGES, BLOCK_M, HEAD_DIM],
                                        tile_layout_of(do_desc.layout))
    kv_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    do_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    q_free = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    if ONE_FREE_BARRIER:
        do_free = q_free
    else:
        do_free = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_ready, count=1)
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(do_ready.index(i), count=1)
        mbarrier.init(q_free.index(i), count=2)
        if not ONE_FREE_BARRIER:
            mbarrier.init(do_free.index(i), count=2)
    return k_smem, v_smem, q_bufs, do_bufs, kv_ready, q_ready, do_ready, q_free, do_free


@gluon.jit
def dkdv_hopper_kernel(
    q_desc, k_desc, v_desc, do_desc, Lse, Delta, DK, DV,
    stride_gb, stride_gm, stride_gh,
    seqlen_q, seqlen_k, nheads, nheads_k, key_blocks, batch_heads_k, heads_per_section, softmax_scale, qk_scale_log2,
    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
    CAUSAL: gl.constexpr, CONSUMER_REGISTERS: gl.constexpr, LOADER_REGISTERS: gl.constexpr,
):
    """dK and dV of BLOCK_N keys a program: ``key_blocks`` per (batch, kv head), one program each. q_desc / do_desc
    span (batch, seqlen_q, nheads * HEAD_DIM) in (1, BLOCK_M, HEAD_DIM) boxes, k_desc / v_desc (batch, seqlen_k,
    nheads_k * HEAD_DIM) in (1, BLOCK_N, HEAD_DIM) boxes (``launch.common.sequence_descriptor``): a block past a
    sequence reads zeros, which the products past it (P^T dO, dS^T Q) need. Lse and Delta: (batch, nheads,
    seqlen_q), contiguous. DK and DV: (batch, seqlen_k, nheads_k, HEAD_DIM) with strides (stride_gb, stride_gm,
    stride_gh, 1)."""
    group_size = nheads // nheads_k
    # a stage's Q is read by S^T (dV side) and dS^T Q (dK side), its dO by dP^T (dK side) and P^T dO (dV side)
    k_smem, v_smem, q_bufs, do_bufs, kv_ready, q_ready, do_ready, q_free, do_free = _streamed_buffers(
        q_desc, k_desc, v_desc, do_desc, HEAD_DIM, BLOCK_M, BLOCK_N, NUM_STAGES, False)
    p_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], q_desc.dtype)
    p_bufs = gl.allocate_shared_memory(q_desc.dtype, [2, BLOCK_N, BLOCK_M], p_layout)
    p_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    p_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(p_ready.index(i), count=1)
        mbarrier.init(p_free.index(i), count=1)

    gl.warp_specialize([
        (_dv_partition, (k_smem, q_bufs, do_bufs, p_bufs, kv_ready, q_ready, do_ready, q_free, do_free, p_ready,
                         p_free, Lse, DV, stride_gb, stride_gm, stride_gh, seqlen_q, seqlen_k, nheads, nheads_k,
                         key_blocks, batch_heads_k, heads_per_section, group_size, qk_scale_log2, HEAD_DIM, BLOCK_M,
                         BLOCK_N, NUM_STAGES, CAUSAL)),
        (_dk_partition, (v_smem, q_bufs, do_bufs, p_bufs, kv_ready, q_ready, do_ready, q_free, do_free, p_ready,
                         p_free, Delta, DK, stride_gb, stride_gm, stride_gh, seqlen_q, seqlen_k, nheads, nheads_k,
                         key_blocks, batch_heads_k, heads_per_section, group_size, softmax_scale, HEAD_DIM, BLOCK_M,
                         BLOCK_N, NUM_STAGES, CAUSAL)),
        (_load_partition, (q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, q_bufs, do_bufs, kv_ready, q_ready,
                           do_ready, q_free, do_free, seqlen_q, seqlen_k, nheads_k, key_blocks, batch_heads_k,
                           heads_per_section, group_size,
                           HEAD_DIM, BLOCK_M, BLOCK_N, NUM_STAGES, CAUSAL, False)),
    ], [4, 1], [CONSUMER_REGISTERS, LOADER_REGISTERS])


# -- the other split: each consumer warpgroup owns a slice of the keys and both of its gradients (FA3's layout) --

SLICE_KEYS = gl.constexpr(64)  # one wgmma row block: a consumer warpgroup's keys
KEY_SLICE_PROGRAM_KEYS = gl.constexpr(2 * SLICE_KEYS.value)  # the key-slice kernel's keys a program


@gluon.jit
def _slice_scores(k_slice, v_slice, q_bufs, do_bufs, q_ready, do_ready, stage, phase, s, dp):
    """Issue S^T = K Q^T and dP^T = V dO^T over the slice's keys for the query block in ``stage``, each once its
    tile has landed (they overwrite the last block's tiles: use_acc=False)."""
    mbarrier.wait(q_ready.index(stage), phase)
    s = warpgroup_mma(k_slice, q_bufs.index(stage).permute((1, 0)), s, use_acc=False, is_async=True)
    mbarrier.wait(do_ready.index(stage), phase)
    dp = warpgroup_mma(v_slice, do_bufs.index(stage).permute((1, 0)), dp, use_acc=False, is_async=True)
    return s, dp


@gluon.jit
def _slice_statistics(head, q_block, batch, nheads, seqlen_q, Lse, Delta, BLOCK_M: gl.constexpr,
                      s_layout: gl.constexpr):
    """Query block ``q_block`` of query head ``head``: its lse (base 2) and delta, loaded a block ahead of their use."""
    rows = q_block * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, s_layout))
    offsets = (batch * nheads + head).to(gl.int64) * seqlen_q + rows
    if q_block * BLOCK_M + BLOCK_M <= seqlen_q:  # a whole block: no masks, whose fill values cost a register move each
        lse_log2 = gl.load(Lse + offsets) * LOG2E
        delta = gl.load(Delta + offsets)
    else:
        lse_log2 = _lse_log2(Lse, offsets, rows, seqlen_q)
        delta = gl.load(Delta + offsets, mask=rows < seqlen_q, other=0.0)
    return lse_log2, delta


@gluon.jit
def _next_query_block(head, q_block, first_q_block, per_head, last_head):
    """The (query head, query block) after this one in a program's walk: counted on, not divided out of the
    iteration, which would cost an integer division a block. Past the last head it stays on the last block."""
    wrap = q_block == first_q_block + per_head - 1
    at_end = wrap & (head == last_head)
    next_block = gl.where(wrap, first_q_block, q_block + 1)
    next_head = gl.where(wrap, head + 1, head)
    return gl.where(at_end, head, next_head), gl.where(at_end, q_block, next_block)


@gluon.jit
def _slice_score_gradients(s, dp, q_block, lse_log2, delta, seqlen_q, seqlen_k, slice_start, qk_scale_log2,
                           dtype: gl.constexpr, BLOCK_M: gl.constexpr, CAUSAL: gl.constexpr,
                           s_layout: gl.constexpr, operand: gl.constexpr):
    """P^T and dS^T = P^T (dP^T - delta) of query block ``q_block``, as 16-bit register operands of dV += P^T dO and
    dK += dS^T Q."""
    if CAUSAL:
        # bottom-right aligned: query i sees keys up to i + seqlen_k - seqlen_q. Only the blocks across the diagonal
        # are masked, on S^T before the exponentials (masking P made ptxas serialize the wgmma)
        first_row = q_block * BLOCK_M
        if slice_start + SLICE_KEYS - 1 > first_row + (seqlen_k - seqlen_q):
            s = gl.where(hidden_queries(slice_start, first_row, seqlen_q, seqlen_k, SLICE_KEYS, BLOCK_M, s_layout),
                         float("-inf"), s)
    p = gl.exp2(s * qk_scale_log2 - lse_log2[None, :])
    ds = p * (dp - delta[None, :])
    return gl.convert_layout(p.to(dtype), operand), gl.convert_layout(ds.to(dtype), operand)


@gluon.jit
def _key_slice_partition(k_smem, v_smem, q_bufs, do_bufs, kv_ready, q_ready, do_ready, stage_free, Lse, Delta,
                         DK, DV, stride_gb, stride_gm, stride_gh, seqlen_q, seqlen_k, nheads, nheads_k, key_blocks,
                         batch_heads_k, heads_per_section, group_size, softmax_scale, qk_scale_log2,
                         HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                         NUM_STAGES: gl.constexpr, CAUSAL: gl.constexpr, SLICE: gl.constexpr):
    """dK and dV of keys [SLICE * 64, SLICE * 64 + 64) of the program's block: all four products of those keys, with no
    hand-over between warpgroups. The two slices share the stages of Q and dO, each releasing a stage once its two
    products that read it have completed.

    Software-pipelined as the dQ kernel is: query block it's S^T and dP^T are issued ahead of block it-1's dV and dK
    products, so the exponentials and dS^T of block it run while those two are in flight, and the tensor cores are
    never left waiting for this warpgroup's next scores. Every program has at least one query block (``_key_tile``:
    each key is seen by the last query rows)."""
    s_layout: gl.constexpr = wgmma_layout(BLOCK_M)
    acc_layout: gl.constexpr = wgmma_layout(HEAD_DIM)
    operand: gl.constexpr = register_operand_layout(HEAD_DIM)
    dtype: gl.constexpr = k_smem.dtype
    batch, head_k, key_start, first_q_block, per_head, iterations = _key_tile(
        seqlen_q, seqlen_k, nheads_k, key_blocks, batch_heads_k, heads_per_section, group_size, BLOCK_M, BLOCK_N,
        CAUSAL)
    slice_start = key_start + SLICE * SLICE_KEYS
    k_slice = k_smem.slice(SLICE * SLICE_KEYS, SLICE_KEYS)
    v_slice = v_smem.slice(SLICE * SLICE_KEYS, SLICE_KEYS)
    # S^T and dP^T overwrite the last block's tiles (use_acc=False): a zero tile held through the loop would cost
    # the registers of a third score tile
    s = gl.zeros([SLICE_KEYS, BLOCK_M], gl.float32, s_layout)
    dp = gl.zeros([SLICE_KEYS, BLOCK_M], gl.float32, s_layout)
    dk = gl.zeros([SLICE_KEYS, HEAD_DIM], gl.float32, acc_layout)
    dv = gl.zeros([SLICE_KEYS, HEAD_DIM], gl.float32, acc_layout)
    mbarrier.wait(kv_ready, 0)
    # -- prologue: block 0's scores and score gradients --
    stage = 0
    phase = 0
    s, dp = _slice_scores(k_slice, v_slice, q_bufs, do_bufs, q_ready, do_ready, stage, phase, s, dp)
    head = head_k * group_size
    last_head = head + group_size - 1
    q_block = first_q_block
    lse_log2, delta = _slice_statistics(head, q_block, batch, nheads, seqlen_q, Lse, Delta, BLOCK_M, s_layout)
    s, dp = warpgroup_mma_wait(num_outstanding=0, deps=(s, dp))
    p_op, ds_op = _slice_score_gradients(s, dp, q_block, lse_log2, delta, seqlen_q, seqlen_k, slice_start,
                                         qk_scale_log2, dtype, BLOCK_M, CAUSAL, s_layout, operand)
    # the next block's statistics load while this block's products run
    head, q_block = _next_query_block(head, q_block, first_q_block, per_head, last_head)
    lse_log2, delta = _slice_statistics(head, q_block, batch, nheads, seqlen_q, Lse, Delta, BLOCK_M, s_layout)
    for _ in range(1, iterations):
        # stage and phase counted on, as the query blocks are
        prev_stage = stage
        stage = gl.where(stage == NUM_STAGES - 1, 0, stage + 1)
        phase = gl.where(stage == 0, phase ^ 1, phase)
        # -- this block's S^T and dP^T, then the last block's dV and dK, in flight together --
        s, dp = _slice_scores(k_slice, v_slice, q_bufs, do_bufs, q_ready, do_ready, stage, phase, s, dp)
        dv = warpgroup_mma(p_op, do_bufs.index(prev_stage), dv, is_async=True)
        dk = warpgroup_mma(ds_op, q_bufs.index(prev_stage), dk, is_async=True)
        s, dp = warpgroup_mma_wait(num_outstanding=2, deps=(s, dp))
        next_p_op, next_ds_op = _slice_score_gradients(s, dp, q_block, lse_log2, delta, seqlen_q, seqlen_k,
                                                       slice_start, qk_scale_log2, dtype, BLOCK_M, CAUSAL, s_layout,
                                                       operand)
        # the next block's statistics (after the last block, the last block's again: never used)
        head, q_block = _next_query_block(head, q_block, first_q_block, per_head, last_head)
        lse_log2, delta = _slice_statistics(head, q_block, batch, nheads, seqlen_q, Lse, Delta, BLOCK_M, s_layout)
        # dV and dK read p_op and ds_op from registers until they complete: keep them alive to here
        dv, dk, p_op, ds_op = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk, p_op, ds_op))
        mbarrier.arrive(stage_free.index(prev_stage), count=1)
        p_op = next_p_op
        ds_op = next_ds_op
    prev_stage = stage
    # -- epilogue: the last block's dV and dK --
    dv = warpgroup_mma(p_op, do_bufs.index(prev_stage), dv, is_async=True)
    dk = warpgroup_mma(ds_op, q_bufs.index(prev_stage), dk, is_async=True)
    dv, dk = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk))
    mbarrier.arrive(stage_free.index(prev_stage), count=1)
    store_key_slice(dk, dv, DK, DV, batch, head_k, slice_start, seqlen_k, stride_gb, stride_gm, stride_gh,
                    softmax_scale, HEAD_DIM, SLICE_KEYS, acc_layout)


# seqlen_q = 1 is not specialized as a constant: Triton 3.6's lowering to LLVM fails an assertion (an LLVM SmallVector
# index) on the whole-block loads of _slice_statistics in that build; the GPU tests' one-query shapes launch it
@gluon.jit(do_not_specialize=["seqlen_q"])
def dkdv_key_slices_kernel(
    q_desc, k_desc, v_desc, do_desc, Lse, Delta, DK, DV,
    stride_gb, stride_gm, stride_gh,
    seqlen_q, seqlen_k, nheads, nheads_k, key_blocks, batch_heads_k, heads_per_section, softmax_scale, qk_scale_log2,
    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, NUM_STAGES: gl.constexpr, CAUSAL: gl.constexpr,
    CONSUMER_REGISTERS: gl.constexpr, LOADER_REGISTERS: gl.constexpr,
):
    """dK and dV of 128 keys a program, 64 on each consumer warpgroup with both of their gradients: for head dims up
    to 128, where a warpgroup holds both 64 x HEAD_DIM fp32 accumulators (128 registers a thread at hdim 128).
    The arguments are ``dkdv_hopper_kernel``'s, with k_desc / v_desc in (1, 128, HEAD_DIM) boxes."""
    BLOCK_N: gl.constexpr = KEY_SLICE_PROGRAM_KEYS
    group_size = nheads // nheads_k
    # each slice reads every stage of Q and dO and releases the two together, so one barrier frees a stage: each
    # arrive costs the warpgroup a bar.sync (the PTX has one before every mbarrier operation of a partition), and
    # Nsight Compute shows the consumers stalled on those (docs/perf-notes.md)
    k_smem, v_smem, q_bufs, do_bufs, kv_ready, q_ready, do_ready, stage_free, _ = _streamed_buffers(
        q_desc, k_desc, v_desc, do_desc, HEAD_DIM, BLOCK_M, BLOCK_N, NUM_STAGES, True)

    gl.warp_specialize([
        (_key_slice_partition, (k_smem, v_smem, q_bufs, do_bufs, kv_ready, q_ready, do_ready, stage_free, Lse,
                                Delta, DK, DV, stride_gb, stride_gm, stride_gh, seqlen_q, seqlen_k, nheads, nheads_k,
                                key_blocks, batch_heads_k, heads_per_section, group_size, softmax_scale,
                                qk_scale_log2, HEAD_DIM, BLOCK_M, BLOCK_N,
                                NUM_STAGES, CAUSAL, 0)),
        (_key_slice_partition, (k_smem, v_smem, q_bufs, do_bufs, kv_ready, q_ready, do_ready, stage_free, Lse,
                                Delta, DK, DV, stride_gb, stride_gm, stride_gh, seqlen_q, seqlen_k, nheads, nheads_k,
                                key_blocks, batch_heads_k, heads_per_section, group_size, softmax_scale,
                                qk_scale_log2, HEAD_DIM, BLOCK_M, BLOCK_N,
                                NUM_STAGES, CAUSAL, 1)),
        (_load_partition, (q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, q_bufs, do_bufs, kv_ready, q_ready,
                           do_ready, stage_free, stage_free, seqlen_q, seqlen_k, nheads_k, key_blocks, batch_heads_k,
                           heads_per_section, group_size,
                           HEAD_DIM, BLOCK_M, BLOCK_N, NUM_STAGES, CAUSAL, True)),
    ], [4, 1], [CONSUMER_REGISTERS, LOADER_REGISTERS])
