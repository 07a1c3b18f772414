"""Hopper FP8 forward in Gluon: the warp-specialized forward of ``forward_hopper.py`` on e4m3 Q, K and V^T.

The structure is the 16-bit kernel's (FlashAttention-3's): a TMA loader warp, two or three consumer warpgroups of 64
query rows, K and V in a ring of ``NUM_STAGES`` stages, a persistent grid that takes its tiles from a counter; the
tile plan, the ring's barriers, the tile hand-off and the stores are that kernel's helpers. What FP8 changes:

- Hopper's FP8 wgmma reads its B operand K-major only. S = Q K^T takes K's (keys, head dim) tile as it is (the head
  dim is the product's K); O += P V takes the (head dim, keys) tile of V^T, which the launcher writes with its keys
  contiguous (``launch.forward_fp8.transposed_v``): the ring's V stages hold V^T tiles, read through their own
  descriptor over (batch * kv heads * head dim, keys) rows.
- The instruction K is 32 for 8-bit operands: the accumulators' layouts are built with it (``fp8_wgmma_layout``),
  and P as the register A operand takes k_width 4 (four consecutive keys a register). P's keys are taken in the
  order the scores' registers hold them, and V^T's in the same order (``_p_operand``), so that the conversion stays
  inside each thread; P is carried between blocks in float32 and rounded just before its product (carried as e4m3
  across the loop, its 64 bytes a thread were repacked for every product: about 200 instructions a block).
- The semantics are the Triton FP8 kernel's (``forward_fp8.py``): S on the raw e4m3 tiles, then the descales (one
  q_descale * k_descale per (batch, kv head) folded into the softmax scale, or with ``PER_BLOCK`` a row vector of q
  descales times the key block's k descale: BLOCK_N divides SCALE_BLOCK); P = exp2(S - max) scaled by P_SCALE and
  rounded to e4m3 for P V, the row sum taking the unrounded P; v_descale in the epilogue, or with ``PER_BLOCK`` per
  key block. Two rewrites that change no value beyond float32 rounding: P_SCALE (a power of two) enters as
  ``P_SCALE_LOG2`` added to the exponent, so the row sum is in units of P_SCALE and the epilogue drops the division;
  and O accumulates in the wgmma across blocks (the 16-bit kernel's chained product, which keeps one accumulator in
  registers), so a per-block v descale cannot multiply each block's product alone. The accumulator is kept instead
  in units of the last block's v descale: before block j's P V joins it, it is multiplied by
  v_descale[j - 1] / v_descale[j] together with the softmax's correction, and the epilogue multiplies by the last
  block's descale.
- The running max is taken over the raw scores times the (positive) row scale: max(s) * scale = max(s * scale) for
  the positive descales the quantizer gives (amax / 448, or 1 for an all-zero block).

Limits, checked by the launcher: dense calls, head dims 64, 128 and 256, causal or no mask, no softcap or window.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from .forward_hopper import (
    LOG2E,
    ROWS_PER_WARPGROUP,
    _consumer_key_blocks,
    _next_tile,
    _publish_tile,
    _tile_plan,
    key_ring,
    masked_scores,
    q_ring,
    read_tile,
    rows_in_sequence,
    store_rows,
    subtracted_max,
)


@gluon.constexpr_function
def fp8_wgmma_layout(columns):
    """A consumer warpgroup's FP8 wgmma result: as ``forward_hopper.wgmma_layout`` (the same registers), with the
    8-bit instruction's K of 32, which the lowering of an e4m3 product requires of its accumulator's layout."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, columns, 32])


@gluon.constexpr_function
def fp8_operand_layout(columns):
    """P in registers as the e4m3 A operand of a wgmma into a ``columns``-wide accumulator: 8-bit operands take
    k_width 4 (the only width the verifier accepts for them)."""
    return gl.DotOperandLayout(operand_index=0, parent=fp8_wgmma_layout(columns), k_width=4)


