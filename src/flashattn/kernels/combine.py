"""Merging attention results over disjoint key sets, and its gradient.

Split s saw keys K_s and produced a normalized output o_s with log-sum-exp l_s. Over the union of the
key sets the log-sum-exp is L = log sum_s exp(l_s) and the output is out = sum_s w_s o_s with weights
w_s = exp(l_s - L). A split that saw no key carries l_s = +inf (flashattn's convention for an empty
row) or -inf (the mathematical one): both get weight 0, and whatever its o_s holds is never read into
the sum. When every split is empty the row gives out = 0 and L = +inf, as an empty row does elsewhere.

Gradient, with g = dL/dout and gL = dLoss/dL:  dLoss/do_s = w_s g and
dLoss/dl_s = w_s (g . o_s - g . out + gL), where g . out = sum_t w_t (g . o_t).

The forward's programs each take (a block of (token, head) rows, a batch element, a chunk of head-dim
columns) and load SPLIT_BLOCK splits' partial tiles at once. The backward's take whole rows and, since
they write a gradient per split, step split by split.
"""

import triton
import triton.language as tl

from .common import LOG2E, chain_launch, divide_rows


@triton.jit
def _finite_lse(lse):
    """Both infinities mark an empty split: map them to -inf, whose weight is exp(-inf) = 0."""
    return tl.where(lse == float("inf"), float("-inf"), lse)


@triton.jit
def _split_tile(splits, num_splits, row_ok):
    """Which (split, row) entries of a tile of SPLIT_BLOCK splits x BLOCK_M rows exist."""
    return (splits[:, None] < num_splits) & row_ok[None, :]


@triton.jit
def _merged_lse(LsePartial, lse_offsets, row_ok, stride_lps, num_splits,
                BLOCK_M: tl.constexpr, SPLIT_BLOCK: tl.constexpr):
    """(shift, total): max of the finite partial lse (0 if none) and sum_s exp(l_s - shift).

    SPLIT_BLOCK splits are loaded at once and merged into a running (max, sum): a decode step's
    splits usually fit one step, where a loop over single splits waited on one load after another.
    """
    offs_s = tl.arange(0, SPLIT_BLOCK)
    lse_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    total = tl.zeros([BLOCK_M], dtype=tl.float32)
    for start in range(0, num_splits, SPLIT_BLOCK):
        splits = start + offs_s
        lse = tl.load(LsePartial + splits[:, None].to(tl.int64) * stride_lps + lse_offsets[None, :],
                      mask=_split_tile(splits, num_splits, row_ok), other=float("-inf"))
        lse = _finite_lse(lse.to(tl.float32))
        new_max = tl.maximum(lse_max, tl.max(lse, 0))
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)
        total = total * tl.math.exp2((lse_max - shift) * LOG2E) \
            + tl.sum(tl.math.exp2((lse - shift[None, :]) * LOG2E), 0)
        lse_max = new_max
    return tl.where(lse_max == float("-inf"), 0.0, lse_max), total


@triton.jit
def _row_offsets(offs_r, batch, nheads, stride_b, stride_m, stride_h):
    token = offs_r // nheads
    head = offs_r % nheads
    return batch.to(tl.int64) * stride_b + token.to(tl.int64) * stride_m + head.to(tl.int64) * stride_h


