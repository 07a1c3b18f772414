"""Forward kernel: one program per (block of queries, batch x head), online softmax in base 2."""

import triton
import triton.language as tl

from .common import (
    LOG2E,
    divide_rows,
    dot,
    dropout_row_base,
    load_kt_v,
    online_softmax_step,
    paged_kv_rows,
    query_tile_key_blocks,
    sequence_bounds,
    stage_range,
)


@triton.jit
def _load_paged_key_block(k_head, v_head, start_n, offs_n, offs_d, seqlen_k, page_table_row, page_size, num_pages,
                          stride_kb, stride_kn, stride_vb, stride_vn,
                          HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, MASKED: tl.constexpr, ONE_PAGE: tl.constexpr):
    """K^T and V for the keys offs_n of a paged cache (pointer loads: a TMA descriptor cannot follow pages).

    A page index outside the pool reads page 0 instead (``paged_kv_rows``): a wrong answer for a bad table,
    never a read outside the cache. Interior blocks (MASKED false) load without any mask, as packed keys do;
    masking the missing pages there too cost ptxas hundreds of bytes of spills in the hdim-128 causal tile.
    """
    positions = offs_n
    if MASKED:
        # keys past seqlen_k address the last key's row: the table's row may end at the sequence's last
        # page, and that page's later rows may hold anything. Their lanes load nothing either.
        positions = tl.minimum(offs_n, seqlen_k - 1)
    k_rows, v_rows, _ = paged_kv_rows(positions, start_n, page_table_row, page_size, num_pages,
                                      stride_kb, stride_kn, stride_vb, stride_vn, ONE_PAGE)
    return load_kt_v(k_head + k_rows[None, :] + offs_d[:, None], v_head + v_rows[:, None] + offs_d[None, :],
                     offs_d, offs_n < seqlen_k, HEAD_DIM, BLOCK_D, MASKED)


@triton.jit
def _head_rows(desc, base, row, head, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
               SEQUENCES: tl.constexpr):
    """Rows row .. row + ROWS of one head of sequence ``base`` (SEQUENCES: a (batch, seqlen, heads * HEAD_DIM)
    descriptor, zero-filled past the sequence) or of the sequence whose first token is ``base`` (a descriptor over
    the tokens: (tokens, heads * HEAD_DIM) where BLOCK_D == HEAD_DIM, else (tokens, heads, HEAD_DIM), whose loads
    zero-fill the columns past HEAD_DIM; its tile is reshaped in registers, which cost the unpadded head dims 7-20% at
    hdim 256)."""
    if SEQUENCES:
        tile = desc.load([base, row, head * HEAD_DIM]).reshape(ROWS, HEAD_DIM)
    elif BLOCK_D == HEAD_DIM:
        tile = desc.load([base + row, head * HEAD_DIM])
    else:
        tile = desc.load([base + row, head, 0]).reshape(ROWS, BLOCK_D)
    return tile


@triton.jit
def _load_key_block(k_source, v_source, start_n, offs_n, offs_d, stride_kn, stride_vn, seqlen_k, key_row, head_k,
                    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
                    USE_TMA: tl.constexpr, SEQUENCES: tl.constexpr):
    """K^T and V for the keys offs_n. With USE_TMA the sources are descriptors (``_head_rows``; ``key_row`` the
    sequence, or its first key's token). Over the tokens a masked block may run into the next sequence's keys, whose
    scores the mask hides and whose values it zeroes (0 x NaN would carry another sequence's NaN into this one); over
    the sequences the copy reads zeros there. Otherwise they are base pointers, and interior blocks (MASKED false)
    need no bounds on the keys."""
    if USE_TMA:
        kt = _head_rows(k_source, key_row, start_n, head_k, BLOCK_N, HEAD_DIM, BLOCK_D, SEQUENCES).T
        v = _head_rows(v_source, key_row, start_n, head_k, BLOCK_N, HEAD_DIM, BLOCK_D, SEQUENCES)
        if MASKED and not SEQUENCES:
            v = tl.where((offs_n < seqlen_k)[:, None], v, 0.0)
    else:
        kt, v = load_kt_v(k_source + offs_n[None, :] * stride_kn + offs_d[:, None],
                          v_source + offs_n[:, None] * stride_vn + offs_d[None, :],
                          offs_d, offs_n < seqlen_k, HEAD_DIM, BLOCK_D, MASKED)
    return kt, v