@gluon.jit
def _p_operand(p, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr):
    """P * P_SCALE (float32, the scores' layout) rounded to e4m3 as P V's register operand, its keys reordered within
    each 32: operand column k holds score column 16 k4 + 8 k1 + 4 k3 + 2 k2 + k0 (k's bits), which is where the
    scores' layout already keeps it, so that the conversion moves no value between threads (straight from the
    scores' order it takes 24 shuffles and 144 byte permutes a 128-key block). The launcher writes V^T's keys in the
    same order (``launch.forward_fp8.permuted_transposed_v``): the product's sum over keys is unchanged."""
    p8 = gl.reshape(p.to(gl.float8e4nv), [ROWS_PER_WARPGROUP, BLOCK_N // 32, 2, 2, 2, 2, 2])
    p8 = gl.reshape(gl.permute(p8, [0, 1, 2, 4, 5, 3, 6]), [ROWS_PER_WARPGROUP, BLOCK_N])
    return gl.convert_layout(p8, fp8_operand_layout(HEAD_DIM))


@gluon.jit
def _load_key_block(k_desc, vt_desc, k_bufs, v_bufs, k_ready, v_ready, k_free, v_free, position, key_row, k_column,
                    vt_row, key, NUM_STAGES: gl.constexpr):
    """K's rows [key_row, + BLOCK_N) at ``k_column`` and V^T's columns [key, + BLOCK_N) of rows [vt_row, + head dim)
    into the ring's stage of key block ``position``, each once the consumers have released that stage's last K or
    V (``forward_hopper.load_key_block`` with V^T's own coordinates)."""
    stage = position % NUM_STAGES
    phase = (position // NUM_STAGES) & 1
    # a fresh barrier passes a wait on the phase before its first: the first round does not wait
    mbarrier.wait(k_free.index(stage), phase ^ 1)
    mbarrier.expect(k_ready.index(stage), k_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [key_row, k_column], k_ready.index(stage), k_bufs.index(stage))
    mbarrier.wait(v_free.index(stage), phase ^ 1)
    mbarrier.expect(v_ready.index(stage), vt_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(vt_desc, [vt_row, key], v_ready.index(stage), v_bufs.index(stage))


@gluon.jit
def _load_partition(q_desc, k_desc, vt_desc, q_smem, k_bufs, v_bufs, q_ready, q_free, k_ready, v_ready, k_free,
                    v_free, tile_slot, TileCounter, seqlen_q, seqlen_k, nheads, group_size, row_tiles, batch_heads,
                    heads_per_section, total_tiles, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr,
                    NUM_STAGES: gl.constexpr, CAUSAL: gl.constexpr, NUM_CONSUMERS: gl.constexpr,
                    DYNAMIC_TILES: gl.constexpr, Q_BUFFERS: gl.constexpr):
    """``forward_hopper._load_partition`` for dense calls, V^T's tiles at (the (batch, kv head)'s head-dim rows,
    the block's keys)."""
    ring = 0  # key blocks loaded so far: the ring's position
    rounds = 0  # tiles handed to the consumers so far
    nheads_k = nheads // group_size
    tile_id = gl.program_id(0)
    while tile_id < total_tiles:
        # taken now, read after this tile's loads are issued: the counter's round trip hides behind them
        next_tile = _next_tile(tile_id, TileCounter, DYNAMIC_TILES)
        _, head, head_k, q_start, k_start, _, _, _, tile_row, _, n_blocks = _tile_plan(
            tile_id, row_tiles, batch_heads, heads_per_section, nheads, group_size, 0, 0, seqlen_q, seqlen_k, 0, 0,
            BLOCK_N, CAUSAL, False, NUM_CONSUMERS)
        vt_row = ((k_start // seqlen_k) * nheads_k + head_k) * HEAD_DIM
        slot = rounds % Q_BUFFERS
        mbarrier.wait(q_free.index(slot), ((rounds // Q_BUFFERS) & 1) ^ 1)
        _publish_tile(tile_slot.index(slot), tile_id)
        mbarrier.expect(q_ready.index(slot), NUM_CONSUMERS * q_desc.block_type.nbytes)
        for c in gl.static_range(NUM_CONSUMERS):
            tma.async_copy_global_to_shared(q_desc, [q_start + tile_row + c * ROWS_PER_WARPGROUP, head * HEAD_DIM],
                                            q_ready.index(slot), q_smem.index(slot * NUM_CONSUMERS + c))
        for j in range(n_blocks):
            _load_key_block(k_desc, vt_desc, k_bufs, v_bufs, k_ready, v_ready, k_free, v_free, ring + j,
                            k_start + j * BLOCK_N, head_k * HEAD_DIM, vt_row, j * BLOCK_N, NUM_STAGES)
        ring += n_blocks
        rounds += 1
        tile_id = next_tile
    # no tile left: the consumers read a number past the last one and stop
    slot = rounds % Q_BUFFERS
    mbarrier.wait(q_free.index(slot), ((rounds // Q_BUFFERS) & 1) ^ 1)
    _publish_tile(tile_slot.index(slot), tile_id)
    mbarrier.arrive(q_ready.index(slot), count=1)


@gluon.jit
def _block_descales(KDescale, VDescale, stride_kds, stride_vds, j, BLOCK_N: gl.constexpr, SCALE_BLOCK: gl.constexpr,
                    PER_BLOCK: gl.constexpr):
    """Key block ``j``'s k and v descales (the block lies in one SCALE_BLOCK); without PER_BLOCK 1 and 1 (the
    per-head descales are folded into the row scale and the epilogue). Issued at the top of a block's step, so that
    their latency hides behind its barrier waits and products."""
    if PER_BLOCK:
        block = (j * BLOCK_N) // SCALE_BLOCK
        return gl.load(KDescale + block * stride_kds), gl.load(VDescale + block * stride_vds)
    else:
        return 1.0, 1.0


@gluon.jit
def _softmax_step(s, row_scale, k_scale, m_i, l_i, j, rows, seqlen_q, seqlen_k, BLOCK_N: gl.constexpr,
                  CAUSAL: gl.constexpr, MASKED: gl.constexpr, P_SCALE_LOG2: gl.constexpr,
                  COLUMN_BOUND: gl.constexpr):
    """Online softmax of one raw score block in base 2, scores scaled by row_scale * k_scale (positive): (new max,
    new sum in units of P_SCALE, P * P_SCALE, the old accumulator's factor). COLUMN_BOUND: as
    ``forward_hopper.visible_keys``."""
    s_layout: gl.constexpr = fp8_wgmma_layout(BLOCK_N)
    scale = row_scale * k_scale
    if MASKED:
        s = masked_scores(s, j, rows, seqlen_q, seqlen_k, BLOCK_N, CAUSAL, s_layout, COLUMN_BOUND)
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * scale)
    m_use = subtracted_max(m_new, MASKED)
    # exp2(x + log2(P_SCALE)) = P * P_SCALE: the scaling costs a row's subtraction, not an element's multiply
    p = gl.exp2(s * scale[:, None] - (m_use - P_SCALE_LOG2)[:, None])
    alpha = gl.exp2(m_i - m_use)
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return m_new, l_i, p, alpha


@gluon.jit
def _scaled_accumulator(acc, alpha, v_unit, v_scale, HEAD_DIM: gl.constexpr, PER_BLOCK: gl.constexpr):
    """The accumulator times the softmax's correction ``alpha`` and, with PER_BLOCK, moved from units of the last
    block's v descale (``v_unit``) to this block's (``v_scale``); returns it and its new unit."""
    o_layout: gl.constexpr = fp8_wgmma_layout(HEAD_DIM)
    if PER_BLOCK:
        alpha = alpha * (v_unit / v_scale)
        v_unit = v_scale
    return acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None], v_unit


@gluon.jit
def _first_block(q, k_bufs, k_ready, k_free, KDescale, VDescale, stride_kds, stride_vds, ring, j, row_scale, m_i,
                 l_i, acc, v_unit, s_zero, rows, seqlen_q, seqlen_k, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                 NUM_STAGES: gl.constexpr, CAUSAL: gl.constexpr, MASKED: gl.constexpr, SCALE_BLOCK: gl.constexpr,
                 PER_BLOCK: gl.constexpr, P_SCALE_LOG2: gl.constexpr, COLUMN_BOUND: gl.constexpr):
    """``forward_hopper._first_block`` on e4m3 tiles: key block ``j``'s scores and softmax, no P V to overlap.
    Returns the ring stage and phase it read, the softmax state, the accumulator and its v unit, and P (e4m3) as
    the next P V's operand."""
    k_scale, v_scale = _block_descales(KDescale, VDescale, stride_kds, stride_vds, j, BLOCK_N, SCALE_BLOCK, PER_BLOCK)
    stage = (ring + j) % NUM_STAGES
    phase = ((ring + j) // NUM_STAGES) & 1
    mbarrier.wait(k_ready.index(stage), phase)
    s = warpgroup_mma(q, k_bufs.index(stage).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
    mbarrier.arrive(k_free.index(stage), count=1)
    m_i, l_i, p, alpha = _softmax_step(s, row_scale, k_scale, m_i, l_i, j, rows, seqlen_q, seqlen_k, BLOCK_N, CAUSAL,
                                       MASKED, P_SCALE_LOG2, COLUMN_BOUND)
    acc, v_unit = _scaled_accumulator(acc, alpha, v_unit, v_scale, HEAD_DIM, PER_BLOCK)
    return stage, phase, m_i, l_i, acc, v_unit, p


@gluon.jit
def _next_block(q, k_bufs, v_bufs, k_ready, v_ready, k_free, v_free, KDescale, VDescale, stride_kds, stride_vds,
                ring, j, stage, phase, row_scale, m_i, l_i, acc, v_unit, p, s_zero, rows, seqlen_q, seqlen_k,
                BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                MASKED: gl.constexpr, SCALE_BLOCK: gl.constexpr, PER_BLOCK: gl.constexpr, P_SCALE_LOG2: gl.constexpr,
                COLUMN_BOUND: gl.constexpr):
    """``forward_hopper._next_block`` on e4m3 tiles: block ``j``'s Q K^T and the block before's P V in flight
    together, then block j's softmax (FA3's intra-warpgroup overlap). Returns as ``_first_block``."""
    k_scale, v_scale = _block_descales(KDescale, VDescale, stride_kds, stride_vds, j, BLOCK_N, SCALE_BLOCK, PER_BLOCK)
    prev_stage = stage
    prev_phase = phase
    stage = (ring + j) % NUM_STAGES
    phase = ((ring + j) // NUM_STAGES) & 1
    mbarrier.wait(k_ready.index(stage), phase)
    mbarrier.wait(v_ready.index(prev_stage), prev_phase)
    s = warpgroup_mma(q, k_bufs.index(stage).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    p_op = _p_operand(p, HEAD_DIM, BLOCK_N)
    acc = warpgroup_mma(p_op, v_bufs.index(prev_stage).permute((1, 0)), acc, is_async=True)
    s = warpgroup_mma_wait(num_outstanding=1, deps=(s, ))
    mbarrier.arrive(k_free.index(stage), count=1)  # K is read by Q K^T alone: the loader may refill it
    m_i, l_i, p, alpha = _softmax_step(s, row_scale, k_scale, m_i, l_i, j, rows, seqlen_q, seqlen_k, BLOCK_N, CAUSAL,
                                       MASKED, P_SCALE_LOG2, COLUMN_BOUND)
    # P V reads p_op from registers until it completes. The 16-bit kernel keeps it alive to here as a dep of the wait;
    # Triton 3.6 lowers no 8-bit dep ("Unexpected bitwidth in WGMMAWaitGroupOp"), and its own tl.dot on an e4m3
    # register operand leaves the operand out of the wait too: ptxas holds an in-flight wgmma's A registers
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    mbarrier.arrive(v_free.index(prev_stage), count=1)
    acc, v_unit = _scaled_accumulator(acc, alpha, v_unit, v_scale, HEAD_DIM, PER_BLOCK)
    return stage, phase, m_i, l_i, acc, v_unit, p


@gluon.jit
def _last_product(v_bufs, v_ready, v_free, stage, phase, acc, p, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr):
    """A run's last P V (V^T in ``stage``), with no Q K^T to overlap."""
    mbarrier.wait(v_ready.index(stage), phase)
    acc = warpgroup_mma(_p_operand(p, HEAD_DIM, BLOCK_N), v_bufs.index(stage).permute((1, 0)), acc, is_async=True)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    mbarrier.arrive(v_free.index(stage), count=1)
    return acc


@gluon.jit
def _tile_key_blocks(q, k_bufs, v_bufs, k_ready, v_ready, k_free, v_free, q_free, KDescale, VDescale, stride_kds,
                     stride_vds, ring, row_scale, m_i, l_i, acc, v_unit, rows, n_full, n_blocks, seqlen_q, seqlen_k,
                     BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                     SCALE_BLOCK: gl.constexpr, PER_BLOCK: gl.constexpr, P_SCALE_LOG2: gl.constexpr,
                     COLUMN_BOUND: gl.constexpr):
    """A tile's key blocks for one consumer's 64 rows as one run (``forward_hopper._tile_key_blocks``, whose notes
    say why one run): [0, n_full) seen whole, then [n_full, n_blocks) through the mask; the first block through the
    mask whether or not it needs it. Q released after the last Q K^T. COLUMN_BOUND: as
    ``forward_hopper.visible_keys``."""
    s_zero = gl.zeros([ROWS_PER_WARPGROUP, BLOCK_N], gl.float32, fp8_wgmma_layout(BLOCK_N))
    if n_blocks > 0:
        stage, phase, m_i, l_i, acc, v_unit, p = _first_block(
            q, k_bufs, k_ready, k_free, KDescale, VDescale, stride_kds, stride_vds, ring, 0, row_scale, m_i, l_i, acc,
            v_unit, s_zero, rows, seqlen_q, seqlen_k, BLOCK_N, HEAD_DIM, NUM_STAGES, CAUSAL, True, SCALE_BLOCK,
            PER_BLOCK, P_SCALE_LOG2, COLUMN_BOUND)
        for j in range(1, n_full):
            stage, phase, m_i, l_i, acc, v_unit, p = _next_block(
                q, k_bufs, v_bufs, k_ready, v_ready, k_free, v_free, KDescale, VDescale, stride_kds, stride_vds, ring,
                j, stage, phase, row_scale, m_i, l_i, acc, v_unit, p, s_zero, rows, seqlen_q, seqlen_k, BLOCK_N,
                HEAD_DIM, NUM_STAGES, CAUSAL, False, SCALE_BLOCK, PER_BLOCK, P_SCALE_LOG2, COLUMN_BOUND)
        for j in range(gl.maximum(n_full, 1), n_blocks):
            stage, phase, m_i, l_i, acc, v_unit, p = _next_block(
                q, k_bufs, v_bufs, k_ready, v_ready, k_free, v_free, KDescale, VDescale, stride_kds, stride_vds, ring,
                j, stage, phase, row_scale, m_i, l_i, acc, v_unit, p, s_zero, rows, seqlen_q, seqlen_k, BLOCK_N,
                HEAD_DIM, NUM_STAGES, CAUSAL, True, SCALE_BLOCK, PER_BLOCK, P_SCALE_LOG2, COLUMN_BOUND)
        mbarrier.arrive(q_free, count=1)
        acc = _last_product(v_bufs, v_ready, v_free, stage, phase, acc, p, HEAD_DIM, BLOCK_N)
    else:
        mbarrier.arrive(q_free, count=1)  # no block at all: Q was never read
    return m_i, l_i, acc, v_unit


@gluon.jit
def _row_scale(QDescale, KDescale, stride_qds, rows, seqlen_q, qk_scale_log2, PER_BLOCK: gl.constexpr,
               SCALE_BLOCK: gl.constexpr, layout: gl.constexpr):
    """The factor of a consumer's raw scores, a row at a time, before the key block's k descale: the softmax scale
    times the row's q descale (PER_BLOCK), or times q_descale * k_descale (one each per (batch, kv head))."""
    if PER_BLOCK:
        # rows outside the sequence (never stored) read descale 1
        q_descale = gl.load(QDescale + (rows // SCALE_BLOCK) * stride_qds, mask=rows_in_sequence(rows, seqlen_q),
                            other=1.0)
        return qk_scale_log2 * q_descale
    else:
        return gl.full([ROWS_PER_WARPGROUP], qk_scale_log2 * gl.load(QDescale) * gl.load(KDescale), gl.float32,
                       layout)


@gluon.jit
def _consumer_partition(q_smem, k_bufs, v_bufs, q_ready, q_free, k_ready, v_ready, k_free, v_free, tile_slot, Out,
                        Lse, QDescale, KDescale, VDescale, stride_om, stride_oh, stride_lb, stride_lh, stride_qds_b,
                        stride_qds_h, stride_qds_blk, stride_kds_b, stride_kds_h, stride_kds_blk, stride_vds_b,
                        stride_vds_h, stride_vds_blk, seqlen_q, seqlen_k, nheads, group_size, row_tiles, batch_heads,
                        heads_per_section, total_tiles, qk_scale_log2, WARP_GROUP: gl.constexpr,
                        HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                        NUM_CONSUMERS: gl.constexpr, WIDE_STORES: gl.constexpr, Q_BUFFERS: gl.constexpr,
                        PER_BLOCK: gl.constexpr, SCALE_BLOCK: gl.constexpr, P_SCALE_LOG2: gl.constexpr):
    s_layout: gl.constexpr = fp8_wgmma_layout(BLOCK_N)
    o_layout: gl.constexpr = fp8_wgmma_layout(HEAD_DIM)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    ring = 0
    rounds = 0  # this program's tiles so far
    mbarrier.wait(q_ready.index(0), 0)
    tile_id = read_tile(tile_slot.index(0))
    while tile_id < total_tiles:
        _, head, head_k, q_start, _, _, _, lse_row, tile_row, n_full, n_blocks = _tile_plan(
            tile_id, row_tiles, batch_heads, heads_per_section, nheads, group_size, 0, 0, seqlen_q, seqlen_k,
            stride_lb, stride_lh, BLOCK_N, CAUSAL, False, NUM_CONSUMERS)
        batch = q_start // seqlen_q
        q_descales = QDescale + batch * stride_qds_b + head_k * stride_qds_h
        k_descales = KDescale + batch * stride_kds_b + head_k * stride_kds_h
        v_descales = VDescale + batch * stride_vds_b + head_k * stride_vds_h
        slot = rounds % Q_BUFFERS
        q = q_smem.index(slot * NUM_CONSUMERS + WARP_GROUP)
        first_row = tile_row + WARP_GROUP * ROWS_PER_WARPGROUP  # within the sequence
        rows = first_row + gl.arange(0, ROWS_PER_WARPGROUP, layout=row_layout)
        row_scale = _row_scale(q_descales, k_descales, stride_qds_blk, rows, seqlen_q, qk_scale_log2, PER_BLOCK,
                               SCALE_BLOCK, row_layout)
        m_i = gl.full([ROWS_PER_WARPGROUP], float("-inf"), gl.float32, row_layout)
        l_i = gl.zeros([ROWS_PER_WARPGROUP], gl.float32, row_layout)
        acc = gl.zeros([ROWS_PER_WARPGROUP, HEAD_DIM], gl.float32, o_layout)
        # the accumulator's v descale: the per-head one throughout, or (PER_BLOCK) the last block's, from block 0's
        v_unit = gl.load(v_descales)
        own_full, own_blocks = _consumer_key_blocks(first_row, seqlen_q, seqlen_k, n_full, n_blocks, BLOCK_N, CAUSAL)
        # -- blocks every row of this consumer sees whole, then the masked ones (diagonal, sequence end) --
        m_i, l_i, acc, v_unit = _tile_key_blocks(
            q, k_bufs, v_bufs, k_ready, v_ready, k_free, v_free, q_free.index(slot), k_descales, v_descales,
            stride_kds_blk, stride_vds_blk, ring, row_scale, m_i, l_i, acc, v_unit, rows, own_full, own_blocks,
            seqlen_q, seqlen_k, BLOCK_N, HEAD_DIM, NUM_STAGES, CAUSAL, SCALE_BLOCK, PER_BLOCK, P_SCALE_LOG2,
            NUM_CONSUMERS == 2)
        # -- the tile's blocks past this consumer's last row: released as they arrive, never read --
        for j in range(own_blocks, n_blocks):
            stage = (ring + j) % NUM_STAGES
            phase = ((ring + j) // NUM_STAGES) & 1
            mbarrier.wait(k_ready.index(stage), phase)  # a release before the block is in would free the last one
            mbarrier.arrive(k_free.index(stage), count=1)
            mbarrier.wait(v_ready.index(stage), phase)
            mbarrier.arrive(v_free.index(stage), count=1)
        ring += n_blocks

        # -- epilogue: normalize (the sum is in units of P_SCALE), v descale; a row that saw no key gives 0 and
        # lse = +inf, as the Triton kernel --
        empty = l_i == 0.0
        l_safe = gl.where(empty, 1.0, l_i)
        acc = acc * gl.convert_layout(v_unit / l_safe, gl.SliceLayout(1, o_layout))[:, None]
        lse = gl.where(empty, float("inf"), (m_i + gl.log2(l_safe) - P_SCALE_LOG2) / LOG2E)
        gl.store(Lse + lse_row + rows, lse, mask=rows_in_sequence(rows, seqlen_q))
        store_rows(Out, acc, q_start, first_row, head * stride_oh, stride_om, seqlen_q, HEAD_DIM, WIDE_STORES)
        rounds += 1
        mbarrier.wait(q_ready.index(rounds % Q_BUFFERS), (rounds // Q_BUFFERS) & 1)
        tile_id = read_tile(tile_slot.index(rounds % Q_BUFFERS))


@gluon.jit
def attention_forward_fp8_hopper_kernel(
    q_desc, k_desc, vt_desc, Out, Lse, QDescale, KDescale, VDescale, TileCounter,
    stride_qds_b, stride_qds_h, stride_qds_blk, stride_kds_b, stride_kds_h, stride_kds_blk,
    stride_vds_b, stride_vds_h, stride_vds_blk, stride_om, stride_oh, stride_lb, stride_lh,
    seqlen_q, seqlen_k, nheads, group_size, row_tiles, batch_heads, heads_per_section, qk_scale_log2,
    HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr, CAUSAL: gl.constexpr,
    NUM_CONSUMERS: gl.constexpr, CONSUMER_REGISTERS: gl.constexpr, LOADER_REGISTERS: gl.constexpr,
    DYNAMIC_TILES: gl.constexpr, WIDE_STORES: gl.constexpr, Q_BUFFERS: gl.constexpr,
    PER_BLOCK: gl.constexpr, SCALE_BLOCK: gl.constexpr, P_SCALE_LOG2: gl.constexpr,
):
    """Dense e4m3 Q (batch * seqlen_q, nheads * HEAD_DIM) and K (batch * seqlen_k, nheads_k * HEAD_DIM) through
    q_desc and k_desc; vt_desc: V^T as (batch * nheads_k * HEAD_DIM, keys) rows, its (HEAD_DIM, BLOCK_N) tiles. Out
    bfloat16 (batch, seqlen_q, nheads, HEAD_DIM); Lse (batch, nheads, seqlen_q). The descales: float32 (batch, kv
    head, block), a block stride of 0 where there is one block. ``qk_scale_log2``: softmax_scale * log2(e), without
    the descales. The tiles, the grid and the other constexprs as ``forward_hopper``'s kernel."""
    gl.static_assert(NUM_CONSUMERS == 2 or NUM_CONSUMERS == 3, "two or three consumer warpgroups")
    gl.static_assert(SCALE_BLOCK % BLOCK_N == 0, "a key block takes one k and one v descale")
    total_tiles = row_tiles * batch_heads
    q_smem, q_ready, q_free, tile_slot = q_ring(q_desc, HEAD_DIM, Q_BUFFERS, NUM_CONSUMERS)
    k_bufs, v_bufs, k_ready, v_ready, k_free, v_free = key_ring(k_desc, vt_desc, HEAD_DIM, BLOCK_N, NUM_STAGES,
                                                                NUM_CONSUMERS)

    # each consumer's partition spelled out: warp_specialize takes a literal list, one entry per partition, and a
    # tuple built beforehand would turn its constexprs into tensors
    if NUM_CONSUMERS == 2:
        gl.warp_specialize([
            (_consumer_partition, (q_smem, k_bufs, v_bufs, q_ready, q_free, k_ready, v_ready, k_free, v_free, tile_slot,
                                   Out, Lse, QDescale, KDescale, VDescale, stride_om, stride_oh, stride_lb, stride_lh,
                                   stride_qds_b, stride_qds_h, stride_qds_blk, stride_kds_b, stride_kds_h,
                                   stride_kds_blk, stride_vds_b, stride_vds_h, stride_vds_blk, seqlen_q, seqlen_k,
                                   nheads, group_size, row_tiles, batch_heads, heads_per_section, total_tiles,
                                   qk_scale_log2, 0, HEAD_DIM, BLOCK_N, NUM_STAGES, CAUSAL, NUM_CONSUMERS, WIDE_STORES,
                                   Q_BUFFERS, PER_BLOCK, SCALE_BLOCK, P_SCALE_LOG2)),
            (_consumer_partition, (q_smem, k_bufs, v_bufs, q_ready, q_free, k_ready, v_ready, k_free, v_free, tile_slot,
                                   Out, Lse, QDescale, KDescale, VDescale, stride_om, stride_oh, stride_lb, stride_lh,
                                   stride_qds_b, stride_qds_h, stride_qds_blk, stride_kds_b, stride_kds_h,
                                   stride_kds_blk, stride_vds_b, stride_vds_h, stride_vds_blk, seqlen_q, seqlen_k,
                                   nheads, group_size, row_tiles, batch_heads, heads_per_section, total_tiles,
                                   qk_scale_log2, 1, HEAD_DIM, BLOCK_N, NUM_STAGES, CAUSAL, NUM_CONSUMERS, WIDE_STORES,
                                   Q_BUFFERS, PER_BLOCK, SCALE_BLOCK, P_SCALE_LOG2)),
            (_load_partition, (q_desc, k_desc, vt_desc, q_smem, k_bufs, v_bufs, q_ready, q_free, k_ready, v_ready,
                               k_free, v_free, tile_slot, TileCounter, seqlen_q, seqlen_k, nheads, group_size,
                               row_tiles, batch_heads, heads_per_section, total_tiles, HEAD_DIM, BLOCK_N, NUM_STAGES,
                               CAUSAL, NUM_CONSUMERS, DYNAMIC_TILES, Q_BUFFERS)),
        ], [4, 1], [CONSUMER_REGISTERS, LOADER_REGISTERS])
    else:
        gl.warp_specialize([
            (_consumer_partition, (q_smem, k_bufs, v_bufs, q_ready, q_free, k_ready, v_ready, k_free, v_free, tile_slot,
                                   Out, Lse, QDescale, KDescale, VDescale, stride_om, stride_oh, stride_lb, stride_lh,
                                   stride_qds_b, stride_qds_h, stride_qds_blk, stride_kds_b, stride_kds_h,
                                   stride_kds_blk, stride_vds_b, stride_vds_h, stride_vds_blk, seqlen_q, seqlen_k,
                                   nheads, group_size, row_tiles, batch_heads, heads_per_section, total_tiles,
                                   qk_scale_log2, 0, HEAD_DIM, BLOCK_N, NUM_STAGES, CAUSAL, NUM_CONSUMERS, WIDE_STORES,
                                   Q_BUFFERS, PER_BLOCK, SCALE_BLOCK, P_SCALE_LOG2)),
            (_consumer_partition, (q_smem, k_bufs, v_bufs, q_ready, q_free, k_ready, v_ready, k_free, v_free, tile_slot,
                                   Out, Lse, QDescale, KDescale, VDescale, stride_om, stride_oh, stride_lb, stride_lh,
                                   stride_qds_b, stride_qds_h, stride_qds_blk, stride_kds_b, stride_kds_h,
                                   stride_kds_blk, stride_vds_b, stride_vds_h, stride_vds_blk, seqlen_q, seqlen_k,
                                   nheads, group_size, row_tiles, batch_heads, heads_per_section, total_tiles,
                                   qk_scale_log2, 1, HEAD_DIM, BLOCK_N, NUM_STAGES, CAUSAL, NUM_CONSUMERS, WIDE_STORES,
                                   Q_BUFFERS, PER_BLOCK, SCALE_BLOCK, P_SCALE_LOG2)),
            (_consumer_partition, (q_smem, k_bufs, v_bufs, q_ready, q_free, k_ready, v_ready, k_free, v_free, tile_slot,
                                   Out, Lse, QDescale, KDescale, VDescale, stride_om, stride_oh, stride_lb, stride_lh,
                                   stride_qds_b, stride_qds_h, stride_qds_blk, stride_kds_b, stride_kds_h,
                                   stride_kds_blk, stride_vds_b, stride_vds_h, stride_vds_blk, seqlen_q, seqlen_k,
                                   nheads, group_size, row_tiles, batch_heads, heads_per_section, total_tiles,
                                   qk_scale_log2, 2, HEAD_DIM, BLOCK_N, NUM_STAGES, CAUSAL, NUM_CONSUMERS, WIDE_STORES,
                                   Q_BUFFERS, PER_BLOCK, SCALE_BLOCK, P_SCALE_LOG2)),
            (_load_partition, (q_desc, k_desc, vt_desc, q_smem, k_bufs, v_bufs, q_ready, q_free, k_ready, v_ready,
                               k_free, v_free, tile_slot, TileCounter, seqlen_q, seqlen_k, nheads, group_size,
                               row_tiles, batch_heads, heads_per_section, total_tiles, HEAD_DIM, BLOCK_N, NUM_STAGES,
                               CAUSAL, NUM_CONSUMERS, DYNAMIC_TILES, Q_BUFFERS)),
        ], [4, 4, 1], [CONSUMER_REGISTERS, CONSUMER_REGISTERS, LOADER_REGISTERS])
