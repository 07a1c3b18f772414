"""Hopper dK/dV with dQ in the same pass (five products where the two-pass backward computes seven), in Gluon.

The key-slice kernel of ``backward_hopper.py`` (128 keys a program, 64 on each consumer warpgroup with both of
their gradients) also computes, per query block, dQ^T = K^T dS^T over the program's 128 keys and adds it into a
float32 dQ^T accumulator in global memory by TMA reductions (FlashAttention-3's way): the order of those additions
is unordered, so the launcher takes this form only for ``deterministic=False`` calls (``launch.backward``).
``dq_from_accumulator`` then transposes, scales and rounds it.

Why dQ^T and not dQ = dS K: dQ^T puts the head dim on wgmma's M, so 64 head dims are one row block. Both operands
come from shared memory: K^T is the K tile read transposed, and dS^T (already in registers, 16-bit, as dK's
operand) is stored once a block.

The two consumers share dQ^T as FlashAttention-3's do: each stores its 64 keys' rows of dS^T into one 128-key
buffer, and dQ^T is computed over all 128 keys. At head dim 128 each consumer computes one head-dim half of it
(M = 64) every block. At head dim 64 dQ^T is one row block, and the consumers take it in turns: block i's is
consumer i % 2's, which waits for the other's rows, the other going on to its next block (the turns keep the two
consumers apart, where sharing every block's dQ^T by query halves kept them in step: both on their exponentials
at once, the tensor cores idle; docs/perf-notes.md). From 1k tokens the hdim-64 blocks have 128 rows on the
persistent grid (``backward_fused_dq_persistent.py``): S^T and dP^T of 64 keys x 128 queries and a 64 x 128 dQ^T,
N = 128 products, which read less shared memory per tensor cycle than N = 64 ones, and a turn's reductions cover two
64-query tiles.

The schedule (``_row_block_partition``) takes query blocks one at a time (FlashAttention-3's), the other consumer's
products filling the tensor cores meanwhile (32-row blocks, pipelined as in the plain key-slice kernel, made N = 32
products reading 3 KB of shared memory per 16 tensor cycles: bound by shared memory, and slower than the two
passes). The loader puts each block's lse and delta in shared memory (``_load_with_statistics``): in registers,
beside S^T, dP^T, dK and dV, they spilled.

The result goes from the wgmma registers to a per-consumer shared buffer (64 head-dim rows x BLOCK_M float32, two a
consumer at head dim 128, one at 64) in the registers' order (``_register_order``: 16-byte stores without bank
conflicts), and one thread issues the reductions of its 64 x 64 tiles into the accumulator, which keeps that order:
(batch, nheads, 64-query blocks in whole pairs, HEAD_DIM // 64) tiles of 16 x 256 values, seen as rows of 256
(``dq_from_accumulator`` puts the values back in place).

Limits: the key-slice kernel's (dense 16-bit inputs, causal or no mask), at head dims 64 and 128.
"""

import triton
import triton.language as tl
from triton._C.libtriton import ir
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language import _core
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from .backward_hopper import (
    KEY_SLICE_PROGRAM_KEYS,
    SLICE_KEYS,
    _key_tile,
    _lse_log2,
    _next_query_block,
    _slice_scores,
    _streamed_buffers,
    hidden_queries,
)
from .forward_hopper import copy_rows, register_operand_layout, store_rows_through, wgmma_layout

DQ_ROWS = gl.constexpr(64)  # the dQ^T rows (head dims) of one product: a wgmma row block (M = 64)
DQ_QUERIES = gl.constexpr(64)  # its columns: a query block at head dim 128, half of one at 64
# the accumulator's DQ_QUERIES-query blocks a head come in whole pairs: at head dim 64 a 128-row block's second half
# has its tile even past seqlen_q (it adds zeros there), so every block issues its reductions
DQ_BLOCK_PAIR = gl.constexpr(2)
# a consumer's dQ^T tile (DQ_ROWS x DQ_QUERIES, float32) as the accumulator and the staging buffers keep it:
# DQ_TILE_ROWS x DQ_TILE_COLUMNS values in the order of the warpgroup's registers (``_register_order``)
DQ_TILE_ROWS = gl.constexpr(16)
DQ_TILE_COLUMNS = gl.constexpr(256)


@gluon.jit
def _probabilities(s, q_block, lse_log2, seqlen_q, seqlen_k, slice_start, qk_scale_log2, BLOCK_M: gl.constexpr,
                   CAUSAL: gl.constexpr, VISIBLE: gl.constexpr, s_layout: gl.constexpr):
    """P^T of a query block as ``backward_hopper._slice_score_gradients`` computes it, and with keys past the sequence
    masked: their rows of dK and dV are never stored, but their dS^T would reach dQ. The masks apply to every block
    but the causal ones out of the mask's reach (``VISIBLE``: ``walk_query_blocks`` runs those in a loop of their
    own). A branch around the selects (a block's worth) left two paths' registers live, and the 64-row consumer
    spilled (five stores and 26 loads a block causal, two and 16 without the mask)."""
    first_row = q_block * BLOCK_M
    if CAUSAL:
        if not VISIBLE:
            # bottom-right aligned: query i sees keys up to i + seqlen_k - seqlen_q (so no key past the sequence)
            s = gl.where(hidden_queries(slice_start, first_row, seqlen_q, seqlen_k, SLICE_KEYS, BLOCK_M, s_layout),
                         float("-inf"), s)
    else:
        keys = slice_start + gl.arange(0, SLICE_KEYS, layout=gl.SliceLayout(1, s_layout))
        s = gl.where((keys < seqlen_k)[:, None], s, float("-inf"))
    return gl.exp2(s * qk_scale_log2 - lse_log2[None, :])


@gluon.jit
def _operands(p, dp, delta, dtype: gl.constexpr, operand: gl.constexpr):
    """P^T and dS^T = P^T (dP^T - delta) as 16-bit register operands of dV and dK, and dS^T in the score layout (dQ's,
    through shared memory)."""
    ds = (p * (dp - delta[None, :])).to(dtype)
    return gl.convert_layout(p.to(dtype), operand), gl.convert_layout(ds, operand), ds


