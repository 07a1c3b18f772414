"""V^T for the FP8 forwards (``launch.forward_fp8``): Hopper's FP8 wgmma reads P V's second operand K-major only, so
the kernels take V with its keys contiguous, (head_dim, keys) per batch and kv head.

One program copies BLOCK_N key positions of one (batch, kv head): it gathers the keys' rows (each row head_dim
contiguous bytes), transposes the tile in registers and writes BLOCK_N contiguous bytes per head-dim row. With
``PERMUTE`` (the Gluon kernel's layout) position k of each 32 holds key 16 k4 + 8 k1 + 4 k3 + 2 k2 + k0, the order of
the kernel's P operand (``forward_fp8_hopper._p_operand``). With ``PAIRS`` (the fused FP8 backward's K^T) position p of
each 16 holds key 8 p0 + (p >> 1 & 7): keys g and g + 8 side by side, the byte pairs in which that kernel stores dS
(``backward_fp8_fused_hopper._store_ds_pairs``); keys past ``seqlen`` are written as zeros, so the
padding up to the output's width takes no separate pass. V and VT come in their own dtype (e4m3), and the
kernel copies their bytes as uint8: a copy needs no float8 arithmetic (the interpreter has none), and the launch
passes the tensors themselves, which a launch plan can slot (``launch.plans``), not dtype views of them.
"""

import triton
import triton.language as tl


@triton.jit
def transpose_v_kernel(
    V, VT, seqlen, width, stride_vb, stride_vs, stride_vh, stride_vd, stride_tb, stride_th, stride_td,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, PERMUTE: tl.constexpr,
    PAIRS: tl.constexpr = False,
):
    """VT[b, h, d, p] = V[b, key(p), h, d] for p < ``width`` (0 where key(p) >= seqlen)."""
    V, VT = V.to(tl.pointer_type(tl.uint8)), VT.to(tl.pointer_type(tl.uint8))  # bytes: no float8 arithmetic
    block, head, batch = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    pos = block * BLOCK_N + tl.arange(0, BLOCK_N)
    if PERMUTE:
        low = pos % 32
        key = pos - low + (low & 16) + ((low & 2) << 2) + ((low & 8) >> 1) + ((low & 4) >> 1) + (low & 1)
    elif PAIRS:
        low = pos % 16
        key = pos - low + ((low & 1) << 3) + (low >> 1)
    else:
        key = pos
    offs_d = tl.arange(0, BLOCK_D)
    v_head = V + batch.to(tl.int64) * stride_vb + head.to(tl.int64) * stride_vh
    tile = tl.load(v_head + key[:, None].to(tl.int64) * stride_vs + offs_d[None, :] * stride_vd,
                   mask=(key[:, None] < seqlen) & (offs_d[None, :] < HEAD_DIM), other=0)
    vt_head = VT + batch.to(tl.int64) * stride_tb + head.to(tl.int64) * stride_th
    tl.store(vt_head + offs_d[:, None].to(tl.int64) * stride_td + pos[None, :], tl.trans(tile),
             mask=(offs_d[:, None] < HEAD_DIM) & (pos[None, :] < width))
