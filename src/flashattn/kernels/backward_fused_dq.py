"""Hopper dK/dV with dQ in the same pass (five products where the two-pass backward computes seven), in Gluon.

The key-slice kernel of ``backward_hopper.py`` (128 keys a program, 64 on each consumer warpgroup with both of
their gradients) also computes, per (query block, key slice), dQ_i^T = K_slice^T dS_i^T and adds it into a float32
dQ^T accumulator in global memory by a TMA reduction (FlashAttention-3's way): the order of those additions is
unordered, so the launcher takes this form only for ``deterministic=False`` calls (``launch.backward``).
``dq_from_accumulator`` then transposes, scales and rounds it.

Why dQ^T and not dQ = dS K: at hdim 128 the kernel's query blocks have 32 rows (64 spilled), under wgmma's 64-row M,
so the product puts HEAD_DIM (64 or 128) on M and the block's queries on N. Both operands come from shared memory:
K^T is the slice's K tile read transposed, and dS^T (already in registers, 16-bit, as dK's operand) is stored to a
per-consumer buffer once a block. The product of block i-1 is issued once block i's S^T and dP^T are spent and its
dS^T is stored, beside block i-1's dV and dK: its 32 registers a thread are then never live with theirs (issued
with S^T and dP^T, they were, and hdim 128 spilled about 45 values a block).

The result goes from the wgmma registers to a per-consumer shared buffer (HEAD_DIM x BLOCK_M float32, two a
consumer), and one thread issues the reduction of the whole tile into the accumulator, (batch, nheads, HEAD_DIM,
seqlen_q padded to 4) seen as (batch * nheads * HEAD_DIM) rows: a tile is one head's HEAD_DIM rows, and TMA drops
its columns past seqlen_q. There is no per-element atomic, address or layout conversion in the loop.

Each consumer adds its own 64 keys' partial: two reductions per 128 keys. Summing the two partials in shared memory
first would halve them, at the price of a hand-over between the consumers every block (the gradient-split kernel's
P^T ring, which cost it 8-20%): left for a measurement to decide.

Limits: the key-slice kernel's (dense 16-bit inputs, head dims 64 and 128, causal or no mask).
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
    _load_partition,
    _next_query_block,
    _slice_scores,
    _slice_statistics,
    _store_rows,
    _streamed_buffers,
)
from .forward_hopper import register_operand_layout, wgmma_layout


@gluon.jit
def _score_gradients(s, dp, q_block, lse_log2, delta, seqlen_q, seqlen_k, slice_start, qk_scale_log2,
                     dtype: gl.constexpr, BLOCK_M: gl.constexpr, CAUSAL: gl.constexpr, s_layout: gl.constexpr,
                     operand: gl.constexpr):
    """``backward_hopper._slice_score_gradients``, also returning dS^T in the score layout (for dQ), and with keys
    past the sequence masked: their rows of dK and dV are never stored, but their dS^T would reach dQ."""
    first_row = q_block * BLOCK_M
    if CAUSAL:
        # bottom-right aligned: query i sees keys up to i + seqlen_k - seqlen_q (so no key past the sequence)
        if slice_start + SLICE_KEYS - 1 > first_row + (seqlen_k - seqlen_q):
            keys = slice_start + gl.arange(0, SLICE_KEYS, layout=gl.SliceLayout(1, s_layout))
            rows = first_row + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, s_layout))
            s = gl.where(keys[:, None] <= rows[None, :] + (seqlen_k - seqlen_q), s, float("-inf"))
    else:
        if slice_start + SLICE_KEYS > seqlen_k:
            keys = slice_start + gl.arange(0, SLICE_KEYS, layout=gl.SliceLayout(1, s_layout))
            s = gl.where((keys < seqlen_k)[:, None], s, float("-inf"))
    p = gl.exp2(s * qk_scale_log2 - lse_log2[None, :])
    ds = (p * (dp - delta[None, :])).to(dtype)
    return gl.convert_layout(p.to(dtype), operand), gl.convert_layout(ds, operand), ds


@gluon.jit
def _stage_ds(ds, ds_smem):
    """dS^T to the consumer's buffer, visible to its next wgmma: every warp's stores, then the async proxy."""
    ds_smem.store(ds)
    fence_async_shared()
    gl.thread_barrier()


@_core.builtin
def _tma_reduce_add(tensor_desc, coord, src, _semantic=None):
    """``src`` (shared memory, ``tensor_desc``'s layout) added element-wise into the descriptor's tile at ``coord`` by
    one TMA reduction (``cp.reduce.async.bulk.tensor ... .add``), issued by one thread as a TMA store is, and waited
    for as one (``tma.store_wait``). Gluon 3.6 exposes the TMA store but not the reduction, which its builder has:
    this mirrors ``hopper.tma.async_copy_shared_to_global`` with the reduce op."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)


@gluon.jit
def _add_dq(dq, dq_smem, dq_desc, batch, head, q_block, nheads, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr):
    """dQ^T of one query block (float32, the wgmma layout) added into the accumulator's tile of (batch, head) by a
    TMA reduction through ``dq_smem``, whose last reduction the caller has waited for. The tile's rows are one
    head's HEAD_DIM rows, and TMA drops its columns past seqlen_q (rows of dS there are 0 in any case)."""
    dq_smem.store(dq)
    fence_async_shared()
    gl.thread_barrier()  # every warp's part is in shared memory before the one thread issues the reduction
    _tma_reduce_add(dq_desc, [(batch * nheads + head) * HEAD_DIM, q_block * BLOCK_M], dq_smem)


@gluon.jit
def _fused_partition(k_smem, v_smem, q_bufs, do_bufs, ds_bufs, dq_bufs, kv_ready, q_ready, do_ready, stage_free,
                     Lse, Delta, DK, DV, dq_desc, stride_gb, stride_gm, stride_gh, seqlen_q, seqlen_k, nheads, nheads_k,
                     key_blocks, group_size, softmax_scale, qk_scale_log2,
                     HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
                     CAUSAL: gl.constexpr, SLICE: gl.constexpr):
    """``backward_hopper._key_slice_partition`` with dQ: block i's S^T and dP^T are issued ahead of block i-1's dV
    and dK, and block i-1's dQ^T once block i's dS^T is stored; once the three complete, dQ^T goes to the
    accumulator by a TMA reduction. dQ is left unscaled (softmax_scale: later)."""
    s_layout: gl.constexpr = wgmma_layout(BLOCK_M)
    acc_layout: gl.constexpr = wgmma_layout(HEAD_DIM)
    operand: gl.constexpr = register_operand_layout(HEAD_DIM)
    dtype: gl.constexpr = k_smem.dtype
    batch, head_k, key_start, first_q_block, per_head, iterations = _key_tile(
        seqlen_q, seqlen_k, nheads_k, key_blocks, group_size, BLOCK_M, BLOCK_N, CAUSAL)
    slice_start = key_start + SLICE * SLICE_KEYS
    k_slice = k_smem.slice(SLICE * SLICE_KEYS, SLICE_KEYS)
    v_slice = v_smem.slice(SLICE * SLICE_KEYS, SLICE_KEYS)
    k_slice_t = k_slice.permute((1, 0))  # K^T: HEAD_DIM x 64 keys, dQ^T's A operand
    s = gl.zeros([SLICE_KEYS, BLOCK_M], gl.float32, s_layout)
    dp = gl.zeros([SLICE_KEYS, BLOCK_M], gl.float32, s_layout)
    # dQ^T's input accumulator, never read (use_acc=False): one tensor made outside the loop, so that dQ^T's registers
    # are not carried through it
    dq_unused = gl.zeros([HEAD_DIM, BLOCK_M], gl.float32, s_layout)
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
    p_op, ds_op, ds = _score_gradients(s, dp, q_block, lse_log2, delta, seqlen_q, seqlen_k, slice_start,
                                       qk_scale_log2, dtype, BLOCK_M, CAUSAL, s_layout, operand)
    # dS^T on a 2-buffer ring a consumer: stored as soon as computed, while the last block's dQ^T reads the other
    # buffer, so that it does not hold registers through the products' wait
    ds_buffer = 0
    dq_buffer = 0
    _stage_ds(ds, ds_bufs.index(2 * SLICE))
    # the block whose dV, dK and dQ^T are pending
    dq_head = head
    dq_block = q_block
    head, q_block = _next_query_block(head, q_block, first_q_block, per_head, last_head)
    lse_log2, delta = _slice_statistics(head, q_block, batch, nheads, seqlen_q, Lse, Delta, BLOCK_M, s_layout)
    for _ in range(1, iterations):
        prev_stage = stage
        stage = gl.where(stage == NUM_STAGES - 1, 0, stage + 1)
        phase = gl.where(stage == 0, phase ^ 1, phase)
        # -- this block's S^T and dP^T, then the last block's dV and dK, in flight together --
        s, dp = _slice_scores(k_slice, v_slice, q_bufs, do_bufs, q_ready, do_ready, stage, phase, s, dp)
        dv = warpgroup_mma(p_op, do_bufs.index(prev_stage), dv, is_async=True)
        dk = warpgroup_mma(ds_op, q_bufs.index(prev_stage), dk, is_async=True)
        s, dp = warpgroup_mma_wait(num_outstanding=2, deps=(s, dp))
        next_p_op, next_ds_op, ds = _score_gradients(s, dp, q_block, lse_log2, delta, seqlen_q, seqlen_k,
                                                     slice_start, qk_scale_log2, dtype, BLOCK_M, CAUSAL, s_layout,
                                                     operand)
        # the other buffer was last read by the dQ^T waited on in the iteration before
        ds_buffer = ds_buffer ^ 1
        # this block's dQ^T goes to the buffer whose reduction was issued two blocks ago: the issuing thread waits
        # for it here, and _stage_ds's barrier holds every other thread until it has
        tma.store_wait(1)
        _stage_ds(ds, ds_bufs.index(2 * SLICE + ds_buffer))
        # the last block's dQ^T once S^T, dP^T and dS^T are spent: its 32 registers a thread are not live beside theirs
        dq = warpgroup_mma(k_slice_t, ds_bufs.index(2 * SLICE + (ds_buffer ^ 1)), dq_unused, use_acc=False,
                           is_async=True)
        next_head = head
        next_block = q_block
        head, q_block = _next_query_block(head, q_block, first_q_block, per_head, last_head)
        lse_log2, delta = _slice_statistics(head, q_block, batch, nheads, seqlen_q, Lse, Delta, BLOCK_M, s_layout)
        dv, dk, dq, p_op, ds_op = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk, dq, p_op, ds_op))
        mbarrier.arrive(stage_free.index(prev_stage), count=1)
        # the reduction reads its buffer while the next block's products run
        _add_dq(dq, dq_bufs.index(2 * SLICE + dq_buffer), dq_desc, batch, dq_head, dq_block, nheads, HEAD_DIM,
                BLOCK_M)
        dq_buffer = dq_buffer ^ 1
        dq_head = next_head
        dq_block = next_block
        p_op = next_p_op
        ds_op = next_ds_op
    prev_stage = stage
    # -- epilogue: the last block's dV, dK and dQ^T --
    dv = warpgroup_mma(p_op, do_bufs.index(prev_stage), dv, is_async=True)
    dk = warpgroup_mma(ds_op, q_bufs.index(prev_stage), dk, is_async=True)
    dq = warpgroup_mma(k_slice_t, ds_bufs.index(2 * SLICE + ds_buffer), dq_unused, use_acc=False, is_async=True)
    dv, dk, dq = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk, dq))
    mbarrier.arrive(stage_free.index(prev_stage), count=1)
    tma.store_wait(1)
    gl.thread_barrier()
    _add_dq(dq, dq_bufs.index(2 * SLICE + dq_buffer), dq_desc, batch, dq_head, dq_block, nheads, HEAD_DIM, BLOCK_M)
    _store_rows(dv, DV, batch, head_k, slice_start, seqlen_k, stride_gb, stride_gm, stride_gh, HEAD_DIM, SLICE_KEYS,
                acc_layout)
    _store_rows(dk * softmax_scale, DK, batch, head_k, slice_start, seqlen_k, stride_gb, stride_gm, stride_gh,
                HEAD_DIM, SLICE_KEYS, acc_layout)
    tma.store_wait(0)  # the shared memory stays the reductions' until they have read it


