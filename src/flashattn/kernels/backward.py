"""Backward kernels, FA2 style and free of atomics (so always deterministic).

1. ``delta_kernel``: delta = rowsum(dO * O), one float per query row.
2. ``dkdv_kernel``: one program per (block of keys, batch x kv head). It walks every query head of
   the GQA group and every query block that sees these keys, recomputes P from the saved
   log-sum-exp and accumulates dK and dV in registers; the group's sum is done in the program.
3. ``dq_kernel``: one program per (block of queries, batch x head), walking the key blocks as the
   forward does, and accumulating dQ.

Varlen batches (``IS_VARLEN``) use the same kernels, as the forward does: each program reads its
sequence from cu_seqlens and exits when its block lies past the sequence's end; the delta kernel needs
no change (it runs over the packed tokens as one batch).
"""

import triton
import triton.language as tl

from .common import (
    LOG2E,
    accumulate,
    apply_attn_mask,
    dot,
    dropout_keep,
    dropout_row_base,
    mapped_blocks,
    query_block_bounds,
    query_tile_key_blocks,
    scores_log2,
    sequence_bounds,
    stage_range,
    visible,
)


@triton.jit
def delta_kernel(
    Out, DOut, Delta,
    stride_ob, stride_om, stride_oh,
    stride_dob, stride_dom, stride_doh,
    seqlen_q, nheads,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    bh = tl.program_id(1)
    batch = bh // nheads
    head = bh % nheads
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_m[:, None] < seqlen_q) & (offs_d[None, :] < HEAD_DIM)
    o = tl.load(Out + batch.to(tl.int64) * stride_ob + head * stride_oh
                + offs_m[:, None] * stride_om + offs_d[None, :], mask=mask, other=0.0)
    do = tl.load(DOut + batch.to(tl.int64) * stride_dob + head * stride_doh
                 + offs_m[:, None] * stride_dom + offs_d[None, :], mask=mask, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    tl.store(Delta + bh.to(tl.int64) * seqlen_q + offs_m, delta, mask=offs_m < seqlen_q)


@triton.jit
def _load_rows(ptrs, offs_rows, limit, offs_d, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
               CHECK_ROWS: tl.constexpr):
    if CHECK_ROWS:
        if BLOCK_D == HEAD_DIM:
            return tl.load(ptrs, mask=offs_rows[:, None] < limit, other=0.0)
        return tl.load(ptrs, mask=(offs_rows[:, None] < limit) & (offs_d[None, :] < HEAD_DIM), other=0.0)
    if BLOCK_D == HEAD_DIM:
        return tl.load(ptrs)
    return tl.load(ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)


@triton.jit
def _load_tile(source, start, offs_rows, limit, stride, offs_d, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
               CHECK_ROWS: tl.constexpr, USE_TMA: tl.constexpr):
    """The rows offs_rows = start + arange of a (rows x HEAD_DIM) tensor: from a TMA descriptor (USE_TMA;
    rows past its shape read as zeros), or by pointer from base ``source`` (:func:`_load_rows`)."""
    if USE_TMA:  # if / else, not an early return: Triton would compile the pointer code for a descriptor
        tile = source.load([start, 0])
    else:
        tile = _load_rows(source + offs_rows[:, None] * stride + offs_d[None, :], offs_rows, limit, offs_d,
                          HEAD_DIM, BLOCK_D, CHECK_ROWS)
    return tile


@triton.jit
def _probs(
    q, k, lse_log2, offs_m, offs_n, seqlen_q, seqlen_k,
    qk_scale, softcap_log2, alibi_slope_log2, window_left, window_right,
    MASKED: tl.constexpr, WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, UPCAST_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr,
    mask_base, stride_mask_m, stride_mask_n, HAS_MASK: tl.constexpr, MASK_IS_BOOL: tl.constexpr,
    KEY_ROWS: tl.constexpr = False, shift=0,
):
    """Recompute one (queries x keys) tile of P from the log-sum-exp, before dropout.

    Returns (P, the softcap's tanh term, which its derivative needs). KEY_ROWS computes the product as
    S^T = K Q^T and hands back its transpose, a relabelling of the registers that moves no data: every
    warpgroup then holds whole key rows of the tile, so that P^T and dS^T feed dV and dK's products from
    its own registers (see ``dkdv_kernel``).
    """
    if KEY_ROWS:
        qk = tl.trans(dot(k, tl.trans(q), UPCAST_DOT, DOT_PRECISION))
    else:
        qk = dot(q, tl.trans(k), UPCAST_DOT, DOT_PRECISION)
    s, capped = scores_log2(qk, offs_m, offs_n, seqlen_q, seqlen_k, qk_scale, softcap_log2,
                            alibi_slope_log2, HAS_SOFTCAP, HAS_ALIBI, shift)
    if HAS_MASK:
        s = apply_attn_mask(s, mask_base, stride_mask_m, stride_mask_n, offs_m, offs_n, seqlen_q, seqlen_k,
                            MASK_IS_BOOL)
    p = tl.math.exp2(s - lse_log2[:, None])
    if MASKED:
        seen = visible(offs_m, offs_n, seqlen_q, seqlen_k, window_left, window_right, WINDOW_LEFT, WINDOW_RIGHT,
                       shift)
        p = tl.where(seen, p, 0.0)
    return p, capped


@triton.jit
def _dropped(x, keep, dropout_p, HAS_DROPOUT: tl.constexpr):
    """x where dropout keeps the score, scaled by 1 / (1 - p); 0 where it drops it."""
    if HAS_DROPOUT:
        return tl.where(keep, x * (1.0 / (1.0 - dropout_p)), 0.0)
    return x


@triton.jit
def _dscores(p, capped, v, do, delta, keep, dropout_p, HAS_SOFTCAP: tl.constexpr, HAS_DROPOUT: tl.constexpr,
             UPCAST_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr, KEY_ROWS: tl.constexpr = False):
    """dS = dScores / scale of one tile from its P (before dropout) and dP = dO V^T (as V dO^T with
    KEY_ROWS, as in :func:`_probs`).

    Returns (dS, the one dQ and dK need; the gradient of an additive SDPA mask, which is dS before the
    softcap's derivative: the mask is added after it).
    """
    if KEY_ROWS:
        dp = tl.trans(dot(v, tl.trans(do), UPCAST_DOT, DOT_PRECISION))
    else:
        dp = dot(do, tl.trans(v), UPCAST_DOT, DOT_PRECISION)
    dp = _dropped(dp, keep, dropout_p, HAS_DROPOUT)
    dmask = p * (dp - delta[:, None])
    ds = dmask
    if HAS_SOFTCAP:
        ds = ds * (1.0 - capped * capped)
    return ds, dmask


@triton.jit
def _dkdv_tile(
    dk, dv, dk_comp, dv_comp, k, v, start_m, q_source, do_source, lse_base, delta_base, stride_qm, stride_dom,
    offs_n, seqlen_q, seqlen_k, qk_scale, softcap_log2, alibi_slope_log2, window_left, window_right,
    dropout_p, rng_seed, rng_row_base, rng_row_stride,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
    MASKED: tl.constexpr, WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr,
    UPCAST_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr, COMPENSATED: tl.constexpr,
    mask_base, stride_mask_m, stride_mask_n, HAS_MASK: tl.constexpr, MASK_IS_BOOL: tl.constexpr,
    KEY_ROWS: tl.constexpr, interior_lo, interior_hi, MASK_AT_RUN_TIME: tl.constexpr, row_limit,
    USE_TMA: tl.constexpr, shift,
):
    """dK and dV of one (BLOCK_M queries from start_m) x (key block) tile, added to the accumulators.

    MASK_AT_RUN_TIME (with MASKED): the causal/window mask is computed only when the block lies outside
    [interior_lo, interior_hi), behind an if that is uniform across the program. With MASKED, the rows
    from ``row_limit`` on (seqlen_q, or less) take no part.

    q_source / do_source: base pointers, or (USE_TMA) tensor descriptors over the head's seqlen_q rows. A
    descriptor zero-fills the rows past seqlen_q; rows from row_limit to seqlen_q are read, and their
    lse = +inf (P = 0) keeps them out of both gradients.
    """
    offs_d = tl.arange(0, BLOCK_D)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    q = _load_tile(q_source, start_m, offs_m, row_limit, stride_qm, offs_d, HEAD_DIM, BLOCK_D, MASKED, USE_TMA)
    do = _load_tile(do_source, start_m, offs_m, row_limit, stride_dom, offs_d, HEAD_DIM, BLOCK_D, MASKED, USE_TMA)
    if MASKED:
        # rows past the limit get lse = +inf, hence P = 0 and no contribution
        lse = tl.load(lse_base + offs_m, mask=offs_m < row_limit, other=float("inf"))
        delta = tl.load(delta_base + offs_m, mask=offs_m < row_limit, other=0.0)
    else:
        lse = tl.load(lse_base + offs_m)
        delta = tl.load(delta_base + offs_m)
    p, capped = _probs(
        q, k, lse * LOG2E, offs_m, offs_n, seqlen_q, seqlen_k, qk_scale, softcap_log2, alibi_slope_log2,
        window_left, window_right, MASKED and not MASK_AT_RUN_TIME, WINDOW_LEFT, WINDOW_RIGHT, HAS_SOFTCAP,
        HAS_ALIBI, UPCAST_DOT, DOT_PRECISION, mask_base, stride_mask_m, stride_mask_n, HAS_MASK, MASK_IS_BOOL,
        KEY_ROWS, shift)
    if MASK_AT_RUN_TIME:  # noqa: SIM102 - compiled out when false; the inner test runs on the GPU
        if (start_m < interior_lo) | (start_m >= interior_hi):
            seen = visible(offs_m, offs_n, seqlen_q, seqlen_k, window_left, window_right, WINDOW_LEFT,
                           WINDOW_RIGHT, shift)
            p = tl.where(seen, p, 0.0)
    keep = p  # read only with dropout
    if HAS_DROPOUT:
        keep = dropout_keep(rng_seed, rng_row_base, offs_m, offs_n, rng_row_stride, dropout_p)
    # the products in the order the kernel is tuned with: S, dP, dV, dK
    ds, _ = _dscores(p, capped, v, do, delta, keep, dropout_p, HAS_SOFTCAP, HAS_DROPOUT, UPCAST_DOT, DOT_PRECISION,
                     KEY_ROWS)
    p_kept = _dropped(p, keep, dropout_p, HAS_DROPOUT)
    dv, dv_comp = accumulate(dv, dv_comp, dot(tl.trans(p_kept.to(do.dtype)), do, UPCAST_DOT, DOT_PRECISION),
                             COMPENSATED)
    dk, dk_comp = accumulate(dk, dk_comp, dot(tl.trans(ds.to(q.dtype)), q, UPCAST_DOT, DOT_PRECISION), COMPENSATED)
    return dk, dv, dk_comp, dv_comp


@triton.jit
def _dkdv_query_range(
    dk, dv, dk_comp, dv_comp, k, v, q_source, do_source, lse_base, delta_base, stride_qm, stride_dom,
    lo, hi, offs_n, seqlen_q, seqlen_k,
    qk_scale, softcap_log2, alibi_slope_log2, window_left, window_right,
    dropout_p, rng_seed, rng_row_base, rng_row_stride,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
    MASKED: tl.constexpr, WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr,
    UPCAST_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr, COMPENSATED: tl.constexpr,
    mask_base, stride_mask_m, stride_mask_n, HAS_MASK: tl.constexpr, MASK_IS_BOOL: tl.constexpr,
    block_list, HAS_BLOCK_MAP: tl.constexpr, KEY_ROWS: tl.constexpr, interior_lo, interior_hi,
    MASK_AT_RUN_TIME: tl.constexpr, USE_TMA: tl.constexpr, shift,
):
    """Query blocks lo, lo + BLOCK_M, ... < hi (with HAS_BLOCK_MAP, the blocks block_list[lo:hi]), each
    through :func:`_dkdv_tile`."""
    for step in range(lo, hi, 1 if HAS_BLOCK_MAP else BLOCK_M):
        if HAS_BLOCK_MAP:
            start_m = tl.load(block_list + step) * BLOCK_M
        else:
            start_m = step
        dk, dv, dk_comp, dv_comp = _dkdv_tile(
            dk, dv, dk_comp, dv_comp, k, v, start_m, q_source, do_source, lse_base, delta_base, stride_qm,
            stride_dom, offs_n, seqlen_q, seqlen_k, qk_scale, softcap_log2, alibi_slope_log2, window_left,
            window_right, dropout_p, rng_seed, rng_row_base, rng_row_stride, HEAD_DIM, BLOCK_D, BLOCK_M, MASKED,
            WINDOW_LEFT, WINDOW_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT, UPCAST_DOT, DOT_PRECISION, COMPENSATED,
            mask_base, stride_mask_m, stride_mask_n, HAS_MASK, MASK_IS_BOOL, KEY_ROWS, interior_lo, interior_hi,
            MASK_AT_RUN_TIME, seqlen_q, USE_TMA, shift)
    return dk, dv, dk_comp, dv_comp


@triton.jit
def dkdv_kernel(
    Q, K, V, DOut, Lse, Delta, DK, DV, AlibiSlopes, CuSeqlensQ, CuSeqlensK,
    stride_qb, stride_qm, stride_qh,
    stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh,
    stride_dob, stride_dom, stride_doh,
    stride_dkb, stride_dkn, stride_dkh,
    stride_dvb, stride_dvn, stride_dvh,
    stride_alibi_b,
    seqlen_q, seqlen_k, nheads, nheads_k, group_size,
    softmax_scale, qk_scale, softcap_log2, window_left, window_right,
    dropout_p, rng_seed, rng_offset, diagonal_shift, dropout_seqlen_q, dropout_seqlen_k,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr,
    UPCAST_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr, COMPENSATED: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    Mask=None, stride_mask_b=0, stride_mask_h=0, stride_mask_m=0, stride_mask_n=0,
    HAS_MASK: tl.constexpr = False, MASK_IS_BOOL: tl.constexpr = False,
    BlockMap=None, stride_map_b=0, stride_map_h=0, stride_map_row=0, HAS_BLOCK_MAP: tl.constexpr = False,
    KEY_ROWS: tl.constexpr = False, MASK_EVERY_BLOCK: tl.constexpr = False, PEEL_DIAGONAL: tl.constexpr = False,
    USE_TMA: tl.constexpr = False,
):
    """Varlen: seqlen_q/seqlen_k arrive as the packed totals, Lse/Delta are (nheads, total_q).

    One pass computes both gradients: 5 tile products with two fp32 accumulators.

    KEY_ROWS: S and dP are computed as K Q^T and V dO^T (see ``_probs``). Triton gives a chained
    product's warps whole rows of its tile, so with 8 warps (two warpgroups of 64 rows) the (queries x
    keys) tile needs BLOCK_M >= 128 or each warpgroup computes all of S and dP; with keys along the rows,
    BLOCK_N = 128 splits them between the warpgroups and BLOCK_M stays small enough for double-buffered
    Q and dO tiles (docs/perf-notes.md).

    MASK_EVERY_BLOCK: one loop over the query blocks instead of masked boundary loops around an unmasked
    interior one; every tile's loads are bounds-checked, and the mask is computed for the boundary tiles
    only, behind an if uniform across the program. With a causal mask the three-loop form makes ptxas
    serialize every wgmma of the kernel (info C7515): 46% more time per tile at hdim 128
    (docs/perf-notes.md).

    PEEL_DIAGONAL: with a causal band (no left window, no block map), its few masked blocks on the
    diagonal and the partial last block run as straight-line code around one unmasked loop, the other
    form that ptxas keeps asynchronous and the faster one at hdim 64. With MASK_EVERY_BLOCK as well, the
    masks it does not cover take the one-loop form.

    USE_TMA: the streamed Q and dO tiles come through tensor descriptors (one pair per query head), so that
    their loads need no registers or address arithmetic in the loop.
    """
    start_n = tl.program_id(0) * BLOCK_N
    bhk = tl.program_id(1)
    batch = bhk // nheads_k
    head_k = bhk % nheads_k
    if IS_VARLEN:
        total_q = seqlen_q
        total_k = seqlen_k
        q_start, seqlen_q, k_start, seqlen_k = sequence_bounds(CuSeqlensQ, CuSeqlensK, batch, total_q, total_k, True)
        if start_n >= seqlen_k:
            return  # a key block past this sequence's end: padding of the max_seqlen_k grid
        k_base = K + k_start.to(tl.int64) * stride_kn + head_k.to(tl.int64) * stride_kh
        v_base = V + k_start.to(tl.int64) * stride_vn + head_k.to(tl.int64) * stride_vh
        dk_base = DK + k_start.to(tl.int64) * stride_dkn + head_k.to(tl.int64) * stride_dkh
        dv_base = DV + k_start.to(tl.int64) * stride_dvn + head_k.to(tl.int64) * stride_dvh
    else:
        k_base = K + batch.to(tl.int64) * stride_kb + head_k.to(tl.int64) * stride_kh
        v_base = V + batch.to(tl.int64) * stride_vb + head_k.to(tl.int64) * stride_vh
        dk_base = DK + batch.to(tl.int64) * stride_dkb + head_k.to(tl.int64) * stride_dkh
        dv_base = DV + batch.to(tl.int64) * stride_dvb + head_k.to(tl.int64) * stride_dvh
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    k = _load_rows(k_base + offs_n[:, None] * stride_kn + offs_d[None, :], offs_n, seqlen_k, offs_d,
                   HEAD_DIM, BLOCK_D, True)
    v = _load_rows(v_base + offs_n[:, None] * stride_vn + offs_d[None, :], offs_n, seqlen_k, offs_d,
                   HEAD_DIM, BLOCK_D, True)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dk_comp = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv_comp = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    # the peeled form covers causal bands; a left window or a block map takes the one-loop form if asked
    # for too (the three-loop form otherwise)
    peeled: tl.constexpr = PEEL_DIAGONAL and not WINDOW_LEFT and not HAS_BLOCK_MAP
    one_loop: tl.constexpr = MASK_EVERY_BLOCK and not peeled
    lo, full_lo, full_hi, hi = query_block_bounds(start_n, seqlen_q, seqlen_k, window_left, window_right,
                                                  BLOCK_M, BLOCK_N, WINDOW_LEFT, WINDOW_RIGHT, diagonal_shift)
    for g in range(0, group_size):
        head = head_k * group_size + g
        if IS_VARLEN:
            q_base = Q + q_start.to(tl.int64) * stride_qm + head.to(tl.int64) * stride_qh
            do_base = DOut + q_start.to(tl.int64) * stride_dom + head.to(tl.int64) * stride_doh
            lse_base = Lse + head.to(tl.int64) * total_q + q_start
            delta_base = Delta + head.to(tl.int64) * total_q + q_start
            rng_row_base = dropout_row_base(rng_offset, head.to(tl.int64) * total_q + q_start, total_k, k_start)
            rng_row_stride = total_k
        else:
            bh = batch * nheads + head
            q_base = Q + batch.to(tl.int64) * stride_qb + head.to(tl.int64) * stride_qh
            do_base = DOut + batch.to(tl.int64) * stride_dob + head.to(tl.int64) * stride_doh
            lse_base = Lse + bh.to(tl.int64) * seqlen_q
            delta_base = Delta + bh.to(tl.int64) * seqlen_q
            rng_row_base = dropout_row_base(rng_offset, bh.to(tl.int64) * dropout_seqlen_q, dropout_seqlen_k, 0)
            rng_row_stride = dropout_seqlen_k
        q_source = q_base
        do_source = do_base
        if USE_TMA:  # descriptors are made here: Triton 3.6 does not return one from a helper
            q_source = tl.make_tensor_descriptor(q_base, shape=[seqlen_q, HEAD_DIM], strides=[stride_qm, 1],
                                                 block_shape=[BLOCK_M, BLOCK_D])
            do_source = tl.make_tensor_descriptor(do_base, shape=[seqlen_q, HEAD_DIM], strides=[stride_dom, 1],
                                                  block_shape=[BLOCK_M, BLOCK_D])
        alibi_slope_log2 = 0.0
        if HAS_ALIBI:
            alibi_slope_log2 = tl.load(AlibiSlopes + batch * stride_alibi_b + head).to(tl.float32) * LOG2E
        mask_base = Mask
        if HAS_MASK:
            mask_base = Mask + batch.to(tl.int64) * stride_mask_b + head.to(tl.int64) * stride_mask_h
        block_list = BlockMap
        head_lo = lo
        head_full_lo = full_lo
        head_full_hi = full_hi
        head_hi = hi
        if HAS_BLOCK_MAP:
            # only the query blocks with a score this head's SDPA mask shows, in one masked stage
            block_list, head_lo, head_hi = mapped_blocks(BlockMap, stride_map_b, stride_map_h, stride_map_row, batch,
                                                         head, start_n // BLOCK_N, lo, hi, tl.cdiv(seqlen_q, BLOCK_M),
                                                         BLOCK_M)
            head_full_lo = head_lo
            head_full_hi = head_hi
        # MASK_EVERY_BLOCK: one loop over all of the head's query blocks, the mask computed for the tiles
        # outside the interior (by query position; a block map's stages count list entries: mask them all)
        interior_lo = head_full_lo
        interior_hi = head_full_hi
        if HAS_BLOCK_MAP:
            interior_lo = 0
            interior_hi = 0
        if one_loop:
            head_full_lo = head_lo
            head_full_hi = head_hi
        for stage in tl.static_range(3):
            if peeled and stage == 0:
                # a causal band's masked blocks before the interior are the few on the diagonal
                # ((BLOCK_N - 1) // BLOCK_M + 2 at most): straight-line code, each block behind an if
                # uniform across the program (a block that is not there would cost a whole tile)
                for i in tl.static_range((BLOCK_N - 1) // BLOCK_M + 2):
                    if head_lo + i * BLOCK_M < head_full_lo:
                        dk, dv, dk_comp, dv_comp = _dkdv_tile(
                            dk, dv, dk_comp, dv_comp, k, v, head_lo + i * BLOCK_M, q_source, do_source, lse_base,
                            delta_base, stride_qm, stride_dom, offs_n, seqlen_q, seqlen_k, qk_scale, softcap_log2,
                            alibi_slope_log2, window_left, window_right, dropout_p, rng_seed, rng_row_base,
                            rng_row_stride, HEAD_DIM, BLOCK_D, BLOCK_M, True, WINDOW_LEFT, WINDOW_RIGHT,
                            HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT, UPCAST_DOT, DOT_PRECISION, COMPENSATED, mask_base,
                            stride_mask_m, stride_mask_n, HAS_MASK, MASK_IS_BOOL, KEY_ROWS, 0, 0, False,
                            head_full_lo, USE_TMA, diagonal_shift)
            elif peeled and stage == 2:
                if head_full_hi < head_hi:  # the partial last block (its rows from head_hi = seqlen_q on take no part)
                    dk, dv, dk_comp, dv_comp = _dkdv_tile(
                        dk, dv, dk_comp, dv_comp, k, v, head_full_hi, q_source, do_source, lse_base, delta_base,
                        stride_qm, stride_dom, offs_n, seqlen_q, seqlen_k, qk_scale, softcap_log2, alibi_slope_log2,
                        window_left, window_right, dropout_p, rng_seed, rng_row_base, rng_row_stride, HEAD_DIM,
                        BLOCK_D, BLOCK_M, True, WINDOW_LEFT, WINDOW_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT,
                        UPCAST_DOT, DOT_PRECISION, COMPENSATED, mask_base, stride_mask_m, stride_mask_n, HAS_MASK,
                        MASK_IS_BOOL, KEY_ROWS, 0, 0, False, head_hi, USE_TMA, diagonal_shift)
            elif stage == 1 or not one_loop:
                # the three-loop form's stages; the one-loop form's single stage; the peeled form's interior
                start, end = stage_range(stage, head_lo, head_full_lo, head_full_hi, head_hi)
                dk, dv, dk_comp, dv_comp = _dkdv_query_range(
                    dk, dv, dk_comp, dv_comp, k, v, q_source, do_source, lse_base, delta_base, stride_qm, stride_dom,
                    start, end, offs_n, seqlen_q, seqlen_k, qk_scale, softcap_log2, alibi_slope_log2,
                    window_left, window_right, dropout_p, rng_seed, rng_row_base, rng_row_stride, HEAD_DIM, BLOCK_D,
                    BLOCK_M, stage != 1 or HAS_MASK or one_loop, WINDOW_LEFT, WINDOW_RIGHT, HAS_SOFTCAP,
                    HAS_ALIBI, HAS_DROPOUT, UPCAST_DOT, DOT_PRECISION, COMPENSATED, mask_base, stride_mask_m,
                    stride_mask_n, HAS_MASK, MASK_IS_BOOL, block_list, HAS_BLOCK_MAP, KEY_ROWS, interior_lo,
                    interior_hi, one_loop, USE_TMA, diagonal_shift)
    store_mask = offs_n[:, None] < seqlen_k
    if BLOCK_D != HEAD_DIM:
        store_mask = store_mask & (offs_d[None, :] < HEAD_DIM)
    dk = dk * softmax_scale
    tl.store(dk_base + offs_n[:, None] * stride_dkn + offs_d[None, :], dk.to(DK.dtype.element_ty), mask=store_mask)
    tl.store(dv_base + offs_n[:, None] * stride_dvn + offs_d[None, :], dv.to(DV.dtype.element_ty), mask=store_mask)


@triton.jit
def _dq_key_range(
    dq, dq_comp, q, do, lse_log2, delta, k_source, v_source, stride_kn, stride_vn,
    lo, hi, offs_m, seqlen_q, seqlen_k,
    qk_scale, softcap_log2, alibi_slope_log2, window_left, window_right,
    dropout_p, rng_seed, rng_row_base, rng_row_stride,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr, WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr,
    UPCAST_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr, COMPENSATED: tl.constexpr,
    mask_base, stride_mask_m, stride_mask_n, dmask_base, HAS_MASK: tl.constexpr, MASK_IS_BOOL: tl.constexpr,
    MASK_GRAD: tl.constexpr, block_list, HAS_BLOCK_MAP: tl.constexpr, USE_TMA: tl.constexpr, shift,
):
    """Key blocks lo, lo + BLOCK_N, ... < hi; with HAS_BLOCK_MAP, the blocks block_list[lo:hi].

    k_source / v_source: base pointers, or (USE_TMA) tensor descriptors over the kv head's seqlen_k rows,
    whose loads zero-fill the rows past seqlen_k as the masked pointer loads do.
    """
    offs_d = tl.arange(0, BLOCK_D)
    for step in range(lo, hi, 1 if HAS_BLOCK_MAP else BLOCK_N):
        if HAS_BLOCK_MAP:
            start_n = tl.load(block_list + step) * BLOCK_N
        else:
            start_n = step
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = _load_tile(k_source, start_n, offs_n, seqlen_k, stride_kn, offs_d, HEAD_DIM, BLOCK_D, MASKED, USE_TMA)
        v = _load_tile(v_source, start_n, offs_n, seqlen_k, stride_vn, offs_d, HEAD_DIM, BLOCK_D, MASKED, USE_TMA)
        p, capped = _probs(
            q, k, lse_log2, offs_m, offs_n, seqlen_q, seqlen_k, qk_scale, softcap_log2, alibi_slope_log2,
            window_left, window_right, MASKED, WINDOW_LEFT, WINDOW_RIGHT, HAS_SOFTCAP, HAS_ALIBI, UPCAST_DOT,
            DOT_PRECISION, mask_base, stride_mask_m, stride_mask_n, HAS_MASK, MASK_IS_BOOL, False, shift)
        keep = p  # read only with dropout
        if HAS_DROPOUT:
            keep = dropout_keep(rng_seed, rng_row_base, offs_m, offs_n, rng_row_stride, dropout_p)
        ds, dmask = _dscores(p, capped, v, do, delta, keep, dropout_p, HAS_SOFTCAP, HAS_DROPOUT, UPCAST_DOT,
                             DOT_PRECISION)
        if MASK_GRAD:
            # the full (Lq, Lk) gradient of this (batch, head); blocks not visited stay 0
            in_bounds = (offs_m[:, None] < seqlen_q) & (offs_n[None, :] < seqlen_k)
            tl.store(dmask_base + offs_m[:, None].to(tl.int64) * seqlen_k + offs_n[None, :], dmask, mask=in_bounds)
        dq, dq_comp = accumulate(dq, dq_comp, dot(ds.to(k.dtype), k, UPCAST_DOT, DOT_PRECISION), COMPENSATED)
    return dq, dq_comp


@triton.jit
def dq_kernel(
    Q, K, V, DOut, Lse, Delta, DQ, AlibiSlopes, CuSeqlensQ, CuSeqlensK,
    stride_qb, stride_qm, stride_qh,
    stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh,
    stride_dob, stride_dom, stride_doh,
    stride_dqb, stride_dqm, stride_dqh,
    stride_alibi_b,
    seqlen_q, seqlen_k, nheads, group_size,
    softmax_scale, qk_scale, softcap_log2, window_left, window_right,
    dropout_p, rng_seed, rng_offset, diagonal_shift, dropout_seqlen_q, dropout_seqlen_k,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr,
    UPCAST_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr, COMPENSATED: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    Mask=None, stride_mask_b=0, stride_mask_h=0, stride_mask_m=0, stride_mask_n=0, DMask=None,
    HAS_MASK: tl.constexpr = False, MASK_IS_BOOL: tl.constexpr = False, MASK_GRAD: tl.constexpr = False,
    BlockMap=None, stride_map_b=0, stride_map_h=0, stride_map_row=0, HAS_BLOCK_MAP: tl.constexpr = False,
    USE_TMA: tl.constexpr = False,
):
    """Varlen: seqlen_q/seqlen_k arrive as the packed totals, Lse/Delta are (nheads, total_q).

    USE_TMA: the streamed K and V tiles come through tensor descriptors, as in the forward.
    """
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    batch = bh // nheads
    head = bh % nheads
    head_k = head // group_size
    if IS_VARLEN:
        total_q = seqlen_q
        total_k = seqlen_k
        q_start, seqlen_q, k_start, seqlen_k = sequence_bounds(CuSeqlensQ, CuSeqlensK, batch, total_q, total_k, True)
        if start_m >= seqlen_q:
            return  # a query block past this sequence's end: padding of the max_seqlen_q grid
        q_base = Q + q_start.to(tl.int64) * stride_qm + head.to(tl.int64) * stride_qh
        do_base = DOut + q_start.to(tl.int64) * stride_dom + head.to(tl.int64) * stride_doh
        dq_base = DQ + q_start.to(tl.int64) * stride_dqm + head.to(tl.int64) * stride_dqh
        k_base = K + k_start.to(tl.int64) * stride_kn + head_k.to(tl.int64) * stride_kh
        v_base = V + k_start.to(tl.int64) * stride_vn + head_k.to(tl.int64) * stride_vh
        lse_base = Lse + head.to(tl.int64) * total_q + q_start
        delta_base = Delta + head.to(tl.int64) * total_q + q_start
        rng_row_base = dropout_row_base(rng_offset, head.to(tl.int64) * total_q + q_start, total_k, k_start)
        rng_row_stride = total_k
    else:
        q_base = Q + batch.to(tl.int64) * stride_qb + head.to(tl.int64) * stride_qh
        do_base = DOut + batch.to(tl.int64) * stride_dob + head.to(tl.int64) * stride_doh
        dq_base = DQ + batch.to(tl.int64) * stride_dqb + head.to(tl.int64) * stride_dqh
        k_base = K + batch.to(tl.int64) * stride_kb + head_k.to(tl.int64) * stride_kh
        v_base = V + batch.to(tl.int64) * stride_vb + head_k.to(tl.int64) * stride_vh
        lse_base = Lse + bh.to(tl.int64) * seqlen_q
        delta_base = Delta + bh.to(tl.int64) * seqlen_q
        rng_row_base = dropout_row_base(rng_offset, bh.to(tl.int64) * dropout_seqlen_q, dropout_seqlen_k, 0)
        rng_row_stride = dropout_seqlen_k
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q = _load_rows(q_base + offs_m[:, None] * stride_qm + offs_d[None, :], offs_m, seqlen_q, offs_d,
                   HEAD_DIM, BLOCK_D, True)
    do = _load_rows(do_base + offs_m[:, None] * stride_dom + offs_d[None, :], offs_m, seqlen_q, offs_d,
                    HEAD_DIM, BLOCK_D, True)
    row_ok = offs_m < seqlen_q
    lse_log2 = tl.load(lse_base + offs_m, mask=row_ok, other=float("inf")) * LOG2E
    delta = tl.load(delta_base + offs_m, mask=row_ok, other=0.0)
    alibi_slope_log2 = 0.0
    if HAS_ALIBI:
        alibi_slope_log2 = tl.load(AlibiSlopes + batch * stride_alibi_b + head).to(tl.float32) * LOG2E
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    dq_comp = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    mask_base = Mask
    dmask_base = DMask
    if HAS_MASK:
        mask_base = Mask + batch.to(tl.int64) * stride_mask_b + head.to(tl.int64) * stride_mask_h
    if MASK_GRAD:
        dmask_base = DMask + bh.to(tl.int64) * seqlen_q * seqlen_k
    k_source = k_base
    v_source = v_base
    if USE_TMA:
        k_source = tl.make_tensor_descriptor(k_base, shape=[seqlen_k, HEAD_DIM], strides=[stride_kn, 1],
                                             block_shape=[BLOCK_N, BLOCK_D])
        v_source = tl.make_tensor_descriptor(v_base, shape=[seqlen_k, HEAD_DIM], strides=[stride_vn, 1],
                                             block_shape=[BLOCK_N, BLOCK_D])
    block_list, lo, full_lo, full_hi, hi = query_tile_key_blocks(
        start_m, seqlen_q, seqlen_k, window_left, window_right, BlockMap, stride_map_b, stride_map_h,
        stride_map_row, batch, head, BLOCK_M, BLOCK_N, WINDOW_LEFT, WINDOW_RIGHT, HAS_BLOCK_MAP, diagonal_shift)
    for stage in tl.static_range(3):
        start, end = stage_range(stage, lo, full_lo, full_hi, hi)
        dq, dq_comp = _dq_key_range(
            dq, dq_comp, q, do, lse_log2, delta, k_source, v_source, stride_kn, stride_vn, start, end, offs_m,
            seqlen_q, seqlen_k, qk_scale, softcap_log2, alibi_slope_log2, window_left, window_right,
            dropout_p, rng_seed, rng_row_base, rng_row_stride, HEAD_DIM, BLOCK_D, BLOCK_N, stage != 1 or HAS_MASK,
            WINDOW_LEFT, WINDOW_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT, UPCAST_DOT, DOT_PRECISION, COMPENSATED,
            mask_base, stride_mask_m, stride_mask_n, dmask_base, HAS_MASK, MASK_IS_BOOL, MASK_GRAD,
            block_list, HAS_BLOCK_MAP, USE_TMA, diagonal_shift)
    dq = dq * softmax_scale
    store_mask = row_ok[:, None]
    if BLOCK_D != HEAD_DIM:
        store_mask = store_mask & (offs_d[None, :] < HEAD_DIM)
    tl.store(dq_base + offs_m[:, None] * stride_dqm + offs_d[None, :], dq.to(DQ.dtype.element_ty), mask=store_mask)
