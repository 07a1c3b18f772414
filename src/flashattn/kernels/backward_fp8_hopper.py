"""Hopper FP8 dK/dV in Gluon: the FP8 backward's key-block products (``fp8_backward``'s arithmetic) on e4m3 wgmma.

The structure is the 16-bit key-slice kernel's (``backward_hopper.dkdv_key_slices_kernel``): one program owns 128 keys
of one (batch, kv head), a loader warp brings K and V once and then each 64-query block of every query head of the
kv head's group (its tiles, its lse and delta) into a ring of ``NUM_STAGES`` stages, and two consumer warpgroups each
take 64 of the keys with both of their gradients. Per query block, a consumer computes (keys along the rows, swapAB):

- S^T = K Q^T and dP^T = V dO^T with K and V from shared memory as A, Q and dO row-major as B (K-major for a
  contraction over the head dim): e4m3 tiles, or float16 copies of them (the launcher's choice, by the descriptors'
  dtype: float16 wgmma sums in about float32, where e4m3's truncated sums over the head dim move P and dS across
  e4m3 rounding boundaries; ``launch.backward_fp8.SCORES_16BIT``);
- P^T = exp(S^T * softmax_scale * q_descale * k_descale - lse) in float32, masked, and
  dS^T = P^T (dP^T * do_descale * v_descale - delta), as the reference path does;
- P^T * 256 rounded to e4m3 (saturating), and dS^T rounded with one descale per 64 queries x 128 keys of one query
  head: max(amax / 448, float32's smallest normal). The tile's amax spans both consumers' 64-key halves: each
  stores its keys' row maxima into its half of a 128-float shared buffer and arrives on the buffer's barrier
  (count 2), then both wait and reduce the 128 values. Two buffers alternate by query block: a consumer writes
  buffer i % 2 again only after the other has arrived for block i + 1, which it does after reading block i's.
- dV += (P^T dO)_tile * (do_descale / 256) and dK += (dS^T Q)_tile * (ds_descale * q_descale), each tile's product
  into a fresh accumulator (use_acc=False), added to the float32 gradient in registers. Hopper's e4m3 wgmma sums
  with about 13 fraction bits, truncated: chained over thousands of queries in one accumulator that put gradients
  3e-3 to 9e-3 off the float32 sums (docs/fp8.md); a fresh accumulator keeps the truncation within one tile's 64
  queries, and each tile's descales are applied once, in float32.

Operands: FP8 wgmma reads both shared-memory operands K-major, so the products that contract over the queries take
Q^T and dO^T (head dim x queries, queries contiguous), which the launcher writes (``launch.backward_fp8``) with
each 32 queries in the order of the register operand (``forward_fp8_hopper._p_operand``: P^T and dS^T go from the
score layout to the operand layout without moving values between threads). The loader streams four tiles a query
block: Q and dO (row-major, for S^T and dP^T) and Q^T and dO^T.

Limits, checked by the launcher: dense calls, head dims 64 and 128, no softcap; causal, windows, GQA, block and
per-head descales. dQ is the dQ kernel's (``backward_fp8_dq_hopper.py``), which rounds dS as this kernel does.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from .backward_hopper import LOG2E, store_key_slice
from .forward_fp8_hopper import _p_operand, fp8_wgmma_layout
from .forward_hopper import columns_within, section_tile, wgmma_layout

SLICE_KEYS = gl.constexpr(64)  # a consumer warpgroup's keys: one wgmma row block
PROGRAM_KEYS = gl.constexpr(128)  # a program's keys: one k and v descale block, the keys of a dS descale
BLOCK_M = gl.constexpr(64)  # queries a block: the rows of a dS descale
E4M3_MAX = gl.constexpr(448.0)
FLOAT32_TINY = gl.constexpr(1.1754943508222875e-38)  # dS's descale floor (fp8_backward.rounded_tile)


@gluon.constexpr_function
def score_layout(dtype, columns):
    """The scores' and their gradient's accumulator layout (``columns`` wide) for operands of ``dtype``: the wgmma's
    K (32 for e4m3, 16 for 16-bit) tags the layout; the registers are the same."""
    return fp8_wgmma_layout(columns) if dtype.primitive_bitwidth == 8 else wgmma_layout(columns)


@gluon.jit
def _key_tile(seqlen_q, seqlen_k, nheads_k, key_blocks, heads_per_section, window_left, window_right,
              WINDOW_LEFT: gl.constexpr, WINDOW_RIGHT: gl.constexpr):
    """This program's batch, kv head, first key, and its query blocks per query head (the first, how many): those
    with a query that sees one of its keys (``masks.visible_query_range``). Every partition derives the same plan.
    Under a causal mask the tiles are unequal and run in L2 sections of ``heads_per_section`` (batch, kv head)
    pairs, the key block the slower index, every pair's longest first (``backward_hopper.sectioned_key_tile``'s
    order); otherwise a pair's key blocks are consecutive programs."""
    tile_id = gl.program_id(0)
    if WINDOW_RIGHT and not WINDOW_LEFT:
        batch_head_k, key_block = section_tile(tile_id, key_blocks, gl.num_programs(0) // key_blocks,
                                               heads_per_section)
    else:
        batch_head_k, key_block = tile_id // key_blocks, tile_id % key_blocks
    key_start = key_block * PROGRAM_KEYS
    offset = seqlen_k - seqlen_q
    lo = 0
    hi = seqlen_q
    if WINDOW_RIGHT:
        lo = gl.maximum(key_start - offset - window_right, 0)
    if WINDOW_LEFT:
        hi = gl.minimum(gl.minimum(key_start + PROGRAM_KEYS, seqlen_k) - offset + window_left, seqlen_q)
    first_q_block = lo // BLOCK_M
    per_head = gl.maximum(gl.cdiv(hi, BLOCK_M) - first_q_block, 0)
    return batch_head_k // nheads_k, batch_head_k % nheads_k, key_start, first_q_block, per_head