@triton.jit
def _forward_block_range(
    acc, acc_comp, row_sum, row_max, q,
    k_source, v_source, stride_kn, stride_vn,
    lo, hi, offs_m, seqlen_q, seqlen_k,
    qk_scale, softcap_log2, alibi_slope_log2,
    window_left, window_right, dropout_p, rng_seed, rng_row_base, rng_row_stride,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr, WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr,
    UPCAST_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr, COMPENSATED: tl.constexpr,
    USE_TMA: tl.constexpr, DEFER_SCALE: tl.constexpr,
    mask_base, stride_mask_m, stride_mask_n, HAS_MASK: tl.constexpr, MASK_IS_BOOL: tl.constexpr,
    block_list, HAS_BLOCK_MAP: tl.constexpr,
    page_table_row, page_size, num_pages, stride_kb, stride_vb, PAGED_KV: tl.constexpr, ONE_PAGE: tl.constexpr,
    shift, key_row, head_k, SEQUENCES: tl.constexpr,
):
    """Key blocks lo, lo + BLOCK_N, ... < hi; with HAS_BLOCK_MAP, the blocks block_list[lo:hi]."""
    offs_d = tl.arange(0, BLOCK_D)
    for step in range(lo, hi, 1 if HAS_BLOCK_MAP else BLOCK_N):
        if HAS_BLOCK_MAP:
            start_n = tl.load(block_list + step) * BLOCK_N
        else:
            start_n = step
        offs_n = start_n + tl.arange(0, BLOCK_N)
        if PAGED_KV:
            kt, v = _load_paged_key_block(k_source, v_source, start_n, offs_n, offs_d, seqlen_k, page_table_row,
                                          page_size, num_pages, stride_kb, stride_kn, stride_vb, stride_vn,
                                          HEAD_DIM, BLOCK_D, MASKED, ONE_PAGE)
        else:
            kt, v = _load_key_block(k_source, v_source, start_n, offs_n, offs_d, stride_kn, stride_vn, seqlen_k,
                                    key_row, head_k, HEAD_DIM, BLOCK_D, BLOCK_N, MASKED, USE_TMA, SEQUENCES)
        qk = dot(q, kt, UPCAST_DOT, DOT_PRECISION)
        acc, acc_comp, row_sum, row_max = online_softmax_step(
            acc, acc_comp, row_sum, row_max, qk, v, offs_m, offs_n, seqlen_q, seqlen_k, qk_scale, softcap_log2,
            alibi_slope_log2, window_left, window_right, dropout_p, rng_seed, rng_row_base, rng_row_stride,
            MASKED, WINDOW_LEFT, WINDOW_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT, UPCAST_DOT, DOT_PRECISION,
            COMPENSATED, DEFER_SCALE, mask_base, stride_mask_m, stride_mask_n, HAS_MASK, MASK_IS_BOOL, shift)
    return acc, acc_comp, row_sum, row_max


