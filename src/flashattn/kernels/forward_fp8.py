"""FP8 forward kernel: e4m3 Q, K, V with float32 descales, bfloat16 out; one program per (query block, batch x head).

The same online softmax in base 2 as ``forward.py``, with both products on e4m3 operands and float32 accumulators:

- S = Q K^T on the raw e4m3 tiles, then times the descales: one scalar (q_descale * k_descale, folded into the
  softmax scale) per (batch, kv head), or with PER_BLOCK a row vector of q descales (a query row's block, the
  softmax scale folded in) times the key block's one k descale (BLOCK_N divides SCALE_BLOCK).
- P = exp2(S - running max) lies in [0, 1]; P * P_SCALE is rounded to e4m3 for P V (the row sum takes the unrounded
  P). Each key block lies inside one SCALE_BLOCK of V (the launcher's BLOCK_N divides SCALE_BLOCK), so with
  PER_BLOCK the block's P V product takes its v descale before it joins the accumulator; otherwise v_descale and
  1 / P_SCALE wait for the epilogue.
- Hopper's FP8 wgmma reads its second operand K-major only: for P V that is V^T, keys contiguous. The launcher
  passes VT, a (batch, kv head, head dim, keys) copy of V, whose tile loads as (BLOCK_D, BLOCK_N) and enters
  the dot as ``tl.trans`` of it, as Triton's fused-attention tutorial does for fp8.

ROUND_P_BY_HAND: Triton's interpreter converts float32 to e4m3 wrongly where rounding carries into the exponent
(125.3 -> 64); the interpreter build rounds P with integer arithmetic first, so the conversion after it is exact.
"""

import triton
import triton.language as tl

from .common import LOG2E, key_block_bounds, sequence_bounds, stage_range, tanh, visible


@triton.jit
def round_to_e4m3(x):
    """Non-negative float32 x <= 448 rounded to the nearest e4m3 value (ties to even), kept in float32."""
    bits = x.to(tl.int32, bitcast=True)
    # normal e4m3 keeps 3 of float32's 23 mantissa bits: round the 20 dropped ones to nearest even
    bits = (bits + 0x7FFFF + ((bits >> 20) & 1)) & ~0xFFFFF
    normal = bits.to(tl.float32, bitcast=True)
    steps = x * 512.0  # below 2^-6 the step is 2^-9: round to the nearest step, ties to even
    floor = tl.floor(steps)
    rest = steps - floor
    subnormal = (floor + tl.where((rest > 0.5) | ((rest == 0.5) & (floor % 2 == 1)), 1.0, 0.0)) / 512.0
    return tl.where(x < 0.015625, subnormal, normal)


