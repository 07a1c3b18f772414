"""Hopper FP8 dQ in Gluon: the FP8 backward's query-block products (``fp8_backward``'s arithmetic) on e4m3 wgmma.

The structure is the 16-bit dQ kernel's (``dq_hopper.py``): one program owns 128 queries of one (batch, query head),
a loader warp brings their Q and dO once and then each 128-key block of the keys they see (K and V, row-major, and
K^T) into a ring of ``NUM_STAGES`` stages, and two consumer warpgroups each take 64 of the queries. Per key block a
consumer computes:

- S = Q K^T and dP = dO V^T with Q and dO from shared memory as A, K and V row-major as B (K-major for a contraction
  over the head dim): e4m3 tiles, or float16 copies of them, the dK/dV kernel's choice of operands
  (``launch.backward_fp8.SCORES_16BIT``: e4m3 wgmma's truncated head-dim sums move P and dS across e4m3 rounding
  boundaries);
- P = exp(S * softmax_scale * q_descale * k_descale - lse) in float32, masked, and
  dS = P (dP * do_descale * v_descale - delta): the dK/dV kernel's expressions, so that both round the same dS;
- dS rounded to e4m3 with one descale per 64 queries x 128 keys of one query head, max(amax / 448, float32's smallest
  normal), as the dK/dV kernel rounds it: the tile is this consumer's 64 rows of the block, so its amax needs no
  exchange between the consumers;
- dQ += (dS K)_tile * (ds_descale * k_descale): the tile's product into a fresh accumulator (use_acc=False), added to
  the float32 dQ in registers. Hopper's e4m3 wgmma sums with about 13 fraction bits, truncated: chained over the
  keys in one accumulator that put gradients 3e-3 to 9e-3 off the float32 sums (docs/fp8.md).

The key blocks every query of the program sees whole run in a loop without the mask's selects, between loops over
the masked ones (a left window's first blocks, the diagonal's and the sequence end's last), as in the 16-bit kernel.

Operands: FP8 wgmma reads its shared-memory B operand K-major, so dS K takes K^T (head dim x keys, keys contiguous),
which the launcher writes (``launch.backward_fp8``) with each 32 keys in the order of dS's register operand
(``forward_fp8_hopper._p_operand``, the FP8 forward's V^T order: dS has P's layout), so that dS goes from the score
layout to the operand layout without moving values between threads. Keys outside the sequence have P = dS = 0 and
K^T's zero padding; query rows outside it read lse = +inf, so that their P is 0 whatever the tile holds there.

Limits, checked by the launcher: dense calls, head dims 64 and 128, no softcap; causal, windows, GQA, block and
per-head descales.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from .backward_fp8_hopper import E4M3_MAX, FLOAT32_TINY, PROGRAM_KEYS, score_layout, seen_keys
from .backward_hopper import LOG2E, _store_rows
from .forward_fp8_hopper import _p_operand, fp8_wgmma_layout
from .forward_hopper import section_tile

ROWS = gl.constexpr(64)  # a consumer warpgroup's queries: one wgmma row block, the rows of a dS descale
PROGRAM_ROWS = gl.constexpr(128)  # a program's queries: two consumers, one q and dO descale block
BLOCK_N = PROGRAM_KEYS  # keys a block: one k and v descale block, the keys of a dS descale


@gluon.jit
def _query_tile(seqlen_q, seqlen_k, nheads, nheads_k, row_tiles, heads_per_section, window_left, window_right,
                WINDOW_LEFT: gl.constexpr, WINDOW_RIGHT: gl.constexpr):
    """This program's batch, query head, kv head, first query, and its key blocks (the first, how many): those with a
    key one of its queries sees (``masks.visible`` over its rows). Every partition derives the same plan. A head's
    last rows come first: under a causal mask they see the most keys, and the short tiles fill the grid's tail. Under
    a causal mask the tiles also run in L2 sections of ``heads_per_section`` (batch, query head) pairs, the row tile
    the slower index (``forward_hopper._tile_plan``'s order), so that no section's longest tiles start as the one
    before ends."""
    tile_id = gl.program_id(0)
    if WINDOW_RIGHT and not WINDOW_LEFT:
        batch_head, row_tile = section_tile(tile_id, row_tiles, gl.num_programs(0) // row_tiles, heads_per_section)
    else:
        batch_head, row_tile = tile_id // row_tiles, tile_id % row_tiles
    q_start = (row_tiles - 1 - row_tile) * PROGRAM_ROWS
    offset = seqlen_k - seqlen_q
    lo = 0
    hi = seqlen_k
    if WINDOW_LEFT:
        lo = gl.maximum(q_start + offset - window_left, 0)
    if WINDOW_RIGHT:
        hi = gl.maximum(gl.minimum(gl.minimum(q_start + PROGRAM_ROWS, seqlen_q) + offset + window_right, seqlen_k),
                        0)
    first_k_block = lo // BLOCK_N
    n_blocks = gl.maximum(gl.cdiv(hi, BLOCK_N) - first_k_block, 0)
    head = batch_head % nheads
    return batch_head // nheads, head, head // (nheads // nheads_k), q_start, first_k_block, n_blocks


@gluon.jit
def _load_partition(q_desc, do_desc, k_desc, v_desc, kt_desc, q_smem, do_smem, k_bufs, v_bufs, kt_bufs, rows_ready,
                    ready, stage_free, seqlen_q, seqlen_k, nheads, nheads_k, row_tiles, heads_per_section, window_left,
                    window_right, HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr, WINDOW_LEFT: gl.constexpr,
                    WINDOW_RIGHT: gl.constexpr):
    """Q and dO of the program's rows once (one 64-row tile a consumer), then each key block's K, V (rows
    [key, + 128) of the kv head's columns) and K^T (the (batch, kv head)'s head-dim rows, the block's columns) into
    the stage of its position, behind one barrier."""
    batch, head, head_k, q_start, first_k_block, n_blocks = _query_tile(
        seqlen_q, seqlen_k, nheads, nheads_k, row_tiles, heads_per_section, window_left, window_right, WINDOW_LEFT,
        WINDOW_RIGHT)
    mbarrier.expect(rows_ready, 2 * (q_desc.block_type.nbytes + do_desc.block_type.nbytes))
    for c in gl.static_range(2):
        row = batch * seqlen_q + q_start + c * ROWS
        tma.async_copy_global_to_shared(q_desc, [row, head * HEAD_DIM], rows_ready, q_smem.index(c))
        tma.async_copy_global_to_shared(do_desc, [row, head * HEAD_DIM], rows_ready, do_smem.index(c))
    t_row = (batch * nheads_k + head_k) * HEAD_DIM
    for j in range(n_blocks):
        key = (first_k_block + j) * BLOCK_N
        stage = j % NUM_STAGES
        # a fresh barrier passes a wait on the phase before its first: the first round does not wait
        mbarrier.wait(stage_free.index(stage), ((j // NUM_STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(stage), k_desc.block_type.nbytes + v_desc.block_type.nbytes
                        + kt_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [batch * seqlen_k + key, head_k * HEAD_DIM], ready.index(stage),
                                        k_bufs.index(stage))
        tma.async_copy_global_to_shared(v_desc, [batch * seqlen_k + key, head_k * HEAD_DIM], ready.index(stage),
                                        v_bufs.index(stage))
        tma.async_copy_global_to_shared(kt_desc, [t_row, key], ready.index(stage), kt_bufs.index(stage))


@gluon.jit
def _full_blocks(seqlen_q, seqlen_k, q_start, first_k_block, n_blocks, window_left, window_right,
                 WINDOW_LEFT: gl.constexpr, WINDOW_RIGHT: gl.constexpr):
    """The key blocks [lo, hi) of the program's that every one of its queries sees whole
    (``masks.block_fully_visible``), a range within its blocks: those run without the mask's selects (a mask column
    index a register, hoisted out of the loop, spilled at hdim 128). Rows past the sequence need no mask: their
    lse = +inf gives P = 0."""
    offset = seqlen_k - seqlen_q
    last = first_k_block + n_blocks
    lo = first_k_block
    hi = gl.minimum(seqlen_k // BLOCK_N, last)
    if WINDOW_LEFT:
        # the last row's first key: key_start >= (its diagonal) - window_left
        lo = gl.maximum(gl.cdiv(gl.maximum(gl.minimum(q_start + PROGRAM_ROWS, seqlen_q) - 1 + offset - window_left, 0),
                                BLOCK_N), lo)
        lo = gl.minimum(lo, last)
    if WINDOW_RIGHT:
        # the first row's last key: key_end - 1 <= its diagonal + window_right
        hi = gl.minimum(gl.maximum(q_start + offset + window_right + 1, 0) // BLOCK_N, hi)
    return lo, gl.maximum(hi, lo)


@gluon.jit
def _key_blocks(q, do, k_bufs, v_bufs, kt_bufs, ready, stage_free, dq, rows, lse_log2, delta, KDescale, VDescale,
                descales, stride_ds_blk, qk_scale, do_descale, lo, hi, first_k_block, seqlen_q, seqlen_k, window_left,
                window_right, HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr, WINDOW_LEFT: gl.constexpr,
                WINDOW_RIGHT: gl.constexpr, MASKED: gl.constexpr):
    """Key blocks [lo, hi) into one consumer's float32 dQ (``MASKED``: with the mask), each block's three products
    one at a time (the other consumer's fill the tensor cores meanwhile)."""
    s_layout: gl.constexpr = score_layout(k_bufs.dtype, BLOCK_N)
    acc_layout: gl.constexpr = fp8_wgmma_layout(HEAD_DIM)
    # S, dP and the tile product overwrite the last block's (use_acc=False), as in the dK/dV kernel
    s = gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout)
    dp = gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout)
    part = gl.zeros([ROWS, HEAD_DIM], gl.float32, acc_layout)
    for key_block in range(lo, hi):
        position = key_block - first_k_block
        stage = position % NUM_STAGES
        mbarrier.wait(ready.index(stage), (position // NUM_STAGES) & 1)
        # -- S = Q K^T and dP = dO V^T over the head dim --
        s = warpgroup_mma(q, k_bufs.index(stage).permute((1, 0)), s, use_acc=False, is_async=True)
        dp = warpgroup_mma(do, v_bufs.index(stage).permute((1, 0)), dp, use_acc=False, is_async=True)
        k_descale = gl.load(KDescale + descales + key_block * stride_ds_blk)
        v_descale = gl.load(VDescale + descales + key_block * stride_ds_blk)
        s, dp = warpgroup_mma_wait(num_outstanding=0, deps=(s, dp))
        # -- P and dS in float32 (a row that sees no key may have lse = -inf: where, not a -inf score) --
        p = gl.exp2(s * (qk_scale * k_descale) - lse_log2[:, None])
        if MASKED:
            seen = seen_keys(rows, key_block * BLOCK_N, seqlen_q, seqlen_k, window_left, window_right, BLOCK_N,
                             WINDOW_LEFT, WINDOW_RIGHT, s_layout)
            p = gl.where(seen, p, 0.0)
        ds = p * (dp * (do_descale * v_descale) - delta[:, None])
        # -- dS in e4m3 by its tile's descale, computed as the dK/dV kernel computes it (an IEEE division, then dS
        # times its reciprocal) --
        amax = gl.max(gl.max(gl.abs(ds), axis=1), axis=0)
        ds_descale = gl.maximum(gl.div_rn(amax, E4M3_MAX), FLOAT32_TINY)
        ds_op = _p_operand(ds * gl.div_rn(1.0, ds_descale), HEAD_DIM, BLOCK_N)
        # -- dQ's tile product on dS in e4m3, K^T's keys in the operand's order --
        part = warpgroup_mma(ds_op, kt_bufs.index(stage).permute((1, 0)), part, use_acc=False, is_async=True)
        part = warpgroup_mma_wait(num_outstanding=0, deps=(part, ))  # at once: e4m3 registers cannot be deps
        mbarrier.arrive(stage_free.index(stage), count=1)
        dq += part * (ds_descale * k_descale)
    return dq


@gluon.jit
def _consumer_partition(q_smem, do_smem, k_bufs, v_bufs, kt_bufs, rows_ready, ready, stage_free, DQ, Lse, Delta,
                        QDescale, KDescale, VDescale, DODescale, stride_gb, stride_gm, stride_gh, stride_ds_b,
                        stride_ds_h, stride_ds_blk, seqlen_q, seqlen_k, nheads, nheads_k, row_tiles, heads_per_section,
                        window_left, window_right, softmax_scale, qk_scale_log2, HEAD_DIM: gl.constexpr,
                        NUM_STAGES: gl.constexpr, WINDOW_LEFT: gl.constexpr, WINDOW_RIGHT: gl.constexpr,
                        CONSUMER: gl.constexpr):
    """dQ of queries [CONSUMER * 64, + 64) of the program's 128: the key blocks its rows see whole between the masked
    ones (a left window's first, the diagonal's and the sequence end's last)."""
    s_layout: gl.constexpr = score_layout(k_bufs.dtype, BLOCK_N)
    acc_layout: gl.constexpr = fp8_wgmma_layout(HEAD_DIM)
    batch, head, head_k, q_start, first_k_block, n_blocks = _query_tile(
        seqlen_q, seqlen_k, nheads, nheads_k, row_tiles, heads_per_section, window_left, window_right, WINDOW_LEFT,
        WINDOW_RIGHT)
    full_lo, full_hi = _full_blocks(seqlen_q, seqlen_k, q_start, first_k_block, n_blocks, window_left, window_right,
                                    WINDOW_LEFT, WINDOW_RIGHT)
    first_row = q_start + CONSUMER * ROWS
    rows = first_row + gl.arange(0, ROWS, layout=gl.SliceLayout(1, s_layout))
    stats = (batch * nheads + head).to(gl.int64) * seqlen_q + rows
    # rows past the sequence: lse = +inf gives P = 0 (the tile may hold the next sequence's rows)
    lse_log2 = gl.load(Lse + stats, mask=rows < seqlen_q, other=float("inf")) * LOG2E
    delta = gl.load(Delta + stats, mask=rows < seqlen_q, other=0.0)
    # the descales of this (batch, kv head): the program's rows lie in one q and dO block (PROGRAM_ROWS =
    # SCALE_BLOCK), a key block in one k and v block (a stride of 0 where there is one descale a head)
    descales = batch * stride_ds_b + head_k * stride_ds_h
    q_descale = gl.load(QDescale + descales + (q_start // PROGRAM_ROWS) * stride_ds_blk)
    do_descale = gl.load(DODescale + descales + (q_start // PROGRAM_ROWS) * stride_ds_blk)
    qk_scale = qk_scale_log2 * q_descale  # times each block's k_descale: the dK/dV kernel's product, in its order
    q = q_smem.index(CONSUMER)
    do = do_smem.index(CONSUMER)
    dq = gl.zeros([ROWS, HEAD_DIM], gl.float32, acc_layout)
    mbarrier.wait(rows_ready, 0)
    if WINDOW_LEFT:
        dq = _key_blocks(q, do, k_bufs, v_bufs, kt_bufs, ready, stage_free, dq, rows, lse_log2, delta, KDescale,
                         VDescale, descales, stride_ds_blk, qk_scale, do_descale, first_k_block, full_lo,
                         first_k_block, seqlen_q, seqlen_k, window_left, window_right, HEAD_DIM, NUM_STAGES,
                         WINDOW_LEFT, WINDOW_RIGHT, True)
    dq = _key_blocks(q, do, k_bufs, v_bufs, kt_bufs, ready, stage_free, dq, rows, lse_log2, delta, KDescale, VDescale,
                     descales, stride_ds_blk, qk_scale, do_descale, full_lo, full_hi, first_k_block, seqlen_q,
                     seqlen_k, window_left, window_right, HEAD_DIM, NUM_STAGES, WINDOW_LEFT, WINDOW_RIGHT, False)
    dq = _key_blocks(q, do, k_bufs, v_bufs, kt_bufs, ready, stage_free, dq, rows, lse_log2, delta, KDescale, VDescale,
                     descales, stride_ds_blk, qk_scale, do_descale, full_hi, first_k_block + n_blocks, first_k_block,
                     seqlen_q, seqlen_k, window_left, window_right, HEAD_DIM, NUM_STAGES, WINDOW_LEFT, WINDOW_RIGHT,
                     True)
    _store_rows(dq * softmax_scale, DQ, batch, head, first_row, seqlen_q, stride_gb, stride_gm, stride_gh, HEAD_DIM,
                ROWS, acc_layout)


# seqlen_q is not specialized as a constant (the 16-bit key-slice kernel's lowering fails for seqlen_q = 1)
@gluon.jit(do_not_specialize=["seqlen_q"])
def dq_fp8_hopper_kernel(
    q_desc, do_desc, k_desc, v_desc, kt_desc, Lse, Delta, DQ, QDescale, KDescale, VDescale, DODescale,
    stride_gb, stride_gm, stride_gh, stride_ds_b, stride_ds_h, stride_ds_blk,
    seqlen_q, seqlen_k, nheads, nheads_k, row_tiles, heads_per_section, window_left, window_right, softmax_scale,
    qk_scale_log2,
    HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr, WINDOW_LEFT: gl.constexpr, WINDOW_RIGHT: gl.constexpr,
    CONSUMER_REGISTERS: gl.constexpr, LOADER_REGISTERS: gl.constexpr,
):
    """dQ of 128 queries a program, ``row_tiles`` programs per (batch, query head).

    q_desc / do_desc: Q and dO (e4m3 or float16 copies) as (batch * seqlen_q, nheads * HEAD_DIM) in (64, HEAD_DIM)
    tiles; k_desc / v_desc: K and V (the same dtype) as (batch * seqlen_k, nheads_k * HEAD_DIM) in (128, HEAD_DIM)
    tiles; kt_desc: e4m3 K^T (batch * nheads_k * HEAD_DIM, padded keys) in (HEAD_DIM, 128) tiles, each 32 keys
    permuted as the register operand orders them. Lse (natural log) and Delta: float32 (batch, nheads, seqlen_q)
    contiguous. DQ: (batch, seqlen_q, nheads, HEAD_DIM) with strides (stride_gb, stride_gm, stride_gh, 1). The
    descales: float32 (batch, nheads_k, blocks), one set of strides for the four. ``qk_scale_log2``: softmax_scale *
    log2(e)."""
    gl.static_assert((HEAD_DIM == 64) | (HEAD_DIM == 128), "the FP8 dQ kernel takes head dims 64 and 128")
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [2, ROWS, HEAD_DIM], q_desc.layout)
    do_smem = gl.allocate_shared_memory(do_desc.dtype, [2, ROWS, HEAD_DIM], do_desc.layout)
    k_bufs = gl.allocate_shared_memory(k_desc.dtype, [NUM_STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_bufs = gl.allocate_shared_memory(v_desc.dtype, [NUM_STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    kt_bufs = gl.allocate_shared_memory(kt_desc.dtype, [NUM_STAGES, HEAD_DIM, BLOCK_N], kt_desc.layout)
    rows_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    stage_free = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(rows_ready, count=1)
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(stage_free.index(i), count=2)  # both consumers read every stage
    gl.warp_specialize([
        (_consumer_partition, (q_smem, do_smem, k_bufs, v_bufs, kt_bufs, rows_ready, ready, stage_free, DQ, Lse,
                               Delta, QDescale, KDescale, VDescale, DODescale, stride_gb, stride_gm, stride_gh,
                               stride_ds_b, stride_ds_h, stride_ds_blk, seqlen_q, seqlen_k, nheads, nheads_k, row_tiles,
                               heads_per_section, window_left, window_right, softmax_scale, qk_scale_log2, HEAD_DIM,
                               NUM_STAGES, WINDOW_LEFT, WINDOW_RIGHT, 0)),
        (_consumer_partition, (q_smem, do_smem, k_bufs, v_bufs, kt_bufs, rows_ready, ready, stage_free, DQ, Lse,
                               Delta, QDescale, KDescale, VDescale, DODescale, stride_gb, stride_gm, stride_gh,
                               stride_ds_b, stride_ds_h, stride_ds_blk, seqlen_q, seqlen_k, nheads, nheads_k, row_tiles,
                               heads_per_section, window_left, window_right, softmax_scale, qk_scale_log2, HEAD_DIM,
                               NUM_STAGES, WINDOW_LEFT, WINDOW_RIGHT, 1)),
        (_load_partition, (q_desc, do_desc, k_desc, v_desc, kt_desc, q_smem, do_smem, k_bufs, v_bufs, kt_bufs,
                           rows_ready, ready, stage_free, seqlen_q, seqlen_k, nheads, nheads_k, row_tiles,
                           heads_per_section, window_left, window_right, HEAD_DIM, NUM_STAGES, WINDOW_LEFT,
                           WINDOW_RIGHT)),
    ], [4, 1], [CONSUMER_REGISTERS, LOADER_REGISTERS])