@triton.jit
def attention_forward_kernel(
    Q, K, V, Out, Lse, AlibiSlopes, CuSeqlensQ, CuSeqlensK,
    stride_qb, stride_qm, stride_qh,
    stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh,
    stride_ob, stride_om, stride_oh,
    stride_alibi_b,
    seqlen_q, seqlen_k, nheads, group_size,
    qk_scale, softcap_log2, window_left, window_right,
    dropout_p, rng_seed, rng_offset, diagonal_shift, dropout_seqlen_q, dropout_seqlen_k,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr,
    UPCAST_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr, COMPENSATED: tl.constexpr,
    IS_VARLEN: tl.constexpr, USE_TMA: tl.constexpr, DEFER_SCALE: tl.constexpr,
    Mask=None, stride_mask_b=0, stride_mask_h=0, stride_mask_m=0, stride_mask_n=0,
    HAS_MASK: tl.constexpr = False, MASK_IS_BOOL: tl.constexpr = False,
    BlockMap=None, stride_map_b=0, stride_map_h=0, stride_map_row=0, HAS_BLOCK_MAP: tl.constexpr = False,
    BlockTable=None, stride_btb=0, page_size=1, pages_per_seq=0,
    PAGED_KV: tl.constexpr = False, ONE_PAGE: tl.constexpr = False,
    QDesc=None, KDesc=None, VDesc=None, SEQUENCES: tl.constexpr = False,
):
    """Dense: seqlen_q/seqlen_k are the lengths, Lse is (batch, nheads, seqlen_q). Varlen: they are the
    packed totals total_q/total_k, the batch strides are unused, and Lse is (nheads, total_q).

    PAGED_KV (varlen only): K and V are page pools (num_pages, page_size, nheads_k, headdim), the "batch"
    strides step over pages, and sequence b's key j is row j % page_size of page
    BlockTable[b, j // page_size]; seqlen_k is then the number of pages. ONE_PAGE: BLOCK_N divides
    page_size, so each key block lies in one page.

    Dense calls in a position frame (a ring step): ``diagonal_shift`` moves the masks' and ALiBi's diagonal, and the
    dropout counters take ``dropout_seqlen_q`` / ``dropout_seqlen_k`` (the frame's lengths; otherwise the call's) as
    strides, the frame's start already in ``rng_offset``. Varlen calls pass 0 and ignore the lengths."""
    if WINDOW_RIGHT:
        # with a causal (right-bounded) mask the last query blocks see the most keys: launch them
        # first, so the grid's last wave holds the short tiles instead of a long tail of full ones
        start_m = (tl.num_programs(0) - 1 - tl.program_id(0)) * BLOCK_M
    else:
        start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    batch = bh // nheads
    head = bh % nheads
    head_k = head // group_size
    page_table_row = BlockTable
    num_pages = 0
    query_row = 0
    key_row = 0
    if IS_VARLEN:
        total_q = seqlen_q
        total_k = seqlen_k
        q_start, seqlen_q, k_start, seqlen_k = sequence_bounds(CuSeqlensQ, CuSeqlensK, batch, total_q, total_k,
                                                              not PAGED_KV)
        if start_m >= seqlen_q:
            return  # a query block past this sequence's end: padding of the max_seqlen_q grid
        q_base = Q + q_start.to(tl.int64) * stride_qm + head.to(tl.int64) * stride_qh
        query_row = q_start
        key_row = k_start
        if PAGED_KV:
            num_pages = total_k
            # the keys are not packed: the dropout stream's total_k is the key count, cu_seqlens_k[-1]
            total_k = tl.load(CuSeqlensK + tl.num_programs(1) // nheads)
            # a length past the table's pages (refused on the host wherever it can be checked) is cut there;
            # an empty pool comes with pages_per_seq = 0
            seqlen_k = tl.minimum(seqlen_k, pages_per_seq * page_size)
            page_table_row = BlockTable + batch.to(tl.int64) * stride_btb
            k_base = K + head_k.to(tl.int64) * stride_kh
            v_base = V + head_k.to(tl.int64) * stride_vh
        else:
            k_base = K + k_start.to(tl.int64) * stride_kn + head_k.to(tl.int64) * stride_kh
            v_base = V + k_start.to(tl.int64) * stride_vn + head_k.to(tl.int64) * stride_vh
        o_base = Out + q_start.to(tl.int64) * stride_om + head.to(tl.int64) * stride_oh
        lse_base = Lse + head.to(tl.int64) * total_q + q_start
        rng_row_base = dropout_row_base(rng_offset, head.to(tl.int64) * total_q + q_start, total_k, k_start)
        rng_row_stride = total_k
    else:
        # int64 offsets: batch * stride passes 2**31 elements on large inputs
        q_base = Q + batch.to(tl.int64) * stride_qb + head.to(tl.int64) * stride_qh
        k_base = K + batch.to(tl.int64) * stride_kb + head_k.to(tl.int64) * stride_kh
        v_base = V + batch.to(tl.int64) * stride_vb + head_k.to(tl.int64) * stride_vh
        o_base = Out + batch.to(tl.int64) * stride_ob + head.to(tl.int64) * stride_oh
        lse_base = Lse + bh.to(tl.int64) * seqlen_q
        query_row = batch if SEQUENCES else batch * seqlen_q
        key_row = batch if SEQUENCES else batch * seqlen_k
        rng_row_base = dropout_row_base(rng_offset, bh.to(tl.int64) * dropout_seqlen_q, dropout_seqlen_k, 0)
        rng_row_stride = dropout_seqlen_k

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m[:, None] < seqlen_q
    if BLOCK_D != HEAD_DIM:
        row_ok = row_ok & (offs_d[None, :] < HEAD_DIM)
    # q stays in registers/SRAM for the whole loop over keys
    if USE_TMA:
        # QDesc, KDesc, VDesc: host-side descriptors (``_head_rows``). Over the tokens a tile's rows may run into
        # the next sequence's, whose query rows are never stored
        q = _head_rows(QDesc, query_row, start_m, head, BLOCK_M, HEAD_DIM, BLOCK_D, SEQUENCES)
        k_source = KDesc
        v_source = VDesc
    else:
        k_source = k_base
        v_source = v_base
        q = tl.load(q_base + offs_m[:, None] * stride_qm + offs_d[None, :], mask=row_ok, other=0.0)

    alibi_slope_log2 = 0.0
    if HAS_ALIBI:
        alibi_slope_log2 = tl.load(AlibiSlopes + batch * stride_alibi_b + head).to(tl.float32) * LOG2E

    row_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    acc_comp = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    mask_base = Mask
    if HAS_MASK:
        mask_base = Mask + batch.to(tl.int64) * stride_mask_b + head.to(tl.int64) * stride_mask_h

    block_list, lo, full_lo, full_hi, hi = query_tile_key_blocks(
        start_m, seqlen_q, seqlen_k, window_left, window_right, BlockMap, stride_map_b, stride_map_h,
        stride_map_row, batch, head, BLOCK_M, BLOCK_N, WINDOW_LEFT, WINDOW_RIGHT, HAS_BLOCK_MAP, diagonal_shift)
    for stage in tl.static_range(3):
        start, end = stage_range(stage, lo, full_lo, full_hi, hi)
        # an SDPA mask may hide any score: every block takes the masked path then
        acc, acc_comp, row_sum, row_max = _forward_block_range(
            acc, acc_comp, row_sum, row_max, q, k_source, v_source, stride_kn, stride_vn, start, end, offs_m,
            seqlen_q, seqlen_k, qk_scale, softcap_log2, alibi_slope_log2, window_left, window_right,
            dropout_p, rng_seed, rng_row_base, rng_row_stride, HEAD_DIM, BLOCK_D, BLOCK_N, stage != 1 or HAS_MASK,
            WINDOW_LEFT, WINDOW_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT, UPCAST_DOT, DOT_PRECISION, COMPENSATED,
            USE_TMA, DEFER_SCALE, mask_base, stride_mask_m, stride_mask_n, HAS_MASK, MASK_IS_BOOL,
            block_list, HAS_BLOCK_MAP, page_table_row, page_size, num_pages, stride_kb, stride_vb, PAGED_KV,
            ONE_PAGE, diagonal_shift, key_row, head_k, SEQUENCES)

    # -- epilogue: normalize; a row that saw no key gives 0 and lse = +inf --
    empty = row_sum == 0.0
    row_sum = tl.where(empty, 1.0, row_sum)
    out = divide_rows(acc, row_sum, COMPENSATED)
    if HAS_DROPOUT:
        out = out * (1.0 / (1.0 - dropout_p))
    lse = tl.where(empty, float("inf"), (row_max + tl.math.log2(row_sum)) / LOG2E)
    tl.store(lse_base + offs_m, lse, mask=offs_m < seqlen_q)
    tl.store(o_base + offs_m[:, None] * stride_om + offs_d[None, :], out.to(Out.dtype.element_ty), mask=row_ok)