@triton.jit
def _fp8_block_range(
    acc, row_sum, row_max, q, q_scale, k_base, vt_base, stride_kn, stride_vtd, k_descale_row, v_descale_row,
    stride_kds, stride_vds, lo, hi, offs_m, seqlen_q, seqlen_k, qk_scale, softcap_log2, window_left, window_right,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
    WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, PER_BLOCK: tl.constexpr,
    SCALE_BLOCK: tl.constexpr, P_SCALE: tl.constexpr, ROUND_P_BY_HAND: tl.constexpr,
):
    offs_d = tl.arange(0, BLOCK_D)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kt_ptrs = k_base + offs_n[None, :].to(tl.int64) * stride_kn + offs_d[:, None]
        vt_ptrs = vt_base + offs_d[:, None].to(tl.int64) * stride_vtd + offs_n[None, :]
        if MASKED:
            key_ok = offs_n[None, :] < seqlen_k
            if BLOCK_D != HEAD_DIM:
                key_ok = key_ok & (offs_d[:, None] < HEAD_DIM)
            kt = tl.load(kt_ptrs, mask=key_ok, other=0.0)
            vt = tl.load(vt_ptrs, mask=key_ok, other=0.0)
        elif BLOCK_D != HEAD_DIM:
            kt = tl.load(kt_ptrs, mask=offs_d[:, None] < HEAD_DIM, other=0.0)
            vt = tl.load(vt_ptrs, mask=offs_d[:, None] < HEAD_DIM, other=0.0)
        else:
            kt = tl.load(kt_ptrs)
            vt = tl.load(vt_ptrs)
        # -- S on e4m3 operands, float32 accumulate; the descales after --
        qk = tl.dot(q, kt)
        if PER_BLOCK:  # the key block lies in one SCALE_BLOCK: one k descale, and q_scale holds qk_scale already
            qk = qk * (q_scale * tl.load(k_descale_row + (start_n // SCALE_BLOCK) * stride_kds))[:, None]
        else:
            qk = qk * qk_scale
        if HAS_SOFTCAP:
            s = tanh(qk) * softcap_log2
        else:
            s = qk
        if MASKED:
            seen = visible(offs_m, offs_n, seqlen_q, seqlen_k, window_left, window_right, WINDOW_LEFT, WINDOW_RIGHT)
            s = tl.where(seen, s, float("-inf"))
        # -- online softmax --
        new_max = tl.maximum(row_max, tl.max(s, 1))
        if MASKED:
            shift = tl.where(new_max == float("-inf"), 0.0, new_max)  # a row with nothing seen yet
        else:
            shift = new_max
        p = tl.math.exp2(s - shift[:, None])
        correction = tl.math.exp2(row_max - shift)
        row_sum = row_sum * correction + tl.sum(p, 1)
        # -- P V on e4m3 operands: P scaled into e4m3's range, V^T's tile transposed into place --
        p = p * P_SCALE
        if ROUND_P_BY_HAND:
            p = round_to_e4m3(p)
        pv = tl.dot(p.to(tl.float8e4nv), tl.trans(vt))
        if PER_BLOCK:
            pv = pv * tl.load(v_descale_row + (start_n // SCALE_BLOCK) * stride_vds)
        acc = acc * correction[:, None] + pv
        row_max = new_max
    return acc, row_sum, row_max


@triton.jit
def attention_forward_fp8_kernel(
    Q, K, VT, Out, Lse, CuSeqlensQ, CuSeqlensK, QDescale, KDescale, VDescale,
    stride_qb, stride_qm, stride_qh, stride_kb, stride_kn, stride_kh, stride_vtb, stride_vth, stride_vtd,
    stride_ob, stride_om, stride_oh,
    stride_qds_b, stride_qds_h, stride_qds_blk, stride_kds_b, stride_kds_h, stride_kds_blk,
    stride_vds_b, stride_vds_h, stride_vds_blk,
    seqlen_q, seqlen_k, nheads, group_size, qk_scale, softcap_log2, window_left, window_right,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, IS_VARLEN: tl.constexpr,
    PER_BLOCK: tl.constexpr, SCALE_BLOCK: tl.constexpr, P_SCALE: tl.constexpr, ROUND_P_BY_HAND: tl.constexpr,
):
    """Dense: seqlen_q/seqlen_k are the lengths, Lse is (batch, nheads, seqlen_q). Varlen: they are the packed
    totals, the batch strides unused (VT's batch stride steps nothing: VT is (kv head, head dim, total_k)), Lse is
    (nheads, total_q). The descales are (batch, kv head, block) with a block stride of 0 where there is one block.
    ``qk_scale``: softmax_scale * log2(e) (/ softcap with a softcap), without the descales."""
    if WINDOW_RIGHT:
        # the causal diagonal's last query blocks see the most keys: launched first
        start_m = (tl.num_programs(0) - 1 - tl.program_id(0)) * BLOCK_M
    else:
        start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    batch = bh // nheads
    head = bh % nheads
    head_k = head // group_size
    if IS_VARLEN:
        total_q = seqlen_q
        q_start, seqlen_q, k_start, seqlen_k = sequence_bounds(CuSeqlensQ, CuSeqlensK, batch, total_q, seqlen_k,
                                                              True)
        if start_m >= seqlen_q:
            return
        q_base = Q + q_start.to(tl.int64) * stride_qm + head.to(tl.int64) * stride_qh
        k_base = K + k_start.to(tl.int64) * stride_kn + head_k.to(tl.int64) * stride_kh
        vt_base = VT + head_k.to(tl.int64) * stride_vth + k_start
        o_base = Out + q_start.to(tl.int64) * stride_om + head.to(tl.int64) * stride_oh
        lse_base = Lse + head.to(tl.int64) * total_q + q_start
    else:
        q_base = Q + batch.to(tl.int64) * stride_qb + head.to(tl.int64) * stride_qh
        k_base = K + batch.to(tl.int64) * stride_kb + head_k.to(tl.int64) * stride_kh
        vt_base = VT + batch.to(tl.int64) * stride_vtb + head_k.to(tl.int64) * stride_vth
        o_base = Out + batch.to(tl.int64) * stride_ob + head.to(tl.int64) * stride_oh
        lse_base = Lse + bh.to(tl.int64) * seqlen_q
    q_descale_row = QDescale + batch * stride_qds_b + head_k * stride_qds_h
    k_descale_row = KDescale + batch * stride_kds_b + head_k * stride_kds_h
    v_descale_row = VDescale + batch * stride_vds_b + head_k * stride_vds_h

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m[:, None] < seqlen_q
    if BLOCK_D != HEAD_DIM:
        row_ok = row_ok & (offs_d[None, :] < HEAD_DIM)
    q = tl.load(q_base + offs_m[:, None].to(tl.int64) * stride_qm + offs_d[None, :], mask=row_ok, other=0.0)
    if PER_BLOCK:
        q_scale = qk_scale * tl.load(q_descale_row + (offs_m // SCALE_BLOCK) * stride_qds_blk,
                                     mask=offs_m < seqlen_q, other=1.0)
        v_scale = 1.0
    else:
        q_scale = tl.zeros([BLOCK_M], dtype=tl.float32)  # unused: the descales join qk_scale
        qk_scale = qk_scale * tl.load(q_descale_row) * tl.load(k_descale_row)
        v_scale = tl.load(v_descale_row)

    row_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    lo, full_lo, full_hi, hi = key_block_bounds(start_m, seqlen_q, seqlen_k, window_left, window_right,
                                                BLOCK_M, BLOCK_N, WINDOW_LEFT, WINDOW_RIGHT)
    for stage in tl.static_range(3):
        start, end = stage_range(stage, lo, full_lo, full_hi, hi)
        acc, row_sum, row_max = _fp8_block_range(
            acc, row_sum, row_max, q, q_scale, k_base, vt_base, stride_kn, stride_vtd, k_descale_row, v_descale_row,
            stride_kds_blk, stride_vds_blk, start, end, offs_m, seqlen_q, seqlen_k, qk_scale, softcap_log2,
            window_left, window_right, HEAD_DIM, BLOCK_D, BLOCK_N, stage != 1, WINDOW_LEFT, WINDOW_RIGHT,
            HAS_SOFTCAP, PER_BLOCK, SCALE_BLOCK, P_SCALE, ROUND_P_BY_HAND)

    # -- epilogue: a row that saw no key gives 0 and lse = +inf --
    empty = row_sum == 0.0
    row_sum = tl.where(empty, 1.0, row_sum)
    out = acc * (v_scale / P_SCALE) / row_sum[:, None]
    lse = tl.where(empty, float("inf"), (row_max + tl.math.log2(row_sum)) / LOG2E)
    tl.store(lse_base + offs_m, lse, mask=offs_m < seqlen_q)
    tl.store(o_base + offs_m[:, None].to(tl.int64) * stride_om + offs_d[None, :], out.to(Out.dtype.element_ty),
             mask=row_ok)