@gluon.jit
def _load_partition(q_desc, do_desc, qt_desc, dot_desc, k_desc, v_desc, k_smem, v_smem, q_bufs, do_bufs, qt_bufs,
                    dot_bufs, stats_bufs, kv_ready, ready, stats_ready, stage_free, Lse, Delta, seqlen_q, seqlen_k,
                    nheads, nheads_k, key_blocks, heads_per_section, window_left, window_right, HEAD_DIM: gl.constexpr,
                    NUM_STAGES: gl.constexpr, WINDOW_LEFT: gl.constexpr, WINDOW_RIGHT: gl.constexpr):
    """K and V once, then each query block's Q, dO (rows [block * 64, + 64) of the head's columns) and Q^T, dO^T
    (the (batch, head)'s head-dim rows, the block's columns) into the stage of its position, behind one barrier, and
    its lse (base 2; +inf past the sequence, so that P = 0 there) and delta into the stage's statistics, behind
    another: loaded by the consumers, they and their addresses beside S^T, dP^T and the two gradients spilled."""
    batch, head_k, key_start, first_q_block, per_head = _key_tile(
        seqlen_q, seqlen_k, nheads_k, key_blocks, heads_per_section, window_left, window_right, WINDOW_LEFT,
        WINDOW_RIGHT)
    mbarrier.expect(kv_ready, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [batch * seqlen_k + key_start, head_k * HEAD_DIM], kv_ready, k_smem)
    tma.async_copy_global_to_shared(v_desc, [batch * seqlen_k + key_start, head_k * HEAD_DIM], kv_ready, v_smem)
    load_query_blocks(q_desc, do_desc, qt_desc, dot_desc, q_bufs, do_bufs, qt_bufs, dot_bufs, stats_bufs, ready,
                      stats_ready, stage_free, Lse, Delta, batch, head_k, first_q_block, per_head, seqlen_q, nheads,
                      nheads_k, HEAD_DIM, NUM_STAGES)


