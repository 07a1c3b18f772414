"""FP8 quantization of a (batch, seqlen, nheads, head_dim) 16-bit tensor (``fp8.quantize``), one program per (block
of SCALE_BLOCK rows, kv head, batch), in one pass or two:

- ``block_quantize_kernel``: block descales where the block's rotated rows, over the kv head's group of query heads,
  fit the program's registers: x read and rotated once, the amax taken, the descale written, the rows rounded;
- ``block_amax_kernel``: elsewhere (larger groups; per-head descales, whose amax spans the sequence), first the amax
  of the block's rows over the group, after the rotation;
- ``quantize_kernel``: then the same rows, rotated again, divided by their descale and rounded to e4m3.

In the two passes, recomputing the rotation costs a small matrix product a tile; keeping the rotated rows between
them would cost a float32 write and read of the whole tensor. A step loads ROWS rows of x once and rotates them COLS
columns at a time (x times COLS columns of S), so that neither S (128 KB at head dim 256) nor the rotated rows need
to sit in one thread's registers; v, not rotated, is taken whole rows at a time. The rotation is
``(x @ S) * col_scale``: S is the +-1 matrix diag(signs) H (block-diagonal over the Hadamard pieces, zero-padded to
BLOCK_D) in x's dtype, so its products are exact and only the float32 sums round; ``col_scale`` is 1 / sqrt(n) of
each column's piece. Under the interpreter (UPCAST), whose 16-bit dot is wrong, the tiles are widened to float32
first (exact), and e4m3's rounding is done by hand (``round_to_e4m3``: the interpreter's conversion is wrong where
rounding carries into the exponent).
"""

import triton
import triton.language as tl

from .forward_fp8 import round_to_e4m3


@triton.jit
def signed_hadamard_kernel(Signs, H, S, head_dim, BLOCK_D: tl.constexpr, ROWS: tl.constexpr):
    """S = diag(signs) H in S's dtype (exact: +-1 and 0), ROWS rows a program: H (BLOCK_D, BLOCK_D) float32 +-1,
    block-diagonal and zero-padded; signs past head_dim are 0. A kernel rather than a torch product, so that a
    quantizer's launch plan builds each call's S from its signs (``launch.plans`` replays kernels only)."""
    offs_r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    offs_d = tl.arange(0, BLOCK_D)
    signs = tl.load(Signs + offs_r, mask=offs_r < head_dim, other=0.0)
    h = tl.load(H + offs_r[:, None] * BLOCK_D + offs_d[None, :])
    tl.store(S + offs_r[:, None] * BLOCK_D + offs_d[None, :], (signs[:, None] * h).to(S.dtype.element_ty))


