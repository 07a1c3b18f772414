"""The FP8 backward's passes around its main kernels (``launch/backward_fp8.py``), each a Triton kernel so that a
launch plan can record the whole backward (``launch.plans``: a replay runs kernels only):

- ``e4m3_to_float16_kernel``: the float16 copies of e4m3 q, dO, k and v that the score products read (exact: every
  e4m3 value is a float16 one). The conversion is done on the bits, e4m3's exponent and fraction moved into
  float16's and the result scaled by 2^8, so that it runs the same under the interpreter, which has no float8
  arithmetic; e4m3 subnormals land on float16 subnormals of the same fraction, which the scale makes normal.
- ``descale_blocks_kernel``: one descale tensor as (batch, nheads_k, blocks) contiguous, ones past its own blocks and
  a per-head descale repeated: the main kernels index q's, k's, v's and dO's descales with one set of strides.
- ``rotate_back_kernel``: float32 dQ or dK taken back to the inputs' basis, dx = (dx_rot @ S^T) * col_scale for the
  rotation x_rot = (x @ S) * col_scale of the quantizer (S = diag(signs) H, +-1), and rounded to the gradient's
  dtype in the same pass. The product splits dx_rot into three bfloat16 parts, hi = bf16(x), mid = bf16(x - hi) and
  lo = bf16(x - hi - mid), each difference exact in float32, which together hold all 24 of float32's fraction bits;
  S's +-1 make the three products exact and only the float32 sums round, as in a float32 product. Three bfloat16
  products take half the time of tf32x3's three tf32 ones (tf32 runs at half the rate). Under the interpreter, whose
  16-bit dot is wrong, one float32 product instead.
"""

import triton
import triton.language as tl


@triton.jit
def e4m3_to_float16_kernel(X, Y, numel, BLOCK: tl.constexpr):
    """Y float16 = X e4m3 over ``numel`` contiguous elements."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    keep = offs < numel
    bits = tl.load(X.to(tl.pointer_type(tl.uint8)) + offs, mask=keep, other=0).to(tl.uint16)
    # sign to bit 15; exponent and fraction (7 bits) to bits 13..7: float16's value of them is e4m3's times 2^-8
    half = ((bits & 0x80) << 8) | ((bits & 0x7F) << 7)
    value = half.to(tl.float16, bitcast=True) * 256.0
    tl.store(Y + offs, value, mask=keep)


@triton.jit
def descale_blocks_kernel(D, Out, count, blocks, stride_b, stride_h, stride_blk, BLOCK: tl.constexpr):
    """Out[b, h, i] = D[b, h, i] for i < count, 1 past it; stride_blk 0 for a per-head descale (count = blocks)."""
    batch, head = tl.program_id(1), tl.program_id(0)
    src = D + batch.to(tl.int64) * stride_b + head * stride_h
    dst = Out + (batch.to(tl.int64) * tl.num_programs(0) + head) * blocks
    for start in range(0, blocks, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        value = tl.load(src + offs * stride_blk, mask=offs < count, other=1.0)
        tl.store(dst + offs, value, mask=offs < blocks)


@triton.jit
def rotate_back_kernel(X, S, ColScale, Y, rows, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                       BLOCK_R: tl.constexpr, TILES: tl.constexpr, ROTATE: tl.constexpr, UPCAST: tl.constexpr):
    """Y (rows, HEAD_DIM) in its dtype = X (rows, HEAD_DIM) float32 times S^T (S: (BLOCK_D, BLOCK_D) +-1 in bfloat16,
    zero-padded), times col_scale; without ROTATE, X rounded to Y's dtype. Both contiguous. A program takes TILES
    tiles of BLOCK_R rows, S read once for them."""
    offs_d = tl.arange(0, BLOCK_D)
    if ROTATE:
        s_t = tl.trans(tl.load(S + offs_d[:, None] * BLOCK_D + offs_d[None, :]))
        col_scale = tl.load(ColScale + offs_d)
    for tile in range(0, TILES):
        offs_r = (tl.program_id(0).to(tl.int64) * TILES + tile) * BLOCK_R + tl.arange(0, BLOCK_R)
        keep = (offs_r[:, None] < rows) & (offs_d[None, :] < HEAD_DIM)
        x = tl.load(X + offs_r[:, None] * HEAD_DIM + offs_d[None, :], mask=keep, other=0.0)
        if ROTATE:
            if UPCAST:
                y = tl.dot(x, s_t.to(tl.float32), input_precision="ieee")
            else:
                hi = x.to(tl.bfloat16)
                rest = x - hi.to(tl.float32)
                mid = rest.to(tl.bfloat16)
                lo = (rest - mid.to(tl.float32)).to(tl.bfloat16)
                y = tl.dot(hi, s_t, tl.dot(mid, s_t, tl.dot(lo, s_t)))  # the smallest parts first
            x = y * col_scale[None, :]
        tl.store(Y + offs_r[:, None] * HEAD_DIM + offs_d[None, :], x.to(Y.dtype.element_ty), mask=keep)
