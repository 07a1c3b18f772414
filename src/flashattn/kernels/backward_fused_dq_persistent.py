"""The fused dK/dV/dQ kernel (``backward_fused_dq.py``) on a persistent grid: one program an SM walks key tiles.

The one-tile kernel runs one program an SM (132-231 KB of shared memory), which pays its prologue (K and V, the
first stages of Q and dO) and its epilogue (the dK and dV stores, the last reductions' wait) with the SM otherwise
idle: at 1k tokens a tile has 16 query blocks a query head (causal: 2-16), and the next program starts only once the
last one has left. Here a program takes tile after tile (FlashAttention-3's persistent backward), and its loader
fetches the next tile's first stages of Q and dO as soon as the consumers free them (the ring runs on from tile to
tile) and its K and V as soon as both consumers have stored the last tile's dK and dV (``kv_free``): each stages its
own through its slice of V for 16-byte stores, so the release waits for the stores.

Tile order (``backward_hopper.sectioned_key_tile``, as in the one-tile kernels): kv heads in L2 sections (as many
kv heads as have their group's Q and dO within ``configs.HOPPER_L2_SECTION_BYTES``, the sections made equal), and
inside a section the key block as the slower index, so that the programs in flight read a few heads' Q and dO, and
under a causal mask (bottom-right aligned: the first key blocks see the most query rows) every head's longest tiles
go first and the shortest last, where a tail of long tiles would leave SMs idle. The tiles are handed out by a
counter that the launcher zeroes (the forward's ``_next_tile``), as causal tiles are unequal work; each plan replay
zeroes it too.

Every partition keeps its ring positions across tiles: the Q/dO stages, the dS^T ring and the dQ^T staging buffers
(the program's query blocks so far: ``walk_query_blocks``). The dQ^T reductions are waited for once, at the
program's end.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from .backward_fused_dq import (
    fused_buffers,
    load_query_block,
    store_gradients,
    walk_query_blocks,
)
from .backward_hopper import KEY_SLICE_PROGRAM_KEYS, SLICE_KEYS, _next_query_block, sectioned_key_tile
from .forward_hopper import _next_tile, _publish_tile, copy_rows, read_tile


@gluon.jit
def _persistent_loader(q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, q_bufs, do_bufs, stats_bufs, kv_ready,
                       kv_free, tile_slot, q_ready, do_ready, stats_ready, stage_free, TileCounter, Lse, Delta,
                       seqlen_q, seqlen_k, nheads, nheads_k, key_blocks, group_size, batch_heads_k, heads_per_section,
                       HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                       NUM_STAGES: gl.constexpr, CAUSAL: gl.constexpr):
    """Each tile's first stages of Q and dO (as the last tile's blocks free them), then its K and V (once both
    consumers are done with the last tile's: ``kv_free``) with its number for the consumers, then its other stages."""
    total_tiles = key_blocks * batch_heads_k
    position = 0  # query blocks loaded so far: the stage ring's position
    rounds = 0  # tiles taken so far: the K/V barriers' phase
    tile_id = gl.program_id(0)
    while tile_id < total_tiles:
        # taken now, read after this tile's loads are issued: the counter's round trip hides behind them
        next_tile = _next_tile(tile_id, TileCounter, True)
        batch, head_k, key_start, first_q_block, per_head, iterations = sectioned_key_tile(
            tile_id, seqlen_q, seqlen_k, nheads_k, key_blocks, group_size, batch_heads_k, heads_per_section,
            BLOCK_M, BLOCK_N, CAUSAL)
        head = head_k * group_size
        last_head = head + group_size - 1
        q_block = first_q_block
        ahead = gl.minimum(iterations, NUM_STAGES)
        for _ in range(ahead):
            load_query_block(q_desc, do_desc, q_bufs, do_bufs, stats_bufs, q_ready, do_ready, stats_ready,
                             stage_free, Lse, Delta, batch, head, q_block, position, seqlen_q, nheads, HEAD_DIM,
                             BLOCK_M, NUM_STAGES)
            head, q_block = _next_query_block(head, q_block, first_q_block, per_head, last_head)
            position += 1
        # a fresh barrier passes a wait on the phase before its first: the first tile does not wait
        mbarrier.wait(kv_free, (rounds & 1) ^ 1)
        # the consumers read the slot after the kv_ready phase that this expect begins, and arrive on kv_free only
        # after that read: the slot is theirs until the wait above
        _publish_tile(tile_slot, tile_id)
        mbarrier.expect(kv_ready, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        copy_rows(k_desc, batch, batch * seqlen_k, key_start, head_k * HEAD_DIM, kv_ready, k_smem)
        copy_rows(v_desc, batch, batch * seqlen_k, key_start, head_k * HEAD_DIM, kv_ready, v_smem)
        for _ in range(ahead, iterations):
            load_query_block(q_desc, do_desc, q_bufs, do_bufs, stats_bufs, q_ready, do_ready, stats_ready,
                             stage_free, Lse, Delta, batch, head, q_block, position, seqlen_q, nheads, HEAD_DIM,
                             BLOCK_M, NUM_STAGES)
            head, q_block = _next_query_block(head, q_block, first_q_block, per_head, last_head)
            position += 1
        rounds += 1
        tile_id = next_tile
    # no tile left: the consumers read a number past the last one and stop
    mbarrier.wait(kv_free, (rounds & 1) ^ 1)
    _publish_tile(tile_slot, tile_id)
    mbarrier.arrive(kv_ready, count=1)


@gluon.jit
def _persistent_consumer(k_smem, v_smem, q_bufs, do_bufs, stats_bufs, ds_bufs, ds_ready, dq_bufs, kv_ready, kv_free,
                         tile_slot, round_slots, q_ready, do_ready, stats_ready, stage_free, DK, DV, dq_desc,
                         stride_gb, stride_gm, stride_gh, seqlen_q, seqlen_k, nheads, nheads_k, key_blocks, group_size,
                         batch_heads_k, heads_per_section, softmax_scale, qk_scale_log2, HEAD_DIM: gl.constexpr,
                         BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
                         CAUSAL: gl.constexpr, SLICE: gl.constexpr):
    """``backward_fused_dq._row_block_partition`` over the tiles the loader hands out: each tile's blocks
    (``walk_query_blocks``, the ring positions carried on), then dK and dV stored through this consumer's slice of V,
    then the release of K and V for the next tile's.

    Only what the loop reads stays in registers through it: the tile count waits in this consumer's slot of
    ``round_slots`` (an int32 through shared memory, as the tile number is), and the tile's plan is read again from
    ``tile_slot`` for the stores. Kept in registers, the two pushed the head-dim-128 loop past 240 registers: ptxas
    reloaded spilled values in it, 3 a block without a mask and 15 causal."""
    total_tiles = key_blocks * batch_heads_k
    rounds = 0  # tiles done: the K/V barriers' phase
    ring = 0  # query blocks done: the position in the dS^T ring and the staging buffers
    stage = 0
    phase = 0
    round_slot = round_slots.index(SLICE)
    mbarrier.wait(kv_ready, 0)
    tile_id = read_tile(tile_slot)
    while tile_id < total_tiles:
        batch, head_k, key_start, first_q_block, per_head, iterations = sectioned_key_tile(
            tile_id, seqlen_q, seqlen_k, nheads_k, key_blocks, group_size, batch_heads_k, heads_per_section,
            BLOCK_M, BLOCK_N, CAUSAL)
        _publish_tile(round_slot, rounds)
        dk, dv, stage, phase = walk_query_blocks(
            k_smem, v_smem, q_bufs, do_bufs, stats_bufs, ds_bufs, ds_ready, dq_bufs, q_ready, do_ready, stats_ready,
            stage_free, dq_desc, batch, head_k * group_size, first_q_block, per_head, iterations, group_size, ring,
            stage, phase, seqlen_q, seqlen_k, nheads, key_start + SLICE * SLICE_KEYS, qk_scale_log2, HEAD_DIM,
            BLOCK_M, NUM_STAGES, CAUSAL, SLICE)
        ring += iterations
        # the slot holds this tile's number until the loader's wait on the arrive below
        batch, head_k, key_start, _, _, _ = sectioned_key_tile(
            read_tile(tile_slot), seqlen_q, seqlen_k, nheads_k, key_blocks, group_size, batch_heads_k,
            heads_per_section, BLOCK_M, BLOCK_N, CAUSAL)
        rounds = read_tile(round_slot) + 1
        # every product of the tile has completed (each block waits for its own), so none reads K or V any more:
        # dV and dK go through this consumer's slice of V, which the arrive then hands back with K (its partition
        # barrier holds it until every warp is past the stores)
        store_gradients(dk, dv, v_smem.slice(SLICE * SLICE_KEYS, SLICE_KEYS), DK, DV, batch, head_k,
                        key_start + SLICE * SLICE_KEYS, seqlen_k, stride_gb, stride_gm, stride_gh, softmax_scale,
                        HEAD_DIM)
        mbarrier.arrive(kv_free, count=1)
        mbarrier.wait(kv_ready, rounds & 1)
        tile_id = read_tile(tile_slot)
    tma.store_wait(0)  # the shared memory stays the reductions' until they have read it


# seqlen_q is not specialized as a constant, as in dkdv_key_slices_kernel (Triton 3.6's lowering fails there)
@gluon.jit(do_not_specialize=["seqlen_q"])
def dkdv_dq_persistent_kernel(
    q_desc, k_desc, v_desc, do_desc, Lse, Delta, DK, DV, dq_desc, TileCounter,
    stride_gb, stride_gm, stride_gh,
    seqlen_q, seqlen_k, nheads, nheads_k, key_blocks, batch_heads_k, heads_per_section, softmax_scale, qk_scale_log2,
    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, NUM_STAGES: gl.constexpr, CAUSAL: gl.constexpr,
    CONSUMER_REGISTERS: gl.constexpr, LOADER_REGISTERS: gl.constexpr,
):
    """``dkdv_dq_key_slices_kernel``'s gradients on a grid of at most one program an SM: ``key_blocks`` *
    ``batch_heads_k`` tiles, each program's first its program id, the others taken from ``TileCounter`` (an int32,
    zeroed by the caller), in sections of ``heads_per_section`` (batch, kv head) pairs."""
    BLOCK_N: gl.constexpr = KEY_SLICE_PROGRAM_KEYS
    group_size = nheads // nheads_k
    (k_smem, v_smem, q_bufs, do_bufs, kv_ready, q_ready, do_ready, stage_free, ds_bufs, ds_ready, dq_bufs, stats_bufs,
     stats_ready) = fused_buffers(q_desc, k_desc, v_desc, do_desc, dq_desc, HEAD_DIM, BLOCK_M, NUM_STAGES)
    # K and V freed by both consumers once each has stored the tile's dK and dV through its slice of V
    kv_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_free, count=2)
    tile_slot = gl.allocate_shared_memory(gl.int32, [1], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    round_slots = gl.allocate_shared_memory(gl.int32, [2, 1], gl.SwizzledSharedLayout(1, 1, 1, [0]))  # a consumer's
    gl.warp_specialize([
        (_persistent_consumer, (k_smem, v_smem, q_bufs, do_bufs, stats_bufs, ds_bufs, ds_ready, dq_bufs, kv_ready,
                                kv_free, tile_slot, round_slots, q_ready, do_ready, stats_ready, stage_free, DK,
                                DV, dq_desc, stride_gb, stride_gm, stride_gh, seqlen_q, seqlen_k, nheads, nheads_k,
                                key_blocks, group_size, batch_heads_k, heads_per_section, softmax_scale,
                                qk_scale_log2, HEAD_DIM, BLOCK_M, BLOCK_N, NUM_STAGES, CAUSAL, 0)),
        (_persistent_consumer, (k_smem, v_smem, q_bufs, do_bufs, stats_bufs, ds_bufs, ds_ready, dq_bufs, kv_ready,
                                kv_free, tile_slot, round_slots, q_ready, do_ready, stats_ready, stage_free, DK,
                                DV, dq_desc, stride_gb, stride_gm, stride_gh, seqlen_q, seqlen_k, nheads, nheads_k,
                                key_blocks, group_size, batch_heads_k, heads_per_section, softmax_scale,
                                qk_scale_log2, HEAD_DIM, BLOCK_M, BLOCK_N, NUM_STAGES, CAUSAL, 1)),
        (_persistent_loader, (q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, q_bufs, do_bufs, stats_bufs, kv_ready,
                              kv_free, tile_slot, q_ready, do_ready, stats_ready, stage_free, TileCounter, Lse, Delta,
                              seqlen_q, seqlen_k, nheads, nheads_k, key_blocks, group_size, batch_heads_k,
                              heads_per_section, HEAD_DIM, BLOCK_M, BLOCK_N, NUM_STAGES, CAUSAL)),
    ], [4, 1], [CONSUMER_REGISTERS, LOADER_REGISTERS])