# seqlen_q is not specialized as a constant, as in dkdv_key_slices_kernel (Triton 3.6's lowering fails there)
@gluon.jit(do_not_specialize=["seqlen_q"])
def dkdv_dq_key_slices_kernel(
    q_desc, k_desc, v_desc, do_desc, Lse, Delta, DK, DV, dq_desc,
    stride_gb, stride_gm, stride_gh,
    seqlen_q, seqlen_k, nheads, nheads_k, key_blocks, softmax_scale, qk_scale_log2,
    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, NUM_STAGES: gl.constexpr, CAUSAL: gl.constexpr,
    CONSUMER_REGISTERS: gl.constexpr, LOADER_REGISTERS: gl.constexpr,
):
    """``dkdv_key_slices_kernel``'s dK and dV, and dQ^T / softmax_scale added into the float32 accumulator of
    ``dq_desc``: (batch * nheads * HEAD_DIM, seqlen_q) rows in [HEAD_DIM, BLOCK_M] blocks, zeroed by the caller."""
    BLOCK_N: gl.constexpr = KEY_SLICE_PROGRAM_KEYS
    group_size = nheads // nheads_k
    k_smem, v_smem, q_bufs, do_bufs, kv_ready, q_ready, do_ready, stage_free, _ = _streamed_buffers(
        q_desc, k_desc, v_desc, do_desc, HEAD_DIM, BLOCK_M, BLOCK_N, NUM_STAGES, True)
    # two dS^T buffers a consumer (consumer c's: 2c and 2c + 1), read only by its own dQ^T products
    ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([SLICE_KEYS, BLOCK_M], q_desc.dtype)
    ds_bufs = gl.allocate_shared_memory(q_desc.dtype, [4, SLICE_KEYS, BLOCK_M], ds_layout)
    # two dQ^T buffers a consumer, the same way, each read by a TMA reduction after the consumer's stores
    dq_bufs = gl.allocate_shared_memory(gl.float32, [4, HEAD_DIM, BLOCK_M], dq_desc.layout)

    gl.warp_specialize([
        (_fused_partition, (k_smem, v_smem, q_bufs, do_bufs, ds_bufs, dq_bufs, kv_ready, q_ready, do_ready,
                            stage_free, Lse, Delta, DK, DV, dq_desc, stride_gb, stride_gm, stride_gh, seqlen_q,
                            seqlen_k, nheads, nheads_k, key_blocks, group_size, softmax_scale, qk_scale_log2,
                            HEAD_DIM, BLOCK_M, BLOCK_N, NUM_STAGES, CAUSAL, 0)),
        (_fused_partition, (k_smem, v_smem, q_bufs, do_bufs, ds_bufs, dq_bufs, kv_ready, q_ready, do_ready,
                            stage_free, Lse, Delta, DK, DV, dq_desc, stride_gb, stride_gm, stride_gh, seqlen_q,
                            seqlen_k, nheads, nheads_k, key_blocks, group_size, softmax_scale, qk_scale_log2,
                            HEAD_DIM, BLOCK_M, BLOCK_N, NUM_STAGES, CAUSAL, 1)),
        (_load_partition, (q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, q_bufs, do_bufs, kv_ready, q_ready,
                           do_ready, stage_free, stage_free, seqlen_q, seqlen_k, nheads_k, key_blocks, group_size,
                           HEAD_DIM, BLOCK_M, BLOCK_N, NUM_STAGES, CAUSAL, True)),
    ], [4, 1], [CONSUMER_REGISTERS, LOADER_REGISTERS])


@triton.jit
def dq_from_accumulator(DQAcc, DQ, softmax_scale, seqlen_q, nheads, stride_acc,
                        HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    """DQ (batch, seqlen_q, nheads, HEAD_DIM), contiguous, = softmax_scale * the fused kernel's float32 dQ^T
    accumulator, (batch, nheads, HEAD_DIM, stride_acc) contiguous, rounded to DQ's type: BLOCK_M query rows of one
    (batch, head) a program."""
    batch_head = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, HEAD_DIM)
    mask = (rows < seqlen_q)[:, None]
    acc = tl.load(DQAcc + (batch_head.to(tl.int64) * HEAD_DIM + cols[None, :]) * stride_acc + rows[:, None],
                  mask=mask)
    batch = batch_head // nheads
    head = batch_head % nheads
    tokens = (batch.to(tl.int64) * seqlen_q + rows) * nheads + head
    tl.store(DQ + tokens[:, None] * HEAD_DIM + cols[None, :], (acc * softmax_scale).to(DQ.dtype.element_ty),
             mask=mask)