@triton.jit
def combine_kernel(
    OutPartial, LsePartial, Out, Lse,
    stride_ops, stride_opb, stride_opm, stride_oph,
    stride_lps, stride_lpb, stride_lph, stride_lpm,
    stride_ob, stride_om, stride_oh,
    stride_lb, stride_lh, stride_lm,
    num_splits, seqlen, nheads,
    HEAD_DIM: tl.constexpr, CHUNK_D: tl.constexpr, BLOCK_M: tl.constexpr, SPLIT_BLOCK: tl.constexpr,
    ROUND_TO_NEAREST: tl.constexpr, CHAINED: tl.constexpr = False,
):
    """out[b, m, h] = sum_s w_s out_partial[s, b, m, h]; lse[b, h, m] = log sum_s exp(lse_partial[s, b, h, m]).

    Program (i, b, c) merges rows i * BLOCK_M... of batch element b, head-dim columns c * CHUNK_D...;
    each column chunk recomputes the rows' merged lse (a few loads), and chunk 0 stores it. CHAINED:
    launched with programmatic dependent launch (see ``common.chain_launch``).
    """
    chain_launch(CHAINED)
    batch = tl.program_id(1)
    chunk = tl.program_id(2)
    offs_r = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # row r = token * nheads + head
    offs_d = chunk * CHUNK_D + tl.arange(0, CHUNK_D)
    row_ok = offs_r < seqlen * nheads
    tile_ok = row_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
    lse_offsets = _row_offsets(offs_r, batch, nheads, stride_lpb, stride_lpm, stride_lph)
    out_offsets = _row_offsets(offs_r, batch, nheads, stride_opb, stride_opm, stride_oph)[:, None] + offs_d[None, :]

    shift, total = _merged_lse(LsePartial, lse_offsets, row_ok, stride_lps, num_splits, BLOCK_M, SPLIT_BLOCK)
    acc = tl.zeros([BLOCK_M, CHUNK_D], dtype=tl.float32)
    offs_s = tl.arange(0, SPLIT_BLOCK)
    for start in range(0, num_splits, SPLIT_BLOCK):  # SPLIT_BLOCK partial tiles in flight per step
        splits = start + offs_s
        split_offsets = splits.to(tl.int64)
        lse = tl.load(LsePartial + split_offsets[:, None] * stride_lps + lse_offsets[None, :],
                      mask=_split_tile(splits, num_splits, row_ok), other=float("-inf"))
        weight = tl.math.exp2((_finite_lse(lse.to(tl.float32)) - shift[None, :]) * LOG2E)[:, :, None]
        partial = tl.load(OutPartial + split_offsets[:, None, None] * stride_ops + out_offsets[None, :, :],
                          mask=(splits < num_splits)[:, None, None] & tile_ok[None, :, :], other=0.0)
        # an empty split's output may hold anything: weight 0 must not meet a NaN there
        acc += tl.sum(weight * tl.where(weight > 0.0, partial.to(tl.float32), 0.0), 0)

    empty = total == 0.0
    out = divide_rows(acc, tl.where(empty, 1.0, total), ROUND_TO_NEAREST)
    lse = tl.where(empty, float("inf"), shift + tl.math.log2(tl.where(empty, 1.0, total)) / LOG2E)
    tl.store(Lse + _row_offsets(offs_r, batch, nheads, stride_lb, stride_lm, stride_lh), lse,
             mask=row_ok & (chunk == 0))
    out_ptrs = Out + _row_offsets(offs_r, batch, nheads, stride_ob, stride_om, stride_oh)[:, None] + offs_d[None, :]
    tl.store(out_ptrs, out.to(Out.dtype.element_ty), mask=tile_ok)


