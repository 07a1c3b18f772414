"""Hopper dQ in Gluon: warp-specialized, the forward's structure (``forward_hopper.py``) with three products.

One program computes dQ for 128 query rows of one (sequence, head) (192 with ``NUM_CONSUMERS`` = 3), in
partitions:

- two (or three) consumer warpgroups, 64 rows each. Per key block j a consumer computes S = Q K_j^T and dP = dO V_j^T
  (wgmma, both operands in shared memory), P = exp(S * scale - lse) from the forward's log-sum-exp,
  dS = P (dP - delta), and accumulates dQ += dS K_j with dS from registers. Block j's S and dP are issued
  before block j-1's dS K, so the exponentials and dS of block j run while that product is in flight;
- a loader warp: the tile's Q and dO, then K and V through TMA into a ring of ``NUM_STAGES`` stages. A stage's
  V is released once both consumers' dP has read it, its K once their dS K has: K stays a block longer than V,
  so the ring needs two stages, and three to fetch a K block one block ahead.

The Triton dQ kernel (``backward.py``) software-pipelines the same three products inside one warpgroup's
instruction stream; here the loads wait on no consumer and the two warpgroups' products interleave on the
tensor cores.

The tiles and their order are the forward's (``forward_hopper._tile_plan``): L2 sections of heads, row tiles
fastest inside a section, the longest causal rows first. Query rows outside the sequence read lse = +inf, so their
P (and dS) is 0 whatever the tile holds there; keys past the sequence are masked in the last block, and their K and V
rows read zeros (dense) or are zeroed by the loader (packed), as 0 x NaN would reach dS K and dO V^T. Limits,
checked by the launcher (``launch.backward.hopper_dq_fits``): the forward's, with dO read like Q and a contiguous
lse.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait

from .forward_hopper import (
    ROWS_PER_WARPGROUP,
    _tile_plan,
    copy_rows,
    counts_sequences,
    key_ring,
    load_key_block,
    load_key_block_within,
    register_operand_layout,
    rows_in_sequence,
    store_rows,
    store_rows_through,
    tile_layout_of,
    visible_keys,
    wgmma_layout,
    zeroing_barrier,
)

LOG2E = gl.constexpr(1.4426950408889634)


@gluon.jit
def _load_partition(q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_bufs, v_bufs, rows_ready, k_ready, v_ready,
                    k_free, v_free, landed, CuSeqlensQ, CuSeqlensK, seqlen_q, seqlen_k, nheads, group_size, row_tiles,
                    batch_heads, heads_per_section, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr,
                    NUM_STAGES: gl.constexpr, CAUSAL: gl.constexpr, IS_VARLEN: gl.constexpr,
                    NUM_CONSUMERS: gl.constexpr):
    batch, head, head_k, q_start, k_start, _, tile_seqlen_k, _, tile_row, _, n_blocks = _tile_plan(
        gl.program_id(0), row_tiles, batch_heads, heads_per_section, nheads, group_size, CuSeqlensQ, CuSeqlensK,
        seqlen_q, seqlen_k, 0, 0, BLOCK_N, CAUSAL, IS_VARLEN, NUM_CONSUMERS)
    mbarrier.expect(rows_ready, NUM_CONSUMERS * (q_desc.block_type.nbytes + do_desc.block_type.nbytes))
    for c in gl.static_range(NUM_CONSUMERS):
        row = tile_row + c * ROWS_PER_WARPGROUP
        copy_rows(q_desc, batch, q_start, row, head * HEAD_DIM, rows_ready, q_smem.index(c))
        copy_rows(do_desc, batch, q_start, row, head * HEAD_DIM, rows_ready, do_smem.index(c))
    # blocks inside the sequence, then at most one that runs past its last key: through token descriptors its K
    # and V rows there are zeroed, through sequence descriptors they read zeros
    bounded: gl.constexpr = counts_sequences(k_desc.block_type.shape)
    n_inside = n_blocks if bounded else gl.minimum(n_blocks, tile_seqlen_k // BLOCK_N)
    for j in range(n_inside):
        load_key_block(k_desc, v_desc, k_bufs, v_bufs, k_ready, v_ready, k_free, v_free, j, batch, k_start,
                       j * BLOCK_N, head_k * HEAD_DIM, NUM_STAGES)
    if not bounded and n_blocks > n_inside:
        load_key_block_within(k_desc, v_desc, k_bufs, v_bufs, k_ready, v_ready, k_free, v_free, n_inside,
                              k_start + n_inside * BLOCK_N, head_k * HEAD_DIM,
                              tile_seqlen_k - n_inside * BLOCK_N, landed, 0, NUM_STAGES, True)


@gluon.jit
def _score_gradient(s, dp, lse_log2, delta, rows, j, seqlen_q, seqlen_k, qk_scale_log2, BLOCK_N: gl.constexpr,
                    CAUSAL: gl.constexpr, MASKED: gl.constexpr, s_layout: gl.constexpr):
    """dS = P (dP - delta) of key block j, P recomputed from the log-sum-exp (unscaled: dQ takes the scale once)."""
    p = gl.exp2(s * qk_scale_log2 - lse_log2[:, None])
    if MASKED:
        p = gl.where(visible_keys(j, rows, seqlen_q, seqlen_k, BLOCK_N, CAUSAL, s_layout), p, 0.0)
    return p * (dp - delta[:, None])


@gluon.jit
def _issue_scores(q, do, k_bufs, v_bufs, k_ready, v_ready, j, s_zero, NUM_STAGES: gl.constexpr):
    """Issue key block j's S = Q K^T and dP = dO V^T, each once its tile has landed."""
    stage = j % NUM_STAGES
    phase = (j // NUM_STAGES) & 1
    mbarrier.wait(k_ready.index(stage), phase)
    s = warpgroup_mma(q, k_bufs.index(stage).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    mbarrier.wait(v_ready.index(stage), phase)
    dp = warpgroup_mma(do, v_bufs.index(stage).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    return s, dp


@gluon.jit
def _key_blocks(q, do, k_bufs, v_bufs, k_ready, v_ready, k_free, v_free, dq, rows, lse_log2, delta, lo, hi,
                seqlen_q, seqlen_k, qk_scale_log2, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                NUM_STAGES: gl.constexpr, CAUSAL: gl.constexpr, MASKED: gl.constexpr):
    """Key blocks [lo, hi) into one consumer's dQ accumulator (its 64 rows)."""
    s_layout: gl.constexpr = wgmma_layout(BLOCK_N)
    ds_operand: gl.constexpr = register_operand_layout(HEAD_DIM)
    s_zero = gl.zeros([ROWS_PER_WARPGROUP, BLOCK_N], gl.float32, s_layout)
    if hi > lo:
        # -- prologue: block lo's S, dP and dS --
        stage = lo % NUM_STAGES
        s, dp = _issue_scores(q, do, k_bufs, v_bufs, k_ready, v_ready, lo, s_zero, NUM_STAGES)
        s, dp = warpgroup_mma_wait(num_outstanding=0, deps=(s, dp))
        mbarrier.arrive(v_free.index(stage), count=1)
        ds = _score_gradient(s, dp, lse_log2, delta, rows, lo, seqlen_q, seqlen_k, qk_scale_log2, BLOCK_N, CAUSAL,
                             MASKED, s_layout)
        ds_op = gl.convert_layout(ds.to(q.dtype), ds_operand)
        for j in range(lo + 1, hi):
            prev_stage = stage
            stage = j % NUM_STAGES
            # -- block j's S and dP, then block j-1's dS K, in flight together --
            s, dp = _issue_scores(q, do, k_bufs, v_bufs, k_ready, v_ready, j, s_zero, NUM_STAGES)
            dq = warpgroup_mma(ds_op, k_bufs.index(prev_stage), dq, is_async=True)
            s, dp = warpgroup_mma_wait(num_outstanding=1, deps=(s, dp))
            mbarrier.arrive(v_free.index(stage), count=1)  # V is read by dP alone: the loader may refill it
            ds = _score_gradient(s, dp, lse_log2, delta, rows, j, seqlen_q, seqlen_k, qk_scale_log2, BLOCK_N,
                                 CAUSAL, MASKED, s_layout)
            # dS K reads ds_op from registers until it completes: keep it alive to here
            dq, ds_op = warpgroup_mma_wait(num_outstanding=0, deps=(dq, ds_op))
            mbarrier.arrive(k_free.index(prev_stage), count=1)
            ds_op = gl.convert_layout(ds.to(q.dtype), ds_operand)
        # -- epilogue: the last block's dS K --
        dq = warpgroup_mma(ds_op, k_bufs.index(stage), dq, is_async=True)
        dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq, ))
        mbarrier.arrive(k_free.index(stage), count=1)
    return dq


@gluon.jit
def _consumer_partition(q_smem, do_smem, k_bufs, v_bufs, rows_ready, k_ready, v_ready, k_free, v_free, DQ, Lse,
                        Delta, CuSeqlensQ, CuSeqlensK, stride_dqm, stride_dqh, stride_lb, stride_lh, seqlen_q,
                        seqlen_k, nheads, group_size, row_tiles, batch_heads, heads_per_section, softmax_scale,
                        qk_scale_log2, WARP_GROUP: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr,
                        NUM_STAGES: gl.constexpr, CAUSAL: gl.constexpr, IS_VARLEN: gl.constexpr,
                        NUM_CONSUMERS: gl.constexpr, STORE_THROUGH_Q: gl.constexpr):
    s_layout: gl.constexpr = wgmma_layout(BLOCK_N)
    acc_layout: gl.constexpr = wgmma_layout(HEAD_DIM)
    _, head, _, q_start, _, tile_seqlen_q, tile_seqlen_k, lse_row, tile_row, n_full, n_blocks = _tile_plan(
        gl.program_id(0), row_tiles, batch_heads, heads_per_section, nheads, group_size, CuSeqlensQ, CuSeqlensK,
        seqlen_q, seqlen_k, stride_lb, stride_lh, BLOCK_N, CAUSAL, IS_VARLEN, NUM_CONSUMERS)
    first_row = tile_row + WARP_GROUP * ROWS_PER_WARPGROUP  # within the sequence
    rows = first_row + gl.arange(0, ROWS_PER_WARPGROUP, layout=gl.SliceLayout(1, s_layout))
    in_sequence = rows_in_sequence(rows, tile_seqlen_q)
    # rows outside the sequence (before row 0 in a causal call's short tile, past the end otherwise): lse = +inf
    # gives P = 0 (the tile may hold the neighbouring sequence's rows); delta has lse's layout
    lse_log2 = gl.load(Lse + lse_row + rows, mask=in_sequence, other=float("inf")) * LOG2E
    delta = gl.load(Delta + lse_row + rows, mask=in_sequence, other=0.0)
    dq = gl.zeros([ROWS_PER_WARPGROUP, HEAD_DIM], gl.float32, acc_layout)
    q = q_smem.index(WARP_GROUP)
    do = do_smem.index(WARP_GROUP)
    mbarrier.wait(rows_ready, 0)
    # -- blocks every row of the tile sees whole, then the masked ones (diagonal, sequence end) --
    dq = _key_blocks(q, do, k_bufs, v_bufs, k_ready, v_ready, k_free, v_free, dq, rows, lse_log2, delta, 0, n_full,
                     tile_seqlen_q, tile_seqlen_k, qk_scale_log2, BLOCK_N, HEAD_DIM, NUM_STAGES, CAUSAL, False)
    dq = _key_blocks(q, do, k_bufs, v_bufs, k_ready, v_ready, k_free, v_free, dq, rows, lse_log2, delta, n_full,
                     n_blocks, tile_seqlen_q, tile_seqlen_k, qk_scale_log2, BLOCK_N, HEAD_DIM, NUM_STAGES, CAUSAL,
                     True)
    if STORE_THROUGH_Q:
        # every product has completed: this consumer's Q tile, read by its S products alone, stages dQ
        store_rows_through(DQ, dq * softmax_scale, q, q_start, first_row, head * stride_dqh, stride_dqm, tile_seqlen_q,
                           HEAD_DIM)
    else:
        store_rows(DQ, dq * softmax_scale, q_start, first_row, head * stride_dqh, stride_dqm, tile_seqlen_q, HEAD_DIM,
                   True)


@gluon.jit
def dq_hopper_kernel(
    q_desc, k_desc, v_desc, do_desc, DQ, Lse, Delta, CuSeqlensQ, CuSeqlensK,
    stride_dqm, stride_dqh, stride_lb, stride_lh,
    seqlen_q, seqlen_k, nheads, group_size, row_tiles, batch_heads, heads_per_section, softmax_scale, qk_scale_log2,
    HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr, CAUSAL: gl.constexpr,
    IS_VARLEN: gl.constexpr, NUM_CONSUMERS: gl.constexpr, CONSUMER_REGISTERS: gl.constexpr,
    LOADER_REGISTERS: gl.constexpr, STORE_THROUGH_Q: gl.constexpr,
):
    """dQ of NUM_CONSUMERS x 64 query rows a program (2 or 3 consumer warpgroups): ``row_tiles`` per (sequence,
    head), ``batch_heads`` of those, one program each. The descriptors are the forward's (dense: sequence
    descriptors; varlen: over the tokens): q_desc / do_desc over nheads * HEAD_DIM columns in 64-row blocks, k_desc /
    v_desc over nheads_k * HEAD_DIM columns in BLOCK_N-row blocks. Lse and Delta: (batch, nheads, seqlen_q) dense,
    (nheads, total_q) varlen, last stride 1. DQ: token stride stride_dqm, head stride stride_dqh. dQ is stored 16
    bytes a thread, its layout converted through scratch shared memory (``forward_hopper.store_rows``) or, with
    ``STORE_THROUGH_Q`` (no room for the scratch beside the ring, Q and dO), through each consumer's own Q tile
    (``store_rows_through``)."""
    gl.static_assert(NUM_STAGES >= 2, "K is held until the next block's products are issued: two stages at least")
    gl.static_assert(NUM_CONSUMERS == 2 or NUM_CONSUMERS == 3, "two or three consumer warpgroups")
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [NUM_CONSUMERS, ROWS_PER_WARPGROUP, HEAD_DIM],
                                       tile_layout_of(q_desc.layout))
    do_smem = gl.allocate_shared_memory(do_desc.dtype, [NUM_CONSUMERS, ROWS_PER_WARPGROUP, HEAD_DIM],
                                        tile_layout_of(do_desc.layout))
    # every consumer releases a stage's V after its dP, then its K after its dS K
    k_bufs, v_bufs, k_ready, v_ready, k_free, v_free = key_ring(k_desc, v_desc, HEAD_DIM, BLOCK_N, NUM_STAGES,
                                                                NUM_CONSUMERS)
    rows_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(rows_ready, count=1)
    landed = zeroing_barrier(k_desc)

    # each consumer's partition spelled out: warp_specialize takes a literal list, one entry per partition, and
    # argument tuples built once and joined with + lose their constexprs in Triton 3.6's Gluon
    if NUM_CONSUMERS == 2:
        gl.warp_specialize([
            (_consumer_partition, (q_smem, do_smem, k_bufs, v_bufs, rows_ready, k_ready, v_ready, k_free, v_free, DQ,
                                   Lse, Delta, CuSeqlensQ, CuSeqlensK, stride_dqm, stride_dqh, stride_lb, stride_lh,
                                   seqlen_q, seqlen_k, nheads, group_size, row_tiles, batch_heads, heads_per_section,
                                   softmax_scale, qk_scale_log2, 0, HEAD_DIM, BLOCK_N, NUM_STAGES, CAUSAL, IS_VARLEN,
                                   NUM_CONSUMERS, STORE_THROUGH_Q)),
            (_consumer_partition, (q_smem, do_smem, k_bufs, v_bufs, rows_ready, k_ready, v_ready, k_free, v_free, DQ,
                                   Lse, Delta, CuSeqlensQ, CuSeqlensK, stride_dqm, stride_dqh, stride_lb, stride_lh,
                                   seqlen_q, seqlen_k, nheads, group_size, row_tiles, batch_heads, heads_per_section,
                                   softmax_scale, qk_scale_log2, 1, HEAD_DIM, BLOCK_N, NUM_STAGES, CAUSAL, IS_VARLEN,
                                   NUM_CONSUMERS, STORE_THROUGH_Q)),
            (_load_partition, (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_bufs, v_bufs, rows_ready, k_ready,
                               v_ready, k_free, v_free, landed, CuSeqlensQ, CuSeqlensK, seqlen_q, seqlen_k, nheads,
                               group_size, row_tiles, batch_heads, heads_per_section, HEAD_DIM, BLOCK_N, NUM_STAGES,
                               CAUSAL, IS_VARLEN, NUM_CONSUMERS)),
        ], [4, 1], [CONSUMER_REGISTERS, LOADER_REGISTERS])
    else:
        gl.warp_specialize([
            (_consumer_partition, (q_smem, do_smem, k_bufs, v_bufs, rows_ready, k_ready, v_ready, k_free, v_free, DQ,
                                   Lse, Delta, CuSeqlensQ, CuSeqlensK, stride_dqm, stride_dqh, stride_lb, stride_lh,
                                   seqlen_q, seqlen_k, nheads, group_size, row_tiles, batch_heads, heads_per_section,
                                   softmax_scale, qk_scale_log2, 0, HEAD_DIM, BLOCK_N, NUM_STAGES, CAUSAL, IS_VARLEN,
                                   NUM_CONSUMERS, STORE_THROUGH_Q)),
            (_consumer_partition, (q_smem, do_smem, k_bufs, v_bufs, rows_ready, k_ready, v_ready, k_free, v_free, DQ,
                                   Lse, Delta, CuSeqlensQ, CuSeqlensK, stride_dqm, stride_dqh, stride_lb, stride_lh,
                                   seqlen_q, seqlen_k, nheads, group_size, row_tiles, batch_heads, heads_per_section,
                                   softmax_scale, qk_scale_log2, 1, HEAD_DIM, BLOCK_N, NUM_STAGES, CAUSAL, IS_VARLEN,
                                   NUM_CONSUMERS, STORE_THROUGH_Q)),
            (_consumer_partition, (q_smem, do_smem, k_bufs, v_bufs, rows_ready, k_ready, v_ready, k_free, v_free, DQ,
                                   Lse, Delta, CuSeqlensQ, CuSeqlensK, stride_dqm, stride_dqh, stride_lb, stride_lh,
                                   seqlen_q, seqlen_k, nheads, group_size, row_tiles, batch_heads, heads_per_section,
                                   softmax_scale, qk_scale_log2, 2, HEAD_DIM, BLOCK_N, NUM_STAGES, CAUSAL, IS_VARLEN,
                                   NUM_CONSUMERS, STORE_THROUGH_Q)),
            (_load_partition, (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_bufs, v_bufs, rows_ready, k_ready,
                               v_ready, k_free, v_free, landed, CuSeqlensQ, CuSeqlensK, seqlen_q, seqlen_k, nheads,
                               group_size, row_tiles, batch_heads, heads_per_section, HEAD_DIM, BLOCK_N, NUM_STAGES,
                               CAUSAL, IS_VARLEN, NUM_CONSUMERS)),
        ], [4, 4, 1], [CONSUMER_REGISTERS, CONSUMER_REGISTERS, LOADER_REGISTERS])