@gluon.jit
def load_query_blocks(q_desc, do_desc, qt_desc, dot_desc, q_bufs, do_bufs, qt_bufs, dot_bufs, stats_bufs, ready,
                      stats_ready, stage_free, Lse, Delta, batch, head_k, first_q_block, per_head, seqlen_q, nheads,
                      nheads_k, HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr):
    """The loader's loop over the program's query blocks (every query head of the kv head's group), shared by the
    dK/dV kernel and the fused dK/dV/dQ kernel (``backward_fp8_fused_hopper``)."""
    rows_layout: gl.constexpr = gl.BlockedLayout([BLOCK_M // 32], [32], [1], [0])
    group_size = nheads // nheads_k
    for it in range(per_head * group_size):
        head = head_k * group_size + it // per_head
        q_block = first_q_block + it % per_head
        stage = it % NUM_STAGES
        phase = (it // NUM_STAGES) & 1
        # a fresh barrier passes a wait on the phase before its first: the first round does not wait
        mbarrier.wait(stage_free.index(stage), phase ^ 1)
        mbarrier.expect(ready.index(stage), 2 * q_desc.block_type.nbytes + 2 * qt_desc.block_type.nbytes)
        row = batch * seqlen_q + q_block * BLOCK_M
        tma.async_copy_global_to_shared(q_desc, [row, head * HEAD_DIM], ready.index(stage), q_bufs.index(stage))
        tma.async_copy_global_to_shared(do_desc, [row, head * HEAD_DIM], ready.index(stage), do_bufs.index(stage))
        t_row = (batch * nheads + head) * HEAD_DIM
        tma.async_copy_global_to_shared(qt_desc, [t_row, q_block * BLOCK_M], ready.index(stage),
                                        qt_bufs.index(stage))
        tma.async_copy_global_to_shared(dot_desc, [t_row, q_block * BLOCK_M], ready.index(stage),
                                        dot_bufs.index(stage))
        rows = q_block * BLOCK_M + gl.arange(0, BLOCK_M, layout=rows_layout)
        stats = (batch * nheads + head).to(gl.int64) * seqlen_q + rows
        stats_bufs.index(2 * stage).store(gl.load(Lse + stats, mask=rows < seqlen_q, other=float("inf")) * LOG2E)
        stats_bufs.index(2 * stage + 1).store(gl.load(Delta + stats, mask=rows < seqlen_q, other=0.0))
        mbarrier.arrive(stats_ready.index(stage), count=1)


@gluon.jit
def seen_pairs(rows, keys, seqlen_q, seqlen_k, window_left, window_right, WINDOW_LEFT: gl.constexpr,
               WINDOW_RIGHT: gl.constexpr):
    """``seen_queries`` as each pair's comparisons (rows and keys broadcast along S^T's two axes): more instructions a
    score, fewer values live across them, which the hdim-128 dK/dV loop's registers need."""
    diagonal = rows + (seqlen_k - seqlen_q)
    seen = (keys < seqlen_k) & (rows < seqlen_q)
    if WINDOW_LEFT:
        seen = seen & (keys >= diagonal - window_left)
    if WINDOW_RIGHT:
        seen = seen & (keys <= diagonal + window_right)
    return seen


@gluon.jit
def seen_queries(keys, first_row, seqlen_q, seqlen_k, window_left, window_right, BLOCK: gl.constexpr,
                 WINDOW_LEFT: gl.constexpr, WINDOW_RIGHT: gl.constexpr, s_layout: gl.constexpr):
    """Whether each of ``keys`` (the rows of an S^T tile in ``s_layout``) is seen by the queries first_row + c of its
    BLOCK columns (``masks.visible``, queries past seqlen_q seeing nothing: a TMA tile may hold the next sequence's
    rows). Bottom-right aligned, query i sees key k when i + seqlen_k - seqlen_q - window_left <= k <= i + seqlen_k -
    seqlen_q + window_right: for each key a range of columns (``forward_hopper.columns_within``)."""
    shift = seqlen_k - seqlen_q + first_row
    cols = gl.arange(0, BLOCK, layout=gl.SliceLayout(0, s_layout))
    if WINDOW_RIGHT:
        # a key past seqlen_k: a first column past the block; the last, one for all keys without a left window
        first = gl.where(keys < seqlen_k, keys - shift - window_right, BLOCK)
        last = seqlen_q - 1 - first_row
        if WINDOW_LEFT:
            last = gl.minimum(keys - shift + window_left, last)
        seen = columns_within(cols, first, last, True, WINDOW_LEFT)
    else:
        # a key past seqlen_k: a last column before the block
        last = gl.full(keys.shape, 0, gl.int32, keys.type.layout) + (seqlen_q - 1 - first_row)
        if WINDOW_LEFT:
            last = gl.minimum(keys - shift + window_left, last)
        seen = columns_within(cols, last, gl.where(keys < seqlen_k, last, -1), False, True)
    return seen


@gluon.jit
def seen_keys(rows, first_key, seqlen_q, seqlen_k, window_left, window_right, BLOCK: gl.constexpr,
              WINDOW_LEFT: gl.constexpr, WINDOW_RIGHT: gl.constexpr, s_layout: gl.constexpr):
    """Whether each of query ``rows`` (the rows of an S tile in ``s_layout``) sees the keys first_key + c of its BLOCK
    columns (``masks.visible``; rows past seqlen_q see nothing): for each row a range of columns, as
    ``seen_queries``."""
    shift = seqlen_k - seqlen_q - first_key
    last = gl.full(rows.shape, 0, gl.int32, rows.type.layout) + (seqlen_k - 1 - first_key)
    if WINDOW_RIGHT:
        last = gl.minimum(last, rows + shift + window_right)
    last = gl.where(rows < seqlen_q, last, -1)
    cols = gl.arange(0, BLOCK, layout=gl.SliceLayout(0, s_layout))
    return columns_within(cols, rows + shift - window_left, last, WINDOW_LEFT, True)


@gluon.jit
def probabilities_and_ds(s, dp, stats_bufs, stage, q_block, keys, q_descale, k_descale, do_descale, v_descale,
                         seqlen_q, seqlen_k, window_left, window_right, qk_scale_log2, WINDOW_LEFT: gl.constexpr,
                         WINDOW_RIGHT: gl.constexpr, COLUMN_RANGES: gl.constexpr):
    """P^T and dS^T in float32 from S^T and dP^T (keys along the rows) and the stage's lse and delta, read as they
    are used. A row that sees no key may have lse = -inf: ``where``, not a -inf score."""
    s_layout: gl.constexpr = s.type.layout
    if COLUMN_RANGES:
        seen = seen_queries(keys, q_block * BLOCK_M, seqlen_q, seqlen_k, window_left, window_right, BLOCK_M,
                            WINDOW_LEFT, WINDOW_RIGHT, s_layout)
    else:
        rows = q_block * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, s_layout))
        seen = seen_pairs(rows[None, :], keys[:, None], seqlen_q, seqlen_k, window_left, window_right, WINDOW_LEFT,
                          WINDOW_RIGHT)
    lse_log2 = stats_bufs.index(2 * stage).load(gl.SliceLayout(0, s_layout))
    p = gl.where(seen, gl.exp2(s * (qk_scale_log2 * q_descale * k_descale) - lse_log2[None, :]), 0.0)
    delta = stats_bufs.index(2 * stage + 1).load(gl.SliceLayout(0, s_layout))
    return p, p * (dp * (do_descale * v_descale) - delta[None, :])


@gluon.jit
def key_slice(k_smem, v_smem, KDescale, VDescale, stride_ds_b, stride_ds_h, stride_ds_blk, seqlen_q, seqlen_k, nheads,
              nheads_k, key_blocks, heads_per_section, window_left, window_right, s_layout: gl.constexpr,
              WINDOW_LEFT: gl.constexpr, WINDOW_RIGHT: gl.constexpr, SLICE: gl.constexpr):
    """A consumer's part of the program: its (batch, kv head) and query blocks (``_key_tile``), the GQA group's size,
    its keys [SLICE * 64, + 64) (first key, K and V slices, their positions along S^T's rows) and the descales: the
    offset of this (batch, kv head)'s, then k's and v's, the key block lying in one k and v block (PROGRAM_KEYS =
    SCALE_BLOCK) as a query block lies in one q and dO block (a stride of 0 where there is one descale a head)."""
    batch, head_k, key_start, first_q_block, per_head = _key_tile(
        seqlen_q, seqlen_k, nheads_k, key_blocks, heads_per_section, window_left, window_right, WINDOW_LEFT,
        WINDOW_RIGHT)
    group_size = nheads // nheads_k
    slice_start = key_start + SLICE * SLICE_KEYS
    k_slice = k_smem.slice(SLICE * SLICE_KEYS, SLICE_KEYS)
    v_slice = v_smem.slice(SLICE * SLICE_KEYS, SLICE_KEYS)
    keys = slice_start + gl.arange(0, SLICE_KEYS, layout=gl.SliceLayout(1, s_layout))
    descales = batch * stride_ds_b + head_k * stride_ds_h
    key_block = key_start // PROGRAM_KEYS
    k_descale = gl.load(KDescale + descales + key_block * stride_ds_blk)
    v_descale = gl.load(VDescale + descales + key_block * stride_ds_blk)
    return (batch, head_k, key_start, first_q_block, per_head, group_size, slice_start, k_slice, v_slice, keys,
            descales, k_descale, v_descale)


@gluon.jit
def block_scores(k_slice, v_slice, q_bufs, do_bufs, stats_bufs, ready, stats_ready, s, dp, it, first_q_block, per_head,
                 keys, descales, k_descale, v_descale, QDescale, DODescale, stride_ds_blk, seqlen_q, seqlen_k,
                 window_left, window_right, qk_scale_log2, NUM_STAGES: gl.constexpr, WINDOW_LEFT: gl.constexpr,
                 WINDOW_RIGHT: gl.constexpr):
    """A consumer's block ``it`` up to its float32 P^T and dS^T: once the loader's stage is in, S^T = K Q^T and
    dP^T = V dO^T over the head dim (into ``s`` and ``dp``, overwritten), the block's q and dO descales, and once its
    lse and delta are in, :func:`probabilities_and_ds`. Returns (q_block, stage, s, dp, p, ds, q_descale,
    do_descale)."""
    q_block = first_q_block + it % per_head
    stage = it % NUM_STAGES
    phase = (it // NUM_STAGES) & 1
    mbarrier.wait(ready.index(stage), phase)
    s = warpgroup_mma(k_slice, q_bufs.index(stage).permute((1, 0)), s, use_acc=False, is_async=True)
    dp = warpgroup_mma(v_slice, do_bufs.index(stage).permute((1, 0)), dp, use_acc=False, is_async=True)
    q_scale_block = (q_block * BLOCK_M) // PROGRAM_KEYS
    q_descale = gl.load(QDescale + descales + q_scale_block * stride_ds_blk)
    do_descale = gl.load(DODescale + descales + q_scale_block * stride_ds_blk)
    mbarrier.wait(stats_ready.index(stage), phase)
    s, dp = warpgroup_mma_wait(num_outstanding=0, deps=(s, dp))
    p, ds = probabilities_and_ds(s, dp, stats_bufs, stage, q_block, keys, q_descale, k_descale, do_descale,
                                 v_descale, seqlen_q, seqlen_k, window_left, window_right, qk_scale_log2,
                                 WINDOW_LEFT, WINDOW_RIGHT, k_slice.shape[1] <= 64)
    return q_block, stage, s, dp, p, ds, q_descale, do_descale


@gluon.jit
def query_block_rings(q_desc, do_desc, qt_desc, dot_desc, HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr):
    """The loader's NUM_STAGES-deep rings of a query block's Q and dO tiles (BLOCK_M, HEAD_DIM) and their transposed
    copies (HEAD_DIM, BLOCK_M), in their descriptors' layouts."""
    q_bufs = gl.allocate_shared_memory(q_desc.dtype, [NUM_STAGES, BLOCK_M, HEAD_DIM], q_desc.layout)
    do_bufs = gl.allocate_shared_memory(do_desc.dtype, [NUM_STAGES, BLOCK_M, HEAD_DIM], do_desc.layout)
    qt_bufs = gl.allocate_shared_memory(qt_desc.dtype, [NUM_STAGES, HEAD_DIM, BLOCK_M], qt_desc.layout)
    dot_bufs = gl.allocate_shared_memory(dot_desc.dtype, [NUM_STAGES, HEAD_DIM, BLOCK_M], dot_desc.layout)
    return q_bufs, do_bufs, qt_bufs, dot_bufs


@gluon.jit
def block_barriers(NUM_STAGES: gl.constexpr):
    """The barriers between the loader and the two consumers, initialized: K and V in (kv_ready); per stage, its
    tiles in (ready), its lse and delta in (stats_ready) and both consumers done with it (stage_free); per dS tile
    (two buffers), both consumers' amax halves in (amax_ready)."""
    kv_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    stats_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    stage_free = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    amax_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_ready, count=1)
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(stats_ready.index(i), count=1)
        mbarrier.init(stage_free.index(i), count=2)  # both consumers read every stage
    for i in gl.static_range(2):
        mbarrier.init(amax_ready.index(i), count=2)  # both consumers' halves of the dS tile
    return kv_ready, ready, stats_ready, stage_free, amax_ready


@gluon.jit
def _share_key_max(ds, amax_bufs, amax_ready, it, SLICE: gl.constexpr):
    """This consumer's 64 keys' maxima of |dS^T| into its half of the amax buffer of block ``it`` (buffer it % 2),
    then its arrive on the buffer's barrier."""
    amax_bufs.index(it % 2).slice(SLICE * SLICE_KEYS, SLICE_KEYS).store(gl.max(gl.abs(ds), axis=1))
    gl.thread_barrier()  # every warp's values are stored before the one thread arrives
    mbarrier.arrive(amax_ready.index(it % 2), count=1)


@gluon.jit
def _tile_amax(amax_bufs, amax_ready, it):
    """The amax of |dS^T| over block ``it``'s 128-key tile, once both consumers' halves are in."""
    flat: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    mbarrier.wait(amax_ready.index(it % 2), (it // 2) & 1)
    return gl.max(amax_bufs.index(it % 2).load(flat), axis=0)


@gluon.jit
def _key_slice_partition(k_smem, v_smem, q_bufs, do_bufs, qt_bufs, dot_bufs, stats_bufs, amax_bufs, kv_ready, ready,
                         stats_ready, stage_free, amax_ready, DK, DV, QDescale, KDescale, VDescale, DODescale,
                         stride_gb, stride_gm, stride_gh, stride_ds_b, stride_ds_h, stride_ds_blk, seqlen_q, seqlen_k,
                         nheads, nheads_k, key_blocks, heads_per_section, window_left, window_right, softmax_scale,
                         qk_scale_log2, HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr, WINDOW_LEFT: gl.constexpr,
                         WINDOW_RIGHT: gl.constexpr, SLICE: gl.constexpr):
    """dK and dV of keys [SLICE * 64, + 64) of the program's 128: every query block's four e4m3 products, one at a
    time (the other consumer's fill the tensor cores meanwhile), the tile products added into float32 dK and dV."""
    s_layout: gl.constexpr = score_layout(k_smem.dtype, BLOCK_M)
    acc_layout: gl.constexpr = fp8_wgmma_layout(HEAD_DIM)
    # at hdim 64 the dV product's accumulator fits beside dS^T while the amax is exchanged; at 128 it spilled
    EARLY_DV: gl.constexpr = HEAD_DIM == 64
    batch, head_k, key_start, first_q_block, per_head, group_size, slice_start, k_slice, v_slice, keys, descales, \
        k_descale, v_descale = key_slice(k_smem, v_smem, KDescale, VDescale, stride_ds_b, stride_ds_h, stride_ds_blk,
                                         seqlen_q, seqlen_k, nheads, nheads_k, key_blocks, heads_per_section,
                                         window_left, window_right, s_layout, WINDOW_LEFT, WINDOW_RIGHT, SLICE)
    # S^T, dP^T and the tile product overwrite the last block's (use_acc=False): zero tiles held through the loop
    # would cost the registers of more tiles
    s = gl.zeros([SLICE_KEYS, BLOCK_M], gl.float32, s_layout)
    dp = gl.zeros([SLICE_KEYS, BLOCK_M], gl.float32, s_layout)
    part = gl.zeros([SLICE_KEYS, HEAD_DIM], gl.float32, acc_layout)
    dk = gl.zeros([SLICE_KEYS, HEAD_DIM], gl.float32, acc_layout)
    dv = gl.zeros([SLICE_KEYS, HEAD_DIM], gl.float32, acc_layout)
    mbarrier.wait(kv_ready, 0)
    for it in range(per_head * group_size):
        q_block, stage, s, dp, p, ds, q_descale, do_descale = block_scores(
            k_slice, v_slice, q_bufs, do_bufs, stats_bufs, ready, stats_ready, s, dp, it, first_q_block, per_head,
            keys, descales, k_descale, v_descale, QDescale, DODescale, stride_ds_blk, seqlen_q, seqlen_k, window_left,
            window_right, qk_scale_log2, NUM_STAGES, WINDOW_LEFT, WINDOW_RIGHT)
        # -- the e4m3 operands: P^T * 256, and dS^T by the tile's descale, whose amax the consumers exchange --
        _share_key_max(ds, amax_bufs, amax_ready, it, SLICE)
        p_op = _p_operand(p * 256.0, HEAD_DIM, BLOCK_M)
        if EARLY_DV:  # dV's tile product in flight while the other consumer's half comes
            part = warpgroup_mma(p_op, dot_bufs.index(stage).permute((1, 0)), part, use_acc=False, is_async=True)
        # the reference path's descale exactly (an IEEE division: ``/`` is div.full, two ulps off); dS times its
        # reciprocal, a float32 ulp from the quotient at most (an IEEE division a value cost 12 instructions, half
        # again the loop's), which moves an e4m3 rounding only within an ulp of a tie
        ds_descale = gl.maximum(gl.div_rn(_tile_amax(amax_bufs, amax_ready, it), E4M3_MAX), FLOAT32_TINY)
        ds_op = _p_operand(ds * gl.div_rn(1.0, ds_descale), HEAD_DIM, BLOCK_M)
        if not EARLY_DV:  # dV's tile product once dS is spent
            part = warpgroup_mma(p_op, dot_bufs.index(stage).permute((1, 0)), part, use_acc=False, is_async=True)
        part = warpgroup_mma_wait(num_outstanding=0, deps=(part, ))
        dv += part * (do_descale * (1.0 / 256.0))  # P_SCALE
        # -- dK's tile product on dS^T in e4m3 --
        part = warpgroup_mma(ds_op, qt_bufs.index(stage).permute((1, 0)), part, use_acc=False, is_async=True)
        part = warpgroup_mma_wait(num_outstanding=0, deps=(part, ))
        mbarrier.arrive(stage_free.index(stage), count=1)
        dk += part * (ds_descale * q_descale)
    store_key_slice(dk, dv, DK, DV, batch, head_k, slice_start, seqlen_k, stride_gb, stride_gm, stride_gh,
                    softmax_scale, HEAD_DIM, SLICE_KEYS, acc_layout)


# seqlen_q is not specialized as a constant (the 16-bit key-slice kernel's lowering fails for seqlen_q = 1)
@gluon.jit(do_not_specialize=["seqlen_q"])
def dkdv_fp8_hopper_kernel(
    q_desc, do_desc, qt_desc, dot_desc, k_desc, v_desc, Lse, Delta, DK, DV, QDescale, KDescale, VDescale, DODescale,
    stride_gb, stride_gm, stride_gh, stride_ds_b, stride_ds_h, stride_ds_blk,
    seqlen_q, seqlen_k, nheads, nheads_k, key_blocks, heads_per_section, window_left, window_right, softmax_scale,
    qk_scale_log2,
    HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr, WINDOW_LEFT: gl.constexpr, WINDOW_RIGHT: gl.constexpr,
    CONSUMER_REGISTERS: gl.constexpr, LOADER_REGISTERS: gl.constexpr,
):
    """dK and dV of 128 keys a program, ``key_blocks`` programs per (batch, kv head).

    q_desc / do_desc: e4m3 Q and dO as (batch * seqlen_q, nheads * HEAD_DIM) in (64, HEAD_DIM) tiles; qt_desc /
    dot_desc: their transposed copies (batch * nheads * HEAD_DIM, padded queries) in (HEAD_DIM, 64) tiles, each 32
    queries permuted as the register operand orders them; k_desc / v_desc: e4m3 (batch * seqlen_k, nheads_k *
    HEAD_DIM) in (128, HEAD_DIM) tiles. Lse (natural log) and Delta: float32 (batch, nheads, seqlen_q) contiguous. DK
    and DV: (batch, seqlen_k, nheads_k, HEAD_DIM) with strides (stride_gb, stride_gm, stride_gh, 1). The descales:
    float32 (batch, nheads_k, blocks), one set of strides for the four (a per-head descale repeated over the blocks).
    ``qk_scale_log2``: softmax_scale * log2(e)."""
    gl.static_assert((HEAD_DIM == 64) | (HEAD_DIM == 128), "the FP8 dK/dV kernel takes head dims 64 and 128")
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [PROGRAM_KEYS, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [PROGRAM_KEYS, HEAD_DIM], v_desc.layout)
    q_bufs, do_bufs, qt_bufs, dot_bufs = query_block_rings(q_desc, do_desc, qt_desc, dot_desc, HEAD_DIM, NUM_STAGES)
    # each stage's lse (row 2 * stage) and delta (row 2 * stage + 1), written by the loader
    stats_bufs = gl.allocate_shared_memory(gl.float32, [2 * NUM_STAGES, BLOCK_M], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    amax_bufs = gl.allocate_shared_memory(gl.float32, [2, PROGRAM_KEYS], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    kv_ready, ready, stats_ready, stage_free, amax_ready = block_barriers(NUM_STAGES)
    gl.warp_specialize([
        (_key_slice_partition, (k_smem, v_smem, q_bufs, do_bufs, qt_bufs, dot_bufs, stats_bufs, amax_bufs, kv_ready,
                                ready, stats_ready, stage_free, amax_ready, DK, DV, QDescale, KDescale, VDescale,
                                DODescale, stride_gb, stride_gm, stride_gh, stride_ds_b, stride_ds_h, stride_ds_blk,
                                seqlen_q, seqlen_k, nheads, nheads_k, key_blocks, heads_per_section, window_left,
                                window_right, softmax_scale, qk_scale_log2, HEAD_DIM, NUM_STAGES, WINDOW_LEFT,
                                WINDOW_RIGHT, 0)),
        (_key_slice_partition, (k_smem, v_smem, q_bufs, do_bufs, qt_bufs, dot_bufs, stats_bufs, amax_bufs, kv_ready,
                                ready, stats_ready, stage_free, amax_ready, DK, DV, QDescale, KDescale, VDescale,
                                DODescale, stride_gb, stride_gm, stride_gh, stride_ds_b, stride_ds_h, stride_ds_blk,
                                seqlen_q, seqlen_k, nheads, nheads_k, key_blocks, heads_per_section, window_left,
                                window_right, softmax_scale, qk_scale_log2, HEAD_DIM, NUM_STAGES, WINDOW_LEFT,
                                WINDOW_RIGHT, 1)),
        (_load_partition, (q_desc, do_desc, qt_desc, dot_desc, k_desc, v_desc, k_smem, v_smem, q_bufs, do_bufs,
                           qt_bufs, dot_bufs, stats_bufs, kv_ready, ready, stats_ready, stage_free, Lse, Delta,
                           seqlen_q, seqlen_k, nheads, nheads_k, key_blocks, heads_per_section, window_left,
                           window_right, HEAD_DIM, NUM_STAGES, WINDOW_LEFT, WINDOW_RIGHT)),
    ], [4, 1], [CONSUMER_REGISTERS, LOADER_REGISTERS])