@gluon.jit
def _share_ds(ds, ds_buffer, ds_ready, SLICE: gl.constexpr):
    """This consumer's 64 rows of a block's dS^T to the shared 128-key buffer, then its arrive on the buffer's
    barrier (the arrive waits for the warpgroup's stores: Gluon puts a barrier of the partition before it), so that
    the other consumer's dQ^T may read them."""
    ds_buffer.slice(SLICE * SLICE_KEYS, SLICE_KEYS).store(ds)
    fence_async_shared()
    mbarrier.arrive(ds_ready, count=1)


@_core.builtin
def _tma_reduce_add(tensor_desc, coord, src, _semantic=None):
    """``src`` (shared memory, ``tensor_desc``'s layout) added element-wise into the descriptor's tile at ``coord`` by
    one TMA reduction (``cp.reduce.async.bulk.tensor ... .add``), issued by one thread as a TMA store is, and waited
    for as one (``tma.store_wait``). Gluon 3.6 exposes the TMA store but not the reduction, which its builder has:
    this mirrors ``hopper.tma.async_copy_shared_to_global`` with the reduce op."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)


@gluon.jit
def _register_order(dq):
    """A consumer's [DQ_ROWS, 64] dQ^T tile (the wgmma layout) relabeled [DQ_TILE_ROWS, DQ_TILE_COLUMNS] (a
    [DQ_ROWS, 128] one: two such tiles, one after the other) so that
    each thread's values lie in it as its registers hold them. The wgmma layout gives warp w the rows 16 w + 8 r1 +
    lane // 4 and a lane the columns 8 i + 2 (lane % 4) + r0, the four values (r1, r0) of each i in consecutive
    registers: row (i, w // 2) of the relabeled tile holds, for warps 2 (w // 2) and the next, each lane's four
    values side by side in lane order, so that a warp stores 512 contiguous bytes in 16-byte stores, without the
    bank conflicts that the wgmma layout's 8-byte stores into a swizzled [64, 64] tile had (two wavefronts where
    one would do). ``dq_from_accumulator`` reads the order back."""
    TILES: gl.constexpr = dq.shape[1] // DQ_QUERIES  # a [DQ_ROWS, 128] tile: two, one after the other
    # rows (w // 2, w % 2, r1, lane // 4), columns (tile, i, lane % 4, r0)
    t = gl.reshape(dq, [2, 2, 2, 8, TILES, 8, 4, 2])
    t = gl.permute(t, [4, 5, 0, 1, 3, 6, 2, 7])  # (tile, i, w // 2 | w % 2, lane // 4, lane % 4, r1, r0)
    return gl.reshape(t, [TILES * DQ_TILE_ROWS, DQ_TILE_COLUMNS])


@gluon.jit
def _reduce_dq(dq_smem, dq_desc, batch, head, dq_block, seqlen_q, nheads, HEAD_DIM: gl.constexpr,
               FIRST_ROW: gl.constexpr):
    """The reductions of a consumer's staged dQ^T tile (``dq_smem``: DQ_ROWS rows over one or two DQ_QUERIES-query
    blocks from ``dq_block``, in the registers' order) into the accumulator's tiles of (batch, head, those blocks,
    FIRST_ROW // DQ_ROWS), issued by one thread once every warp's stores are fenced and past a barrier (columns past
    seqlen_q add zeros: rows of dS there are 0)."""
    TILES: gl.constexpr = dq_smem.shape[0] // DQ_TILE_ROWS
    q_blocks = DQ_BLOCK_PAIR * gl.cdiv(seqlen_q, DQ_BLOCK_PAIR * DQ_QUERIES)
    tile = ((batch * nheads + head) * q_blocks + dq_block) * (HEAD_DIM // DQ_ROWS) + FIRST_ROW // DQ_ROWS
    for t in gl.static_range(TILES):  # at head dim 64 the next query block's tile is the next one
        _tma_reduce_add(dq_desc, [(tile + t) * DQ_TILE_ROWS, 0], dq_smem.slice(t * DQ_TILE_ROWS, DQ_TILE_ROWS))


@gluon.jit
def _add_dq(dq, dq_smem, dq_desc, batch, head, dq_block, seqlen_q, nheads, HEAD_DIM: gl.constexpr,
            FIRST_ROW: gl.constexpr):
    """This consumer's DQ_ROWS rows of dQ^T (float32, the wgmma layout) staged in ``dq_smem``, whose last
    reductions the caller has waited for, and added into the accumulator at once (``_reduce_dq``)."""
    dq_smem.store(_register_order(dq))
    fence_async_shared()
    gl.thread_barrier()  # every warp's part is in shared memory before the one thread issues the reductions
    _reduce_dq(dq_smem, dq_desc, batch, head, dq_block, seqlen_q, nheads, HEAD_DIM, FIRST_ROW)


@gluon.jit
def _load_with_statistics(q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, q_bufs, do_bufs, stats_bufs, kv_ready,
                          q_ready, do_ready, stats_ready, stage_free, Lse, Delta, seqlen_q, seqlen_k, nheads, nheads_k,
                          key_blocks, batch_heads_k, heads_per_section, group_size, HEAD_DIM: gl.constexpr,
                          BLOCK_M: gl.constexpr,
                          BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr, CAUSAL: gl.constexpr):
    """``backward_hopper._load_partition`` (one barrier frees a stage), and each query block's lse (base 2) and delta
    into its stage's shared memory: in the consumers' registers, a 64-row block's 32 values a thread and their
    addresses spilled beside S^T, dP^T, dK and dV."""
    batch, head_k, key_start, first_q_block, per_head, iterations = _key_tile(
        seqlen_q, seqlen_k, nheads_k, key_blocks, batch_heads_k, heads_per_section, group_size, BLOCK_M, BLOCK_N,
        CAUSAL)
    mbarrier.expect(kv_ready, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    copy_rows(k_desc, batch, batch * seqlen_k, key_start, head_k * HEAD_DIM, kv_ready, k_smem)
    copy_rows(v_desc, batch, batch * seqlen_k, key_start, head_k * HEAD_DIM, kv_ready, v_smem)
    for it in range(iterations):
        load_query_block(q_desc, do_desc, q_bufs, do_bufs, stats_bufs, q_ready, do_ready, stats_ready, stage_free,
                         Lse, Delta, batch, head_k * group_size + it // per_head, first_q_block + it % per_head, it,
                         seqlen_q, nheads, HEAD_DIM, BLOCK_M, NUM_STAGES)


@gluon.jit
def load_query_block(q_desc, do_desc, q_bufs, do_bufs, stats_bufs, q_ready, do_ready, stats_ready, stage_free, Lse,
                     Delta, batch, head, q_block, position, seqlen_q, nheads, HEAD_DIM: gl.constexpr,
                     BLOCK_M: gl.constexpr, NUM_STAGES: gl.constexpr):
    """Query block ``q_block`` of query head ``head``: its Q and dO by TMA, its lse (base 2) and delta by the loader's
    loads, into the ring's stage of ``position`` (the blocks loaded so far), once both consumers have freed it."""
    rows_layout: gl.constexpr = gl.BlockedLayout([BLOCK_M // 32], [32], [1], [0])
    stage = position % NUM_STAGES
    phase = (position // NUM_STAGES) & 1
    # a fresh barrier passes a wait on the phase before its first: the first round does not wait
    mbarrier.wait(stage_free.index(stage), phase ^ 1)
    mbarrier.expect(q_ready.index(stage), q_desc.block_type.nbytes)
    copy_rows(q_desc, batch, batch * seqlen_q, q_block * BLOCK_M, head * HEAD_DIM, q_ready.index(stage),
              q_bufs.index(stage))
    mbarrier.expect(do_ready.index(stage), do_desc.block_type.nbytes)
    copy_rows(do_desc, batch, batch * seqlen_q, q_block * BLOCK_M, head * HEAD_DIM, do_ready.index(stage),
              do_bufs.index(stage))
    rows = q_block * BLOCK_M + gl.arange(0, BLOCK_M, layout=rows_layout)
    offsets = (batch * nheads + head).to(gl.int64) * seqlen_q + rows
    stats_bufs.index(2 * stage).store(_lse_log2(Lse, offsets, rows, seqlen_q))
    stats_bufs.index(2 * stage + 1).store(gl.load(Delta + offsets, mask=rows < seqlen_q, other=0.0))
    mbarrier.arrive(stats_ready.index(stage), count=1)


@gluon.jit
def _visible_from(slice_start, seqlen_q, seqlen_k, BLOCK_M: gl.constexpr):
    """The first query block whose every row sees every key of the slice under the causal mask (bottom-right
    aligned: its first row sees keys up to BLOCK_M x block + seqlen_k - seqlen_q). From it on the mask hides
    nothing: not the keys past seqlen_k either, which no row before seqlen_q sees, and rows past seqlen_q see every
    key in the masked form too."""
    return gl.cdiv(gl.maximum(slice_start + SLICE_KEYS - 1 - (seqlen_k - seqlen_q), 0), BLOCK_M)


@gluon.jit
def _scores_and_gradients(k_slice, v_slice, q_bufs, do_bufs, stats_bufs, q_ready, do_ready, stats_ready, stage, phase,
                          s, dp, q_block, seqlen_q, seqlen_k, slice_start, qk_scale_log2, BLOCK_M: gl.constexpr,
                          CAUSAL: gl.constexpr, s_layout: gl.constexpr, operand: gl.constexpr,
                          VISIBLE: gl.constexpr = False):
    """A query block's S^T and dP^T over the slice's keys (into the last block's tiles), then its P^T and dS^T
    (``_operands``), lse and delta from the stage's shared memory."""
    columns: gl.constexpr = gl.SliceLayout(0, s_layout)
    s, dp = _slice_scores(k_slice, v_slice, q_bufs, do_bufs, q_ready, do_ready, stage, phase, s, dp)
    mbarrier.wait(stats_ready.index(stage), phase)
    s, dp = warpgroup_mma_wait(num_outstanding=0, deps=(s, dp))
    # delta read once P^T is computed and lse spent: both, beside S^T, dP^T, dK and dV, spilled
    p = _probabilities(s, q_block, stats_bufs.index(2 * stage).load(columns), seqlen_q, seqlen_k, slice_start,
                       qk_scale_log2, BLOCK_M, CAUSAL, VISIBLE, s_layout)
    p_op, ds_op, ds = _operands(p, dp, stats_bufs.index(2 * stage + 1).load(columns), k_slice.dtype, operand)
    return s, dp, p_op, ds_op, ds


@gluon.jit
def _halves_block(k_smem, v_smem, q_bufs, do_bufs, stats_bufs, ds_bufs, ds_ready, dq_bufs, q_ready, do_ready,
                  stats_ready, stage_free, dq_desc, s, dp, dq, dk, dv, batch, head, q_block, prev_head, prev_q_block,
                  stage, phase, ring, first_ring, first_q_block, per_head, last_head, seqlen_q, seqlen_k, nheads,
                  slice_start, qk_scale_log2, BLOCK_M: gl.constexpr, NUM_STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                  SLICE: gl.constexpr, VISIBLE: gl.constexpr = False):
    """One query block at head dim 128, the program's ``ring``-th: this consumer's dV and dK, and its head-dim half of
    dQ^T over the 128 keys, staged in its buffer of the ring's parity. The previous block's staged half
    (of ``prev_head``'s ``prev_q_block``, when ``ring > first_ring``) is reduced here, after the fence and the barrier
    that share this block's dS^T: its stores need no fence or barrier of their own (``walk_query_blocks`` reduces
    the walk's last). Returns the tiles, this block's (head, q_block) and the walk's position after the block."""
    HEAD_DIM: gl.constexpr = 2 * DQ_ROWS
    DS_BUFFERS: gl.constexpr = ds_bufs.shape[0]
    s_layout: gl.constexpr = wgmma_layout(BLOCK_M)
    k_half_t = k_smem.slice(SLICE * DQ_ROWS, DQ_ROWS, dim=1).permute((1, 0))
    s, dp, p_op, ds_op, ds = _scores_and_gradients(k_smem.slice(SLICE * SLICE_KEYS, SLICE_KEYS),
                                                   v_smem.slice(SLICE * SLICE_KEYS, SLICE_KEYS), q_bufs, do_bufs,
                                                   stats_bufs, q_ready, do_ready, stats_ready, stage, phase, s, dp,
                                                   q_block, seqlen_q, seqlen_k, slice_start, qk_scale_log2, BLOCK_M,
                                                   CAUSAL, s_layout, register_operand_layout(HEAD_DIM), VISIBLE)
    dv = warpgroup_mma(p_op, do_bufs.index(stage), dv, is_async=True)
    # this block's dQ^T goes to the buffer that the reductions issued in the last block read: the issuing thread
    # waits for them here, and the barrier before _share_ds's arrive holds every other thread until it has
    tma.store_wait(0)
    # its fence and barrier also cover the previous block's dQ^T stores
    _share_ds(ds, ds_bufs.index(ring % DS_BUFFERS), ds_ready.index(ring % DS_BUFFERS), SLICE)
    if ring > first_ring:
        _reduce_dq(dq_bufs.index(2 * SLICE + (ring + 1) % 2), dq_desc, batch, prev_head, prev_q_block, seqlen_q, nheads,
                   HEAD_DIM, SLICE * DQ_ROWS)
    mbarrier.wait(ds_ready.index(ring % DS_BUFFERS), (ring // DS_BUFFERS) & 1)
    dq = warpgroup_mma(k_half_t, ds_bufs.index(ring % DS_BUFFERS), dq, use_acc=False, is_async=True)
    dk = warpgroup_mma(ds_op, q_bufs.index(stage), dk, is_async=True)
    # dV and dQ^T complete; dK runs on while dQ^T goes to its staging buffer
    dv, dq, p_op = warpgroup_mma_wait(num_outstanding=1, deps=(dv, dq, p_op))
    dq_bufs.index(2 * SLICE + ring % 2).store(_register_order(dq))
    dk, ds_op = warpgroup_mma_wait(num_outstanding=0, deps=(dk, ds_op))
    mbarrier.arrive(stage_free.index(stage), count=1)
    head, q_block, prev_head, prev_q_block, stage, phase = _next_halves_block(head, q_block, stage, phase,
                                                                              first_q_block, per_head, last_head,
                                                                              NUM_STAGES)
    return s, dp, dq, dk, dv, head, q_block, prev_head, prev_q_block, stage, phase


@gluon.jit
def _hidden_halves_block(k_smem, ds_bufs, ds_ready, dq_bufs, stage_free, dq_desc, dq, batch, head, q_block, prev_head,
                         prev_q_block, stage, phase, ring, first_ring, first_q_block, per_head, last_head, seqlen_q,
                         nheads, BLOCK_M: gl.constexpr, NUM_STAGES: gl.constexpr, SLICE: gl.constexpr):
    """``_halves_block`` for a query block whose rows see none of this consumer's keys (under the causal mask,
    consumer 1's first block of a head: its 64 keys start past the block's last row). P^T and dS^T are 0, so it adds
    nothing to dV and dK: the consumer shares zero rows of dS^T and computes its head-dim half of dQ^T from the other
    consumer's rows, without S^T, dP^T, their exponentials or the dV and dK products. It reads no Q, dO, lse or delta
    of the stage: the other consumer's waits for them precede its dS^T rows, which this block waits for."""
    HEAD_DIM: gl.constexpr = 2 * DQ_ROWS
    DS_BUFFERS: gl.constexpr = ds_bufs.shape[0]
    s_layout: gl.constexpr = wgmma_layout(BLOCK_M)
    k_half_t = k_smem.slice(SLICE * DQ_ROWS, DQ_ROWS, dim=1).permute((1, 0))
    tma.store_wait(0)
    _share_ds(gl.zeros([SLICE_KEYS, BLOCK_M], k_smem.dtype, s_layout), ds_bufs.index(ring % DS_BUFFERS),
              ds_ready.index(ring % DS_BUFFERS), SLICE)
    if ring > first_ring:
        _reduce_dq(dq_bufs.index(2 * SLICE + (ring + 1) % 2), dq_desc, batch, prev_head, prev_q_block, seqlen_q, nheads,
                   HEAD_DIM, SLICE * DQ_ROWS)
    mbarrier.wait(ds_ready.index(ring % DS_BUFFERS), (ring // DS_BUFFERS) & 1)
    dq = warpgroup_mma(k_half_t, ds_bufs.index(ring % DS_BUFFERS), dq, use_acc=False, is_async=True)
    dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq, ))
    dq_bufs.index(2 * SLICE + ring % 2).store(_register_order(dq))
    mbarrier.arrive(stage_free.index(stage), count=1)
    head, q_block, prev_head, prev_q_block, stage, phase = _next_halves_block(head, q_block, stage, phase,
                                                                              first_q_block, per_head, last_head,
                                                                              NUM_STAGES)
    return dq, head, q_block, prev_head, prev_q_block, stage, phase


@gluon.jit
def _next_halves_block(head, q_block, stage, phase, first_q_block, per_head, last_head, NUM_STAGES: gl.constexpr):
    """The walk's position after a block at head dim 128: the next block's (head, q_block), the block just done's,
    whose staged dQ^T the next block reduces, and the stage ring's position."""
    next_head, next_q_block = _next_query_block(head, q_block, first_q_block, per_head, last_head)
    stage = gl.where(stage == NUM_STAGES - 1, 0, stage + 1)
    phase = gl.where(stage == 0, phase ^ 1, phase)
    return next_head, next_q_block, head, q_block, stage, phase


@gluon.jit
def _turn_block(k_smem, v_smem, q_bufs, do_bufs, stats_bufs, ds_bufs, ds_ready, dq_bufs, q_ready, do_ready,
                stats_ready, stage_free, dq_desc, s, dp, dq, dk, dv, batch, head, q_block, stage, phase, ds_phase,
                first_q_block, per_head, last_head, seqlen_q, seqlen_k, nheads, slice_start, qk_scale_log2,
                BLOCK_M: gl.constexpr, NUM_STAGES: gl.constexpr, CAUSAL: gl.constexpr, SLICE: gl.constexpr,
                BUFFER: gl.constexpr):
    """One query block at head dim 64 (64 or 128 rows), the block of dS^T buffer ``BUFFER`` (the block's parity):
    this consumer's dV and dK, and the block's whole dQ^T over the 128 keys where BUFFER == SLICE (after dV and dK,
    which do not wait for the other consumer's rows of dS^T). Returns the tiles and the walk's position after the
    block."""
    HEAD_DIM: gl.constexpr = DQ_ROWS  # this form's head dim: dQ^T is one row block
    s_layout: gl.constexpr = wgmma_layout(BLOCK_M)
    k_slice = k_smem.slice(SLICE * SLICE_KEYS, SLICE_KEYS)
    v_slice = v_smem.slice(SLICE * SLICE_KEYS, SLICE_KEYS)
    s, dp, p_op, ds_op, ds = _scores_and_gradients(k_slice, v_slice, q_bufs, do_bufs, stats_bufs, q_ready, do_ready,
                                                   stats_ready, stage, phase, s, dp, q_block, seqlen_q, seqlen_k,
                                                   slice_start, qk_scale_log2, BLOCK_M, CAUSAL, s_layout,
                                                   register_operand_layout(HEAD_DIM))
    dv = warpgroup_mma(p_op, do_bufs.index(stage), dv, is_async=True)
    if BUFFER == SLICE:
        # this consumer's dQ^T buffer was last read by the reductions it issued two blocks ago: the issuing thread
        # waits for them here, and the barrier before _share_ds's arrive holds every other thread until it has
        tma.store_wait(0)
    _share_ds(ds, ds_bufs.index(BUFFER), ds_ready.index(BUFFER), SLICE)
    dk = warpgroup_mma(ds_op, q_bufs.index(stage), dk, is_async=True)
    if BUFFER == SLICE:
        mbarrier.wait(ds_ready.index(BUFFER), ds_phase)
        dq = warpgroup_mma(k_smem.permute((1, 0)), ds_bufs.index(BUFFER), dq, use_acc=False, is_async=True)
        # dV and dK complete and the stage is released while dQ^T runs on
        dv, dk, p_op, ds_op = warpgroup_mma_wait(num_outstanding=1, deps=(dv, dk, p_op, ds_op))
        mbarrier.arrive(stage_free.index(stage), count=1)
        dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq, ))
        _add_dq(dq, dq_bufs.index(SLICE), dq_desc, batch, head, q_block * (BLOCK_M // DQ_QUERIES), seqlen_q, nheads,
                HEAD_DIM, 0)
    else:
        dv, dk, p_op, ds_op = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk, p_op, ds_op))
        mbarrier.arrive(stage_free.index(stage), count=1)
    head, q_block = _next_query_block(head, q_block, first_q_block, per_head, last_head)
    stage = gl.where(stage == NUM_STAGES - 1, 0, stage + 1)
    phase = gl.where(stage == 0, phase ^ 1, phase)
    return s, dp, dq, dk, dv, head, q_block, stage, phase


@gluon.jit
def _row_block_partition(k_smem, v_smem, q_bufs, do_bufs, stats_bufs, ds_bufs, ds_ready, dq_bufs, kv_ready, q_ready,
                         do_ready, stats_ready, stage_free, DK, DV, dq_desc, stride_gb, stride_gm, stride_gh, seqlen_q,
                         seqlen_k, nheads, nheads_k, key_blocks, batch_heads_k, heads_per_section, group_size,
                         softmax_scale, qk_scale_log2,
                         HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                         NUM_STAGES: gl.constexpr, CAUSAL: gl.constexpr, SLICE: gl.constexpr):
    """The consumer on query blocks one at a time (``_query_block``): a block's S^T and dP^T, its score gradients,
    then its dV, dK and its share of dQ^T (two blocks' score tiles beside dK and dV would not fit 240 registers). lse
    and delta come from the stage's shared memory (``_load_with_statistics``).

    The dS^T ring: block i's rows go to buffer i % 2, and each consumer's dQ^T of block i waits for the other's rows.
    Before writing block i's, each consumer has waited (in iteration i-1) for the other's arrive of block i-1, which
    the other makes after its iteration i-2 completed the product that read buffer (i-2) % 2: neither consumer runs
    more than a block ahead of the other, and no buffer's barrier takes a block's arrive before the last one's."""
    batch, head_k, key_start, first_q_block, per_head, iterations = _key_tile(
        seqlen_q, seqlen_k, nheads_k, key_blocks, batch_heads_k, heads_per_section, group_size, BLOCK_M, BLOCK_N,
        CAUSAL)
    slice_start = key_start + SLICE * SLICE_KEYS
    mbarrier.wait(kv_ready, 0)
    dk, dv, _, _ = walk_query_blocks(
        k_smem, v_smem, q_bufs, do_bufs, stats_bufs, ds_bufs, ds_ready, dq_bufs, q_ready, do_ready, stats_ready,
        stage_free, dq_desc, batch, head_k * group_size, first_q_block, per_head, iterations, group_size, 0, 0, 0,
        seqlen_q, seqlen_k, nheads, slice_start, qk_scale_log2, HEAD_DIM, BLOCK_M, NUM_STAGES, CAUSAL, SLICE,
        CAUSAL and HEAD_DIM == 2 * DQ_ROWS)
    # every product has completed (each block waits for its own)
    store_gradients(dk, dv, v_smem.slice(SLICE * SLICE_KEYS, SLICE_KEYS), DK, DV, batch, head_k, slice_start, seqlen_k,
                    stride_gb, stride_gm, stride_gh, softmax_scale, HEAD_DIM)
    tma.store_wait(0)  # the shared memory stays the reductions' until they have read it


@gluon.jit
def walk_query_blocks(k_smem, v_smem, q_bufs, do_bufs, stats_bufs, ds_bufs, ds_ready, dq_bufs, q_ready, do_ready,
                      stats_ready, stage_free, dq_desc, batch, first_head, first_q_block, per_head, iterations,
                      group_size, ring, stage, phase, seqlen_q, seqlen_k, nheads, slice_start, qk_scale_log2,
                      HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, NUM_STAGES: gl.constexpr,
                      CAUSAL: gl.constexpr, SLICE: gl.constexpr, UNMASKED_LOOP: gl.constexpr = False):
    """A tile's ``iterations`` query blocks (``per_head`` from ``first_q_block`` in each query head of the group from
    ``first_head``) on this consumer: its dK and dV (returned), its part of each block's dQ^T added into the
    accumulator, and the stage ring's position after the tile (``stage``, ``phase``: before it). ``ring``: the
    program's query blocks before this tile, whose parity picks the dS^T buffer and the staging buffer.

    ``UNMASKED_LOOP`` (causal, head dim 128): each head's blocks from the first whose rows see every key of the
    slice (``_visible_from``) run in a loop of their own, compiled without the mask's compares and selects; a
    run-time branch around the mask inside one loop costs more than the selects it saves. The persistent form keeps
    one loop (a second one spills there), as does head dim 64, whose turns would leave each run a lone block
    (docs/perf-notes.md, "Causal blocks out of the mask's reach"). There consumer 1 also takes the first head's
    first block, which the mask hides from its keys whole, without its own products (``_hidden_halves_block``)."""
    s_layout: gl.constexpr = wgmma_layout(BLOCK_M)
    acc_layout: gl.constexpr = wgmma_layout(HEAD_DIM)
    s = gl.zeros([SLICE_KEYS, BLOCK_M], gl.float32, s_layout)
    dp = gl.zeros([SLICE_KEYS, BLOCK_M], gl.float32, s_layout)
    dq = gl.zeros([DQ_ROWS, BLOCK_M], gl.float32, s_layout)
    dk = gl.zeros([SLICE_KEYS, HEAD_DIM], gl.float32, acc_layout)
    dv = gl.zeros([SLICE_KEYS, HEAD_DIM], gl.float32, acc_layout)
    head = first_head
    last_head = first_head + group_size - 1
    q_block = first_q_block
    # carried through the loops as run-time values, whatever the caller passes (the one-tile kernel: 0)
    stage = gl.to_tensor(stage)
    phase = gl.to_tensor(phase)
    if HEAD_DIM == 2 * DQ_ROWS:
        first_ring = gl.to_tensor(ring)
        ring = gl.to_tensor(ring)
        prev_head = head
        prev_q_block = q_block
        if UNMASKED_LOOP:
            masked = gl.minimum(_visible_from(slice_start, seqlen_q, seqlen_k, BLOCK_M) - first_q_block, per_head)
            skipped = 0
            if SLICE == 1:  # noqa: SIM102 - the consumer (constexpr) around the tile's test (run time)
                # bottom-right aligned, the first head's first block's last row sees keys up to (first_q_block + 1)
                # * BLOCK_M - 1 + seqlen_k - seqlen_q. Only the first head's (a branch in the heads' loop spilled)
                if (per_head > 0) & ((first_q_block + 1) * BLOCK_M + seqlen_k - seqlen_q <= slice_start):
                    dq, head, q_block, prev_head, prev_q_block, stage, phase = _hidden_halves_block(
                        k_smem, ds_bufs, ds_ready, dq_bufs, stage_free, dq_desc, dq, batch, head, q_block, prev_head,
                        prev_q_block, stage, phase, ring, first_ring, first_q_block, per_head, last_head, seqlen_q,
                        nheads, BLOCK_M, NUM_STAGES, SLICE)
                    ring += 1
                    skipped = 1
            for _ in range(group_size):
                for _ in range(masked - skipped):
                    s, dp, dq, dk, dv, head, q_block, prev_head, prev_q_block, stage, phase = _halves_block(
                        k_smem, v_smem, q_bufs, do_bufs, stats_bufs, ds_bufs, ds_ready, dq_bufs, q_ready, do_ready,
                        stats_ready, stage_free, dq_desc, s, dp, dq, dk, dv, batch, head, q_block, prev_head,
                        prev_q_block, stage, phase, ring, first_ring, first_q_block, per_head, last_head, seqlen_q,
                        seqlen_k, nheads, slice_start, qk_scale_log2, BLOCK_M, NUM_STAGES, CAUSAL, SLICE)
                    ring += 1
                for _ in range(per_head - masked):
                    s, dp, dq, dk, dv, head, q_block, prev_head, prev_q_block, stage, phase = _halves_block(
                        k_smem, v_smem, q_bufs, do_bufs, stats_bufs, ds_bufs, ds_ready, dq_bufs, q_ready, do_ready,
                        stats_ready, stage_free, dq_desc, s, dp, dq, dk, dv, batch, head, q_block, prev_head,
                        prev_q_block, stage, phase, ring, first_ring, first_q_block, per_head, last_head, seqlen_q,
                        seqlen_k, nheads, slice_start, qk_scale_log2, BLOCK_M, NUM_STAGES, CAUSAL, SLICE, True)
                    ring += 1
                skipped = 0
        else:
            for _ in range(iterations):
                s, dp, dq, dk, dv, head, q_block, prev_head, prev_q_block, stage, phase = _halves_block(
                    k_smem, v_smem, q_bufs, do_bufs, stats_bufs, ds_bufs, ds_ready, dq_bufs, q_ready, do_ready,
                    stats_ready, stage_free, dq_desc, s, dp, dq, dk, dv, batch, head, q_block, prev_head, prev_q_block,
                    stage, phase, ring, first_ring, first_q_block, per_head, last_head, seqlen_q, seqlen_k, nheads,
                    slice_start, qk_scale_log2, BLOCK_M, NUM_STAGES, CAUSAL, SLICE)
                ring += 1
        # the walk's last staged dQ^T, which no next block's fence and barrier cover
        fence_async_shared()
        gl.thread_barrier()
        if ring > first_ring:
            _reduce_dq(dq_bufs.index(2 * SLICE + (ring + 1) % 2), dq_desc, batch, prev_head, prev_q_block, seqlen_q,
                       nheads, HEAD_DIM, SLICE * DQ_ROWS)
    else:
        # two blocks a round, so that each consumer's part in each is fixed at compile time (Gluon takes no wgmma
        # accumulator into a run-time branch); an odd last block is consumer 0's, and after it (a persistent
        # program's next tile) an odd first block consumer 1's
        ds_phase = gl.to_tensor((ring // 2) & 1)
        rest = iterations
        # the one-tile kernel passes ring = 0, a constant: there this branch is not built
        if ring % 2 == 1:
            s, dp, dq, dk, dv, head, q_block, stage, phase = _turn_block(
                k_smem, v_smem, q_bufs, do_bufs, stats_bufs, ds_bufs, ds_ready, dq_bufs, q_ready, do_ready,
                stats_ready, stage_free, dq_desc, s, dp, dq, dk, dv, batch, head, q_block, stage, phase,
                ds_phase, first_q_block, per_head, last_head, seqlen_q, seqlen_k, nheads, slice_start,
                qk_scale_log2, BLOCK_M, NUM_STAGES, CAUSAL, SLICE, 1)
            ds_phase = ds_phase ^ 1
            rest = iterations - 1
        for _ in range(rest // 2):
            s, dp, dq, dk, dv, head, q_block, stage, phase = _turn_block(
                k_smem, v_smem, q_bufs, do_bufs, stats_bufs, ds_bufs, ds_ready, dq_bufs, q_ready, do_ready,
                stats_ready, stage_free, dq_desc, s, dp, dq, dk, dv, batch, head, q_block, stage, phase, ds_phase,
                first_q_block, per_head, last_head, seqlen_q, seqlen_k, nheads, slice_start, qk_scale_log2, BLOCK_M,
                NUM_STAGES, CAUSAL, SLICE, 0)
            s, dp, dq, dk, dv, head, q_block, stage, phase = _turn_block(
                k_smem, v_smem, q_bufs, do_bufs, stats_bufs, ds_bufs, ds_ready, dq_bufs, q_ready, do_ready,
                stats_ready, stage_free, dq_desc, s, dp, dq, dk, dv, batch, head, q_block, stage, phase, ds_phase,
                first_q_block, per_head, last_head, seqlen_q, seqlen_k, nheads, slice_start, qk_scale_log2, BLOCK_M,
                NUM_STAGES, CAUSAL, SLICE, 1)
            ds_phase = ds_phase ^ 1
        if rest % 2 == 1:
            s, dp, dq, dk, dv, head, q_block, stage, phase = _turn_block(
                k_smem, v_smem, q_bufs, do_bufs, stats_bufs, ds_bufs, ds_ready, dq_bufs, q_ready, do_ready,
                stats_ready, stage_free, dq_desc, s, dp, dq, dk, dv, batch, head, q_block, stage, phase, ds_phase,
                first_q_block, per_head, last_head, seqlen_q, seqlen_k, nheads, slice_start, qk_scale_log2, BLOCK_M,
                NUM_STAGES, CAUSAL, SLICE, 0)
    return dk, dv, stage, phase


@gluon.jit
def store_gradients(dk, dv, v_slice, DK, DV, batch, head_k, slice_start, seqlen_k, stride_gb, stride_gm, stride_gh,
                    softmax_scale, HEAD_DIM: gl.constexpr):
    """A consumer's 64 keys' rows of dV and dK (scaled), staged for 16-byte stores in ``v_slice``, the consumer's own
    64 keys of V: free once its last dP^T has completed (K is not: both consumers read all of it for dQ^T), and its
    reads fenced against the next TMA copy into it when this returns."""
    column = batch.to(gl.int64) * stride_gb + head_k * stride_gh
    store_rows_through(DV, dv, v_slice, 0, slice_start, column, stride_gm, seqlen_k, HEAD_DIM)
    store_rows_through(DK, dk * softmax_scale, v_slice, 0, slice_start, column, stride_gm, seqlen_k, HEAD_DIM)


@gluon.jit
def fused_buffers(q_desc, k_desc, v_desc, do_desc, dq_desc, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                  NUM_STAGES: gl.constexpr):
    """The fused kernel's shared memory and barriers: the key-slice kernel's K, V and stages of Q and dO, the dS^T
    ring, the dQ^T staging buffers and each stage's lse and delta."""
    gl.static_assert(((HEAD_DIM == 2 * DQ_ROWS) & (BLOCK_M == DQ_QUERIES))
                     | ((HEAD_DIM == DQ_ROWS) & ((BLOCK_M == DQ_QUERIES) | (BLOCK_M == DQ_BLOCK_PAIR * DQ_QUERIES))),
                     "the fused dK/dV/dQ kernel takes 64-row query blocks at head dim 128, 64 or 128 rows at 64")
    BLOCK_N: gl.constexpr = KEY_SLICE_PROGRAM_KEYS
    k_smem, v_smem, q_bufs, do_bufs, kv_ready, q_ready, do_ready, stage_free, _ = _streamed_buffers(
        q_desc, k_desc, v_desc, do_desc, HEAD_DIM, BLOCK_M, BLOCK_N, NUM_STAGES, True)
    # dS^T of the program's 128 keys on a ring of two (``_row_block_partition``); each buffer's barrier completes once
    # both consumers have stored their rows
    DS_BUFFERS: gl.constexpr = 2
    ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], q_desc.dtype)
    ds_bufs = gl.allocate_shared_memory(q_desc.dtype, [DS_BUFFERS, BLOCK_N, BLOCK_M], ds_layout)
    ds_ready = gl.allocate_shared_memory(gl.int64, [DS_BUFFERS, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(DS_BUFFERS):
        mbarrier.init(ds_ready.index(i), count=2)
    # dQ^T buffers, each read by TMA reductions after a consumer's stores: two a consumer at head dim 128 (consumer
    # c's: 2c and 2c + 1), one at 64 (used every other block) of a tile a 64 queries of the block
    DQ_BUFFERS: gl.constexpr = 4 if HEAD_DIM == 2 * DQ_ROWS else 2
    gl.static_assert(DQ_TILE_ROWS * DQ_TILE_COLUMNS == DQ_ROWS * DQ_QUERIES, "a staged dQ^T tile is 64 x 64 values")
    dq_bufs = gl.allocate_shared_memory(gl.float32, [DQ_BUFFERS, BLOCK_M // DQ_QUERIES * DQ_TILE_ROWS, DQ_TILE_COLUMNS],
                                        dq_desc.layout)
    # each stage's lse (row 2 * stage) and delta (row 2 * stage + 1), written by the loader
    stats_bufs = gl.allocate_shared_memory(gl.float32, [2 * NUM_STAGES, BLOCK_M],
                                           gl.SwizzledSharedLayout(1, 1, 1, [0]))
    stats_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(stats_ready.index(i), count=1)
    return (k_smem, v_smem, q_bufs, do_bufs, kv_ready, q_ready, do_ready, stage_free, ds_bufs, ds_ready, dq_bufs,
            stats_bufs, stats_ready)


# seqlen_q is not specialized as a constant, as in dkdv_key_slices_kernel (Triton 3.6's lowering fails there)
@gluon.jit(do_not_specialize=["seqlen_q"])
def dkdv_dq_key_slices_kernel(
    q_desc, k_desc, v_desc, do_desc, Lse, Delta, DK, DV, dq_desc,
    stride_gb, stride_gm, stride_gh,
    seqlen_q, seqlen_k, nheads, nheads_k, key_blocks, batch_heads_k, heads_per_section, softmax_scale, qk_scale_log2,
    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, NUM_STAGES: gl.constexpr, CAUSAL: gl.constexpr,
    CONSUMER_REGISTERS: gl.constexpr, LOADER_REGISTERS: gl.constexpr,
):
    """``dkdv_key_slices_kernel``'s dK and dV, and dQ^T / softmax_scale added into the float32 accumulator of
    ``dq_desc``: rows of DQ_TILE_COLUMNS, a [DQ_TILE_ROWS, DQ_TILE_COLUMNS] block each consumer's tile of a query
    block (``_add_dq``), zeroed by the caller.
    Head dim 128 (each consumer's half of dQ^T is one wgmma row block) or 64 (the consumers take dQ^T's one row
    block in turns, on 64-row query blocks: 128-row ones are the persistent form's, as the table takes them; this
    kernel's consumers spilled on them, 29 values a two-block round)."""
    gl.static_assert(BLOCK_M == DQ_QUERIES, "the one-tile fused kernel takes 64-row query blocks")
    BLOCK_N: gl.constexpr = KEY_SLICE_PROGRAM_KEYS
    group_size = nheads // nheads_k
    (k_smem, v_smem, q_bufs, do_bufs, kv_ready, q_ready, do_ready, stage_free, ds_bufs, ds_ready, dq_bufs, stats_bufs,
     stats_ready) = fused_buffers(q_desc, k_desc, v_desc, do_desc, dq_desc, HEAD_DIM, BLOCK_M, NUM_STAGES)
    gl.warp_specialize([
        (_row_block_partition, (k_smem, v_smem, q_bufs, do_bufs, stats_bufs, ds_bufs, ds_ready, dq_bufs, kv_ready,
                                q_ready, do_ready, stats_ready, stage_free, DK, DV, dq_desc, stride_gb, stride_gm,
                                stride_gh, seqlen_q, seqlen_k, nheads, nheads_k, key_blocks, batch_heads_k,
                                heads_per_section, group_size,
                                softmax_scale, qk_scale_log2, HEAD_DIM, BLOCK_M, BLOCK_N, NUM_STAGES, CAUSAL, 0)),
        (_row_block_partition, (k_smem, v_smem, q_bufs, do_bufs, stats_bufs, ds_bufs, ds_ready, dq_bufs, kv_ready,
                                q_ready, do_ready, stats_ready, stage_free, DK, DV, dq_desc, stride_gb, stride_gm,
                                stride_gh, seqlen_q, seqlen_k, nheads, nheads_k, key_blocks, batch_heads_k,
                                heads_per_section, group_size,
                                softmax_scale, qk_scale_log2, HEAD_DIM, BLOCK_M, BLOCK_N, NUM_STAGES, CAUSAL, 1)),
        (_load_with_statistics, (q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, q_bufs, do_bufs, stats_bufs,
                                 kv_ready, q_ready, do_ready, stats_ready, stage_free, Lse, Delta, seqlen_q,
                                 seqlen_k, nheads, nheads_k, key_blocks, batch_heads_k, heads_per_section, group_size,
                                 HEAD_DIM, BLOCK_M, BLOCK_N,
                                 NUM_STAGES, CAUSAL)),
    ], [4, 1], [CONSUMER_REGISTERS, LOADER_REGISTERS])


@triton.jit
def dq_from_accumulator(DQAcc, DQ, softmax_scale, seqlen_q, nheads, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    """DQ (batch, seqlen_q, nheads, HEAD_DIM), contiguous, = softmax_scale * the fused kernel's float32 dQ^T
    accumulator, rounded to DQ's type: BLOCK_M query rows of one (batch, head) a program. The accumulator holds, for
    each (batch, head, block of DQ_QUERIES queries (whole pairs of them a head), DQ_ROWS head dims), a
    [DQ_TILE_ROWS, DQ_TILE_COLUMNS] tile in the order of ``_register_order``: query c = 8 i + 2 (lane % 4) + r0 and
    head dim d = 16 w + 8 r1 + lane // 4 of a tile at row 2 i + w // 2, column 128 (w % 2) + 16 (lane // 4) + 4
    (lane % 4) + 2 r1 + r0."""
    batch_head = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, HEAD_DIM)
    query, dim = rows % DQ_QUERIES, cols % DQ_ROWS
    warp = dim // 16
    q_blocks = DQ_BLOCK_PAIR * tl.cdiv(seqlen_q, DQ_BLOCK_PAIR * DQ_QUERIES)  # as _add_dq counts them
    tiles = ((batch_head * q_blocks + rows // DQ_QUERIES).to(tl.int64)[:, None]
             * (HEAD_DIM // DQ_ROWS)
             + (cols // DQ_ROWS)[None, :])
    tile_rows = (query // 8)[:, None] * 2 + (warp // 2)[None, :]
    tile_columns = ((128 * (warp % 2) + 16 * (dim % 8) + 2 * ((dim // 8) % 2))[None, :]
                    + (4 * ((query % 8) // 2) + query % 2)[:, None])
    mask = (rows < seqlen_q)[:, None]
    acc = tl.load(DQAcc + (tiles * DQ_TILE_ROWS + tile_rows) * DQ_TILE_COLUMNS + tile_columns, mask=mask)
    batch = batch_head // nheads
    head = batch_head % nheads
    tokens = (batch.to(tl.int64) * seqlen_q + rows) * nheads + head
    tl.store(DQ + tokens[:, None] * HEAD_DIM + cols[None, :], (acc * softmax_scale).to(DQ.dtype.element_ty),
             mask=mask)