@triton.jit
def combine_backward_kernel(
    DOut, DLse, OutPartial, LsePartial, DOutPartial, DLsePartial,
    stride_dob, stride_dom, stride_doh,
    stride_dlb, stride_dlh, stride_dlm,
    stride_ops, stride_opb, stride_opm, stride_oph,
    stride_lps, stride_lpb, stride_lph, stride_lpm,
    stride_dops, stride_dopb, stride_dopm, stride_doph,
    stride_dlps, stride_dlpb, stride_dlph, stride_dlpm,
    num_splits, seqlen, nheads,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, SPLIT_BLOCK: tl.constexpr,
):
    """d out_partial[s] = w_s dout; d lse_partial[s] = w_s (dout . o_s - dout . out + dlse)."""
    batch = tl.program_id(1)
    offs_r = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_r < seqlen * nheads
    tile_ok = row_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
    lse_offsets = _row_offsets(offs_r, batch, nheads, stride_lpb, stride_lpm, stride_lph)
    out_offsets = _row_offsets(offs_r, batch, nheads, stride_opb, stride_opm, stride_oph)[:, None] + offs_d[None, :]
    dlse_offsets = _row_offsets(offs_r, batch, nheads, stride_dlpb, stride_dlpm, stride_dlph)
    dout_offsets = _row_offsets(offs_r, batch, nheads, stride_dopb, stride_dopm, stride_doph)[:, None] \
        + offs_d[None, :]

    dout_rows = _row_offsets(offs_r, batch, nheads, stride_dob, stride_dom, stride_doh)
    dout = tl.load(DOut + dout_rows[:, None] + offs_d[None, :], mask=tile_ok, other=0.0).to(tl.float32)
    dlse = tl.load(DLse + _row_offsets(offs_r, batch, nheads, stride_dlb, stride_dlm, stride_dlh),
                   mask=row_ok, other=0.0).to(tl.float32)
    shift, total = _merged_lse(LsePartial, lse_offsets, row_ok, stride_lps, num_splits, BLOCK_M, SPLIT_BLOCK)
    # w_s = exp(l_s - L) as 2^((l_s - shift) log2 e - log2 total): the exponent is built from small terms.
    # Forming L first (shift + log total, as large as the l_s) rounds l_s - L at L's magnitude: the
    # float32 gradients then came out at 4.5x PyTorch's error on the GPU
    log2_total = tl.math.log2(tl.where(total == 0.0, 1.0, total))

    # pass 1: d out_partial, and dout . o_s parked in d lse_partial; their weighted sum is dout . out
    dout_dot_out = tl.zeros([BLOCK_M], dtype=tl.float32)
    lse_ptrs = LsePartial + lse_offsets
    out_ptrs = OutPartial + out_offsets
    dout_partial_ptrs = DOutPartial + dout_offsets
    dlse_partial_ptrs = DLsePartial + dlse_offsets
    for _ in range(num_splits):
        lse = tl.load(lse_ptrs, mask=row_ok, other=float("-inf"))
        weight = tl.math.exp2((_finite_lse(lse.to(tl.float32)) - shift) * LOG2E - log2_total)
        partial = tl.load(out_ptrs, mask=tile_ok, other=0.0).to(tl.float32)
        dot_s = tl.sum(dout * tl.where(weight[:, None] > 0.0, partial, 0.0), 1)
        dout_dot_out += weight * dot_s
        tl.store(dout_partial_ptrs, (weight[:, None] * dout).to(DOutPartial.dtype.element_ty), mask=tile_ok)
        tl.store(dlse_partial_ptrs, dot_s.to(DLsePartial.dtype.element_ty), mask=row_ok)
        lse_ptrs += stride_lps
        out_ptrs += stride_ops
        dout_partial_ptrs += stride_dops
        dlse_partial_ptrs += stride_dlps
    # pass 2: d lse_partial from the parked dot products (each program reads back only what it wrote)
    lse_ptrs = LsePartial + lse_offsets
    dlse_partial_ptrs = DLsePartial + dlse_offsets
    for _ in range(num_splits):
        lse = tl.load(lse_ptrs, mask=row_ok, other=float("-inf"))
        weight = tl.math.exp2((_finite_lse(lse.to(tl.float32)) - shift) * LOG2E - log2_total)
        dot_s = tl.load(dlse_partial_ptrs, mask=row_ok, other=0.0).to(tl.float32)
        grad = tl.where(weight > 0.0, weight * (dot_s - dout_dot_out + dlse), 0.0)
        tl.store(dlse_partial_ptrs, grad.to(DLsePartial.dtype.element_ty), mask=row_ok)
        lse_ptrs += stride_lps
        dlse_partial_ptrs += stride_dlps
