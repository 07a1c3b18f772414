"""Hopper FP8 dK/dV and dQ in one Gluon kernel: ``backward_fp8_hopper``'s key-block program (128 keys, two 64-key
consumers, S^T and dP^T, the e4m3 dV and dK tile products) also adds each query block's dQ = dS K into a float32
accumulator by TMA reductions, as the 16-bit ``backward_fused_dq`` does beside ``backward_hopper``. The two-pass form
(that kernel and ``backward_fp8_dq_hopper``) stays for deterministic calls, the reductions landing in any order, and
for head dim 128, where this kernel's loops spill (the dQ tile and the dS ring beside dK, dV and the tile product) and
the two passes are faster (docs/perf-notes.md, "FP8 backward").

dQ's tile product is dQ = dS K with both operands in shared memory (M = 64 queries, K = the program's 128 keys, N a
head-dim half): each consumer computes its own half of the head dim over all 128 keys. A register A operand would
need queries along the warps' rows, which the consumers' dS^T (keys along the rows) spreads over all four warps, and
e4m3 wgmma reads shared operands K-major only, so dS goes to shared memory keys-contiguous and K^T comes from the
launcher's copy. One dS tile's 128 keys share one descale (the consumers' exchanged amax), which is what lets a single
e4m3 contraction run over both consumers' halves; the product gets a fresh accumulator, like dV's and dK's, and its
descales (ds_descale * k_descale * softmax_scale) are applied once in float32, so the accumulator holds dQ itself.

dS's shared layout: in the wgmma accumulator a thread holds keys g and g + 8 of its warp's 16 for each of its query
columns. Written as one 16-bit word per such pair (two e4m3 bytes from one ``cvt.rn.satfinite.e4m3x2.f32``), the
tile is one 8x8 b16 ``stmatrix`` fragment per 8 queries, stored transposed (queries along the rows) by
``stmatrix.trans``: 2 STSM a thread a block where byte stores would take 32. The launcher writes K^T with each 16
keys in the same order (``launch.backward_fp8.transposed_keys(k, pairs=True)``), so the product's sum over keys is
unchanged. dQ's operand is rounded from the same float32 dS * (1 / ds_descale) as dK's, by the same conversion, so
both products see the reference path's one e4m3 dS.

Per block, after dK's product (so that dQ's accumulator overlaps no other tile product), a consumer waits for both
halves of dS (``ds_ready``, count 2), runs its dQ product, scales it, stages it in its own float32 buffer and issues
one ``cp.reduce.async.bulk.tensor.add.f32`` of its 64 x D/2 tile. The dS ring has 2 buffers: a consumer writes buffer
i % 2 only after the tile amax of block i, which needs the other consumer's arrive of block i, made after that
consumer's dQ product of block i - 1 and so of i - 2. Query rows past seqlen_q in a batch's last block add their
exact zeros (dS is 0 there) into the next batch's first rows.
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

from .backward_fp8_hopper import (
    BLOCK_M,
    E4M3_MAX,
    FLOAT32_TINY,
    PROGRAM_KEYS,
    SLICE_KEYS,
    _key_tile,
    _share_key_max,
    _tile_amax,
    block_barriers,
    block_scores,
    key_slice,
    load_query_blocks,
    query_block_rings,
    score_layout,
)
from .backward_fused_dq import _tma_reduce_add
from .backward_hopper import store_key_slice
from .forward_fp8_hopper import _p_operand, fp8_wgmma_layout


@gluon.constexpr_function
def ds_layout():
    """dS's shared layout: one query a 128-byte row of the tile's 128 e4m3 keys, 128B swizzle (K-major A)."""
    return gl.NVMMASharedLayout.get_default_for([BLOCK_M, PROGRAM_KEYS], gl.float8e4nv)


@gluon.constexpr_function
def _pair_layout():
    """The same bytes as 64 queries x 64 16-bit key pairs: the rows and swizzle of :func:`ds_layout`."""
    return gl.NVMMASharedLayout.get_default_for([BLOCK_M, PROGRAM_KEYS // 2], gl.int16)


@gluon.jit
def _store_ds_pairs(ds_scaled, ds_buf, SLICE: gl.constexpr):
    """This consumer's 64 keys of dS^T (float32, keys along the rows, already divided by the descale) rounded to e4m3
    into bytes [64 * SLICE, + 64) of every query row of ``ds_buf``: keys 8h + g of each 16 at byte 2g + h, each
    thread's two keys of a query one 16-bit word, so that the transposing store is ``stmatrix.trans``."""
    pairs = gl.permute(gl.reshape(ds_scaled, [4, 2, 8, BLOCK_M]), [0, 2, 3, 1])
    low, high = gl.split(pairs)
    # cvt.e4m3x2 d, a, b puts a in the high byte: the key g at the lower address
    words = gl.inline_asm_elementwise("cvt.rn.satfinite.e4m3x2.f32 $0, $2, $1;", "=h,r,r", [low, high],
                                      dtype=gl.int16, is_pure=True, pack=1)
    words = gl.reshape(words, [SLICE_KEYS // 2, BLOCK_M])
    view = ds_buf._reinterpret(gl.int16, [BLOCK_M, PROGRAM_KEYS // 2], _pair_layout())
    view.slice(SLICE * (SLICE_KEYS // 2), SLICE_KEYS // 2, dim=1).permute((1, 0)).store(words)


@gluon.jit
def _add_dq_half(acc, dq_smem, dq_desc, row, column):
    """A consumer's scaled dQ tile (64 queries x a head-dim half) added into the float32 accumulator at (row, column)
    by one TMA reduction through ``dq_smem``, whose last reduction has been waited for."""
    dq_smem.store(acc)
    fence_async_shared()
    gl.thread_barrier()  # every warp's part is in shared memory before the one thread issues the reduction
    _tma_reduce_add(dq_desc, [row, column], dq_smem)


@gluon.jit
def _load_partition(q_desc, do_desc, qt_desc, dot_desc, k_desc, v_desc, kt_desc, k_smem, v_smem, kt_smem, q_bufs,
                    do_bufs, qt_bufs, dot_bufs, stats_bufs, kv_ready, ready, stats_ready, stage_free, Lse, Delta,
                    seqlen_q, seqlen_k, nheads, nheads_k, key_blocks, heads_per_section, window_left, window_right,
                    HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr, WINDOW_LEFT: gl.constexpr,
                    WINDOW_RIGHT: gl.constexpr):
    """``backward_fp8_hopper._load_partition`` with the program's K^T columns behind K and V's barrier."""
    batch, head_k, key_start, first_q_block, per_head = _key_tile(
        seqlen_q, seqlen_k, nheads_k, key_blocks, heads_per_section, window_left, window_right, WINDOW_LEFT,
        WINDOW_RIGHT)
    mbarrier.expect(kv_ready, k_desc.block_type.nbytes + v_desc.block_type.nbytes + kt_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [batch * seqlen_k + key_start, head_k * HEAD_DIM], kv_ready, k_smem)
    tma.async_copy_global_to_shared(v_desc, [batch * seqlen_k + key_start, head_k * HEAD_DIM], kv_ready, v_smem)
    tma.async_copy_global_to_shared(kt_desc, [(batch * nheads_k + head_k) * HEAD_DIM, key_start], kv_ready, kt_smem)
    load_query_blocks(q_desc, do_desc, qt_desc, dot_desc, q_bufs, do_bufs, qt_bufs, dot_bufs, stats_bufs, ready,
                      stats_ready, stage_free, Lse, Delta, batch, head_k, first_q_block, per_head, seqlen_q, nheads,
                      nheads_k, HEAD_DIM, NUM_STAGES)


@gluon.jit
def _key_slice_partition(k_smem, v_smem, kt_smem, q_bufs, do_bufs, qt_bufs, dot_bufs, stats_bufs, amax_bufs, ds_bufs,
                         dq_smem, kv_ready, ready, stats_ready, stage_free, amax_ready, ds_ready, dq_desc, DK, DV,
                         QDescale, KDescale, VDescale, DODescale, stride_gb, stride_gm, stride_gh, stride_ds_b,
                         stride_ds_h, stride_ds_blk, seqlen_q, seqlen_k, nheads, nheads_k, key_blocks,
                         heads_per_section, window_left, window_right, softmax_scale, qk_scale_log2,
                         HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr, WINDOW_LEFT: gl.constexpr,
                         WINDOW_RIGHT: gl.constexpr, SLICE: gl.constexpr):
    """``backward_fp8_hopper._key_slice_partition`` (dK and dV of keys [SLICE * 64, + 64)) and, every query block,
    head-dim columns [SLICE * D / 2, + D / 2) of the block's dQ over all 128 keys."""
    HALF: gl.constexpr = HEAD_DIM // 2
    s_layout: gl.constexpr = score_layout(k_smem.dtype, BLOCK_M)
    acc_layout: gl.constexpr = fp8_wgmma_layout(HEAD_DIM)
    batch, head_k, key_start, first_q_block, per_head, group_size, slice_start, k_slice, v_slice, keys, descales, \
        k_descale, v_descale = key_slice(k_smem, v_smem, KDescale, VDescale, stride_ds_b, stride_ds_h, stride_ds_blk,
                                         seqlen_q, seqlen_k, nheads, nheads_k, key_blocks, heads_per_section,
                                         window_left, window_right, s_layout, WINDOW_LEFT, WINDOW_RIGHT, SLICE)
    kt_half = kt_smem.slice(SLICE * HALF, HALF, dim=0).permute((1, 0))
    dq_staging = dq_smem.index(SLICE)
    # every tile product overwrites the last block's (use_acc=False), dQ's too
    s = gl.zeros([SLICE_KEYS, BLOCK_M], gl.float32, s_layout)
    dp = gl.zeros([SLICE_KEYS, BLOCK_M], gl.float32, s_layout)
    part = gl.zeros([SLICE_KEYS, HEAD_DIM], gl.float32, acc_layout)
    dq = gl.zeros([BLOCK_M, HALF], gl.float32, fp8_wgmma_layout(HALF))
    dk = gl.zeros([SLICE_KEYS, HEAD_DIM], gl.float32, acc_layout)
    dv = gl.zeros([SLICE_KEYS, HEAD_DIM], gl.float32, acc_layout)
    mbarrier.wait(kv_ready, 0)
    for it in range(per_head * group_size):
        head = head_k * group_size + it // per_head
        q_block, stage, s, dp, p, ds, q_descale, do_descale = block_scores(
            k_slice, v_slice, q_bufs, do_bufs, stats_bufs, ready, stats_ready, s, dp, it, first_q_block, per_head,
            keys, descales, k_descale, v_descale, QDescale, DODescale, stride_ds_blk, seqlen_q, seqlen_k, window_left,
            window_right, qk_scale_log2, NUM_STAGES, WINDOW_LEFT, WINDOW_RIGHT)
        # the last block's dQ reduction has read its staging buffer before this block's is written: the amax
        # exchange's thread barrier publishes the wait to every warp
        tma.store_wait(0)
        _share_key_max(ds, amax_bufs, amax_ready, it, SLICE)
        p_op = _p_operand(p * 256.0, HEAD_DIM, BLOCK_M)
        # the dV product runs while the amax is exchanged: its accumulator fits beside dS^T at hdim 64
        part = warpgroup_mma(p_op, dot_bufs.index(stage).permute((1, 0)), part, use_acc=False, is_async=True)
        ds_descale = gl.maximum(gl.div_rn(_tile_amax(amax_bufs, amax_ready, it), E4M3_MAX), FLOAT32_TINY)
        # dK's and dQ's operands from one float32 quotient and one rounding: the reference path's single e4m3 dS
        ds_scaled = ds * gl.div_rn(1.0, ds_descale)
        ds_op = _p_operand(ds_scaled, HEAD_DIM, BLOCK_M)
        _store_ds_pairs(ds_scaled, ds_bufs.index(it % 2), SLICE)
        fence_async_shared()
        gl.thread_barrier()  # every warp's pairs are stored before the one thread arrives
        mbarrier.arrive(ds_ready.index(it % 2), count=1)
        part = warpgroup_mma_wait(num_outstanding=0, deps=(part, ))
        dv += part * (do_descale * (1.0 / 256.0))  # P_SCALE
        # -- dK's tile product on dS^T in e4m3 --
        part = warpgroup_mma(ds_op, qt_bufs.index(stage).permute((1, 0)), part, use_acc=False, is_async=True)
        part = warpgroup_mma_wait(num_outstanding=0, deps=(part, ))
        mbarrier.arrive(stage_free.index(stage), count=1)
        dk += part * (ds_descale * q_descale)
        # -- dQ's tile product over both consumers' keys, its head-dim half reduced into the accumulator --
        mbarrier.wait(ds_ready.index(it % 2), (it // 2) & 1)
        dq = warpgroup_mma(ds_bufs.index(it % 2), kt_half, dq, use_acc=False, is_async=True)
        dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq, ))
        _add_dq_half(dq * (ds_descale * k_descale * softmax_scale), dq_staging, dq_desc,
                     batch * seqlen_q + q_block * BLOCK_M, head * HEAD_DIM + SLICE * HALF)
    tma.store_wait(0)
    store_key_slice(dk, dv, DK, DV, batch, head_k, slice_start, seqlen_k, stride_gb, stride_gm, stride_gh,
                    softmax_scale, HEAD_DIM, SLICE_KEYS, acc_layout)


# seqlen_q is not specialized as a constant (the 16-bit key-slice kernel's lowering fails for seqlen_q = 1)
@gluon.jit(do_not_specialize=["seqlen_q"])
def dkdv_dq_fp8_hopper_kernel(
    q_desc, do_desc, qt_desc, dot_desc, k_desc, v_desc, kt_desc, dq_desc, Lse, Delta, DK, DV, QDescale, KDescale,
    VDescale, DODescale, stride_gb, stride_gm, stride_gh, stride_ds_b, stride_ds_h, stride_ds_blk,
    seqlen_q, seqlen_k, nheads, nheads_k, key_blocks, heads_per_section, window_left, window_right, softmax_scale,
    qk_scale_log2,
    HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr, WINDOW_LEFT: gl.constexpr, WINDOW_RIGHT: gl.constexpr,
    CONSUMER_REGISTERS: gl.constexpr, LOADER_REGISTERS: gl.constexpr,
):
    """dK, dV and the dQ contributions of 128 keys a program, ``key_blocks`` programs per (batch, kv head).

    The arguments of ``backward_fp8_hopper.dkdv_fp8_hopper_kernel``, and: kt_desc: e4m3 K^T (batch * nheads_k *
    HEAD_DIM, padded keys) in (HEAD_DIM, 128) tiles, each 16 keys in the pair order; dq_desc: the zeroed float32 dQ
    accumulator (batch * seqlen_q, nheads * HEAD_DIM) in (64, HEAD_DIM / 2) tiles, which the kernel adds into."""
    gl.static_assert(HEAD_DIM == 64, "the FP8 dK/dV/dQ kernel takes head dim 64 (at 128 the two passes are faster)")
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [PROGRAM_KEYS, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [PROGRAM_KEYS, HEAD_DIM], v_desc.layout)
    kt_smem = gl.allocate_shared_memory(kt_desc.dtype, [HEAD_DIM, PROGRAM_KEYS], kt_desc.layout)
    q_bufs, do_bufs, qt_bufs, dot_bufs = query_block_rings(q_desc, do_desc, qt_desc, dot_desc, HEAD_DIM, NUM_STAGES)
    ds_bufs = gl.allocate_shared_memory(gl.float8e4nv, [2, BLOCK_M, PROGRAM_KEYS], ds_layout())
    dq_smem = gl.allocate_shared_memory(gl.float32, [2, BLOCK_M, HEAD_DIM // 2], dq_desc.layout)  # one a consumer
    stats_bufs = gl.allocate_shared_memory(gl.float32, [2 * NUM_STAGES, BLOCK_M], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    amax_bufs = gl.allocate_shared_memory(gl.float32, [2, PROGRAM_KEYS], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    kv_ready, ready, stats_ready, stage_free, amax_ready = block_barriers(NUM_STAGES)
    ds_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(ds_ready.index(i), count=2)  # both consumers' halves of dS are stored
    gl.warp_specialize([
        (_key_slice_partition, (k_smem, v_smem, kt_smem, q_bufs, do_bufs, qt_bufs, dot_bufs, stats_bufs, amax_bufs,
                                ds_bufs, dq_smem, kv_ready, ready, stats_ready, stage_free, amax_ready, ds_ready,
                                dq_desc, DK, DV, QDescale, KDescale, VDescale, DODescale, stride_gb, stride_gm,
                                stride_gh, stride_ds_b, stride_ds_h, stride_ds_blk, seqlen_q, seqlen_k, nheads,
                                nheads_k, key_blocks, heads_per_section, window_left, window_right, softmax_scale,
                                qk_scale_log2, HEAD_DIM, NUM_STAGES, WINDOW_LEFT, WINDOW_RIGHT, 0)),
        (_key_slice_partition, (k_smem, v_smem, kt_smem, q_bufs, do_bufs, qt_bufs, dot_bufs, stats_bufs, amax_bufs,
                                ds_bufs, dq_smem, kv_ready, ready, stats_ready, stage_free, amax_ready, ds_ready,
                                dq_desc, DK, DV, QDescale, KDescale, VDescale, DODescale, stride_gb, stride_gm,
                                stride_gh, stride_ds_b, stride_ds_h, stride_ds_blk, seqlen_q, seqlen_k, nheads,
                                nheads_k, key_blocks, heads_per_section, window_left, window_right, softmax_scale,
                                qk_scale_log2, HEAD_DIM, NUM_STAGES, WINDOW_LEFT, WINDOW_RIGHT, 1)),
        (_load_partition, (q_desc, do_desc, qt_desc, dot_desc, k_desc, v_desc, kt_desc, k_smem, v_smem, kt_smem,
                           q_bufs, do_bufs, qt_bufs, dot_bufs, stats_bufs, kv_ready, ready, stats_ready, stage_free,
                           Lse, Delta, seqlen_q, seqlen_k, nheads, nheads_k, key_blocks, heads_per_section, window_left,
                           window_right, HEAD_DIM, NUM_STAGES, WINDOW_LEFT, WINDOW_RIGHT)),
    ], [4, 1], [CONSUMER_REGISTERS, LOADER_REGISTERS])