@triton.jit
def _row_tile(x_head, stride_xs, offs_r, seqlen, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """Rows ``offs_r`` of one head, (ROWS, BLOCK_D) in x's dtype, 0 past seqlen and HEAD_DIM."""
    offs_d = tl.arange(0, BLOCK_D)
    return tl.load(x_head + offs_r[:, None].to(tl.int64) * stride_xs + offs_d[None, :],
                   mask=(offs_r[:, None] < seqlen) & (offs_d[None, :] < HEAD_DIM), other=0.0)


@triton.jit
def _rotated_columns(x, S, ColScale, col0, BLOCK_D: tl.constexpr, COLS: tl.constexpr, UPCAST: tl.constexpr):
    """Columns [col0, col0 + COLS) of the rotated rows x @ S * col_scale, float32."""
    offs_d = tl.arange(0, BLOCK_D)
    offs_c = col0 + tl.arange(0, COLS)
    s = tl.load(S + offs_d[:, None] * BLOCK_D + offs_c[None, :])
    if UPCAST:
        y = tl.dot(x.to(tl.float32), s.to(tl.float32), input_precision="ieee")
    else:
        y = tl.dot(x, s)
    return y * tl.load(ColScale + offs_c)[None, :]


@triton.jit
def _store_e4m3(ptrs, y, descale, e4m3_max, keep, UPCAST: tl.constexpr):
    """y / descale, clamped to +-e4m3_max and rounded to e4m3, stored at ``ptrs`` where ``keep``; the stored values,
    float32. The division rounds as PyTorch's: 16-bit values over a descale such as amax / 448 often land next to an
    e4m3 midpoint, where the GPU's approximate division rounds to the other side."""
    scaled = tl.minimum(tl.maximum(tl.math.div_rn(y, descale), -e4m3_max), e4m3_max)
    if UPCAST:
        magnitude = round_to_e4m3(tl.abs(scaled))
        scaled = tl.where(scaled < 0, -magnitude, magnitude)
    rounded = scaled.to(ptrs.dtype.element_ty)
    tl.store(ptrs, rounded, mask=keep)
    return rounded.to(tl.float32)


@triton.jit
def _store_delta(Delta, delta_rows, rounded, descale, o_ptrs, keep, keep_r):
    """delta = rowsum(dequantized dO * O) of the rounded rows, the values dP = dO V^T sees, at ``delta_rows``."""
    o = tl.load(o_ptrs, mask=keep, other=0.0).to(tl.float32)
    tl.store(Delta + delta_rows, tl.sum(rounded * descale * o, axis=1), mask=keep_r)


@triton.jit
def _head_store_e4m3(out_head, stride_os, offs_r, offs_c, y, descale, e4m3_max, seqlen, HEAD_DIM: tl.constexpr,
                     UPCAST: tl.constexpr):
    """:func:`_store_e4m3` at rows offs_r and columns offs_c of one head; the stored values, float32."""
    keep = (offs_r[:, None] < seqlen) & (offs_c[None, :] < HEAD_DIM)
    return _store_e4m3(out_head + offs_r[:, None].to(tl.int64) * stride_os + offs_c[None, :], y, descale, e4m3_max,
                       keep, UPCAST)


@triton.jit
def block_amax_kernel(
    X, S, ColScale, Amax, seqlen, group_size, stride_xb, stride_xs, stride_xh, stride_ab, stride_ah, e4m3_max,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_ROWS: tl.constexpr, ROWS: tl.constexpr,
    COLS: tl.constexpr, ROTATE: tl.constexpr, UPCAST: tl.constexpr, DESCALE: tl.constexpr,
):
    """Amax (batch, nheads_k, blocks) float32: the largest |rotated x| of each BLOCK_ROWS rows of a kv head's group;
    with DESCALE the block's descale instead, amax / e4m3_max (1 for an all-zero block)."""
    block, head_k, batch = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    amax = 0.0
    for g in range(0, group_size):
        x_head = X + batch.to(tl.int64) * stride_xb + (head_k * group_size + g).to(tl.int64) * stride_xh
        for start in range(block * BLOCK_ROWS, block * BLOCK_ROWS + BLOCK_ROWS, ROWS):
            x = _row_tile(x_head, stride_xs, start + tl.arange(0, ROWS), seqlen, HEAD_DIM, BLOCK_D)
            if ROTATE:
                for col0 in tl.static_range(0, BLOCK_D, COLS):
                    y = _rotated_columns(x, S, ColScale, col0, BLOCK_D, COLS, UPCAST)
                    amax = tl.maximum(amax, tl.max(tl.abs(y)))
            else:
                amax = tl.maximum(amax, tl.max(tl.abs(x.to(tl.float32))))
    if DESCALE:
        amax = tl.where(amax > 0, tl.math.div_rn(amax, e4m3_max), 1.0)  # rounded as PyTorch divides
    tl.store(Amax + batch.to(tl.int64) * stride_ab + head_k * stride_ah + block, amax)


@triton.jit
def quantize_kernel(
    X, S, ColScale, Descale, Out, O, Delta, seqlen, group_size, stride_xb, stride_xs, stride_xh, stride_ob,
    stride_os, stride_oh, stride_db, stride_dh, stride_dblock, stride_Ob, stride_Os, stride_Oh, e4m3_max,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_ROWS: tl.constexpr, ROWS: tl.constexpr,
    COLS: tl.constexpr, ROTATE: tl.constexpr, UPCAST: tl.constexpr, DELTA: tl.constexpr,
):
    """Out e4m3 = rotated x / descale (clamped to +-e4m3_max); the descale of the block (stride_dblock 0: of the
    whole sequence). With DELTA (x = dO, not rotated) also Delta (batch, nheads, seqlen) contiguous float32 =
    rowsum(dequantized Out * O), O's strides (stride_Ob, stride_Os, stride_Oh, 1)."""
    block, head_k, batch = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    descale = tl.load(Descale + batch.to(tl.int64) * stride_db + head_k * stride_dh + block * stride_dblock)
    for g in range(0, group_size):
        head = (head_k * group_size + g).to(tl.int64)
        x_head = X + batch.to(tl.int64) * stride_xb + head * stride_xh
        out_head = Out + batch.to(tl.int64) * stride_ob + head * stride_oh
        for start in range(block * BLOCK_ROWS, block * BLOCK_ROWS + BLOCK_ROWS, ROWS):
            offs_r = start + tl.arange(0, ROWS)
            x = _row_tile(x_head, stride_xs, offs_r, seqlen, HEAD_DIM, BLOCK_D)
            if ROTATE:
                for col0 in tl.static_range(0, BLOCK_D, COLS):
                    y = _rotated_columns(x, S, ColScale, col0, BLOCK_D, COLS, UPCAST)
                    _head_store_e4m3(out_head, stride_os, offs_r, col0 + tl.arange(0, COLS), y, descale, e4m3_max,
                                     seqlen, HEAD_DIM, UPCAST)
            else:
                offs_d = tl.arange(0, BLOCK_D)
                rounded = _head_store_e4m3(out_head, stride_os, offs_r, offs_d, x.to(tl.float32), descale, e4m3_max,
                                           seqlen, HEAD_DIM, UPCAST)
                if DELTA:
                    o_ptrs = (O + batch.to(tl.int64) * stride_Ob + head * stride_Oh
                              + offs_r[:, None].to(tl.int64) * stride_Os + offs_d[None, :])
                    keep_r = offs_r < seqlen
                    _store_delta(Delta, (batch * tl.num_programs(1) * group_size + head).to(tl.int64) * seqlen
                                 + offs_r, rounded, descale, o_ptrs, keep_r[:, None] & (offs_d[None, :] < HEAD_DIM),
                                 keep_r)


@triton.jit
def _rotated_block(x_rows, keep_r, S, ColScale, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, DEPTH: tl.constexpr,
                   UPCAST: tl.constexpr):
    """The rows at ``x_rows`` (a pointer a row; ``keep_r``: rows in the sequence) rotated, x @ S * col_scale, float32.
    DEPTH of x's columns and S's rows a step: S's shared-memory tile is DEPTH rows, not all of S (128 KB at head dim
    256), and each step's products go into the one accumulator in the order of a single product over all of them."""
    offs_k = tl.arange(0, DEPTH)
    offs_d = tl.arange(0, BLOCK_D)
    y = tl.zeros((x_rows.shape[0], BLOCK_D), dtype=tl.float32)
    for k0 in range(0, BLOCK_D, DEPTH):  # pipelined on the launch's num_stages
        x = tl.load(x_rows[:, None] + (k0 + offs_k)[None, :],
                    mask=keep_r[:, None] & ((k0 + offs_k)[None, :] < HEAD_DIM), other=0.0)
        s = tl.load(S + (k0 + offs_k)[:, None] * BLOCK_D + offs_d[None, :])
        if UPCAST:
            y = tl.dot(x.to(tl.float32), s.to(tl.float32), y, input_precision="ieee")
        else:
            y = tl.dot(x, s, y)
    return y * tl.load(ColScale + offs_d)[None, :]


@triton.jit
def block_quantize_kernel(
    X, S, ColScale, Descale, Out, O, Delta, seqlen, stride_xb, stride_xs, stride_xh, stride_ob, stride_os,
    stride_oh, stride_db, stride_dh, stride_Ob, stride_Os, stride_Oh, e4m3_max,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_ROWS: tl.constexpr, GROUP: tl.constexpr,
    TILE_ROWS: tl.constexpr, DEPTH: tl.constexpr, ROTATE: tl.constexpr, UPCAST: tl.constexpr, DELTA: tl.constexpr,
):
    """Both passes in one: the BLOCK_ROWS rows of a kv head's GROUP query heads, read and rotated once and kept in
    registers while their amax is taken; then the block's descale (amax / e4m3_max, 1 for an all-zero block) and
    Out e4m3 = rotated x / descale, as the two kernels write them. TILE_ROWS: BLOCK_ROWS * GROUP rounded up to a
    power of two. With DELTA (x = dO, not rotated) also Delta as ``quantize_kernel`` writes it."""
    block, head_k, batch = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    # a tile row is a (position, head) pair, the group's heads of a position next to each other as x holds them:
    # one product rotates every head of the group
    offs_t = tl.arange(0, TILE_ROWS)
    offs_r = block * BLOCK_ROWS + offs_t // GROUP
    heads = (head_k * GROUP + offs_t % GROUP).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    keep_r = (offs_r < seqlen) & (offs_t < BLOCK_ROWS * GROUP)
    x_rows = X + batch.to(tl.int64) * stride_xb + offs_r.to(tl.int64) * stride_xs + heads * stride_xh
    if ROTATE:
        y = _rotated_block(x_rows, keep_r, S, ColScale, HEAD_DIM, BLOCK_D, DEPTH, UPCAST)
    else:
        keep = keep_r[:, None] & (offs_d[None, :] < HEAD_DIM)
        y = tl.load(x_rows[:, None] + offs_d[None, :], mask=keep, other=0.0).to(tl.float32)
    amax = tl.max(tl.max(tl.abs(y), axis=1), axis=0)
    descale = tl.where(amax > 0, tl.math.div_rn(amax, e4m3_max), 1.0)  # rounded as PyTorch divides
    tl.store(Descale + batch.to(tl.int64) * stride_db + head_k * stride_dh + block, descale)
    out_rows = Out + batch.to(tl.int64) * stride_ob + offs_r.to(tl.int64) * stride_os + heads * stride_oh
    keep = keep_r[:, None] & (offs_d[None, :] < HEAD_DIM)
    rounded = _store_e4m3(out_rows[:, None] + offs_d[None, :], y, descale, e4m3_max, keep, UPCAST)
    if DELTA:
        o_rows = O + batch.to(tl.int64) * stride_Ob + offs_r.to(tl.int64) * stride_Os + heads * stride_Oh
        delta_rows = (batch * tl.num_programs(1) * GROUP + heads) * seqlen + offs_r
        _store_delta(Delta, delta_rows, rounded, descale, o_rows[:, None] + offs_d[None, :], keep, keep_r)
