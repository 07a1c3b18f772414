"""Jit helpers shared by the forward and backward kernels.

``visible`` is the Triton form of :func:`flashattn.masks.visible`; ``key_block_bounds`` and
``query_block_bounds`` split a tile's loop into boundary blocks (masked) and interior blocks (no mask
at all), so the masking work is confined to the few tiles that cross a mask edge.

``shift`` moves the diagonal of masks and ALiBi by a position frame's offset (``masks.py``; a ring step's pair of
chunks): 0 for a call that is its own problem.
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def chain_launch(ENABLED: tl.constexpr):
    """Programmatic dependent launch (sm90+): call first thing in a kernel launched with ``launch_pdl``.

    Such a kernel may start while the previous kernel on the stream is still running, so it first waits
    until that kernel has finished and its writes are visible (griddepcontrol.wait); nothing is read or
    written before. Then it lets the next kernel launch early in turn: that kernel's programs take SMs as
    this one's retire instead of after the launch gap. A no-op when not ENABLED (the interpreter, older
    GPUs), where the inline PTX does not exist.
    """
    if ENABLED:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def tanh(x):
    """tanh from exp2 (libdevice's tanh does not run under the interpreter).

    1 - 2 / (e^2x + 1) saturates cleanly to +-1 but cancels near 0, where its absolute error of one
    float32 ulp of 1 becomes a large relative error (a softcap of 30 multiplies it by 30): for
    |x| < 0.5 the odd Taylor series to x^13 takes over, whose truncation error there is under one ulp.
    """
    x2 = x * x
    series = x * (1.0 + x2 * (-0.3333333333333333 + x2 * (0.13333333333333333 + x2 * (
        -0.05396825396825397 + x2 * (0.021869488536155203 + x2 * (-0.008863235529902197
                                                                    + x2 * 0.003592128036572481))))))
    saturating = 1.0 - 2.0 / (tl.exp2(x * (2.0 * 1.4426950408889634)) + 1.0)
    return tl.where(tl.abs(x) < 0.5, series, saturating)


@triton.jit
def divide_rows(acc, row_sum, ROUND_TO_NEAREST: tl.constexpr):
    """acc / row_sum[:, None], the softmax normalization.

    Triton compiles a float32 ``/`` to div.full.f32, which may be two ulps off. A row that one key
    dominates (ALiBi with a steep slope) carries a value of |v| up to ~4 there, and two ulps of that
    exceeded twice PyTorch's float32 error. The float32 path divides with round-to-nearest instead;
    the 16-bit outputs round far coarser than either.
    """
    if ROUND_TO_NEAREST:
        return tl.div_rn(acc, tl.broadcast_to(row_sum[:, None], acc.shape))
    return acc / row_sum[:, None]


@triton.jit
def visible(offs_m, offs_n, seqlen_q, seqlen_k, window_left, window_right,
            WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr, shift=0):
    diagonal = offs_m[:, None] + (seqlen_k - seqlen_q + shift)
    seen = offs_n[None, :] < seqlen_k
    if WINDOW_LEFT:
        seen = seen & (offs_n[None, :] >= diagonal - window_left)
    if WINDOW_RIGHT:
        seen = seen & (offs_n[None, :] <= diagonal + window_right)
    return seen


@triton.jit
def scores_log2(qk, offs_m, offs_n, seqlen_q, seqlen_k, qk_scale, softcap_log2, alibi_slope_log2,
                HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, shift=0):
    """Raw q.k products -> scores in base 2 (the softmax scale and log2(e) folded in).

    Returns (scores, tanh term): the tanh term is needed by the softcap's derivative in the backward.
    """
    if HAS_SOFTCAP:
        capped = tanh(qk * qk_scale)  # qk_scale = softmax_scale / softcap here
        s = capped * softcap_log2
    else:
        capped = qk
        s = qk * qk_scale  # qk_scale = softmax_scale * log2(e)
    if HAS_ALIBI:
        distance = tl.abs(offs_m[:, None] + (seqlen_k - seqlen_q + shift) - offs_n[None, :]).to(tl.float32)
        s = s - alibi_slope_log2 * distance
    return s, capped


@triton.jit
def key_block_bounds(start_m, seqlen_q, seqlen_k, window_left, window_right,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr, shift=0):
    """For the query rows [start_m, start_m + BLOCK_M): key blocks lo <= full_lo <= full_hi <= hi.

    [lo, full_lo) and [full_hi, hi) hold the blocks some of whose scores are masked; every score of a
    block in [full_lo, full_hi) is visible and its keys are all < seqlen_k.
    """
    offset = seqlen_k - seqlen_q + shift
    first_row = start_m
    last_row = tl.minimum(start_m + BLOCK_M, seqlen_q) - 1
    lo = 0
    hi = seqlen_k
    full_lo = 0
    full_hi = (seqlen_k // BLOCK_N) * BLOCK_N
    if WINDOW_LEFT:
        lo = tl.maximum(first_row + offset - window_left, 0)
        lo = (lo // BLOCK_N) * BLOCK_N
        full_lo = tl.maximum(last_row + offset - window_left, 0)
        full_lo = tl.cdiv(full_lo, BLOCK_N) * BLOCK_N
    if WINDOW_RIGHT:
        hi = tl.minimum(last_row + offset + window_right + 1, seqlen_k)
        full_hi = tl.minimum(first_row + offset + window_right + 1, seqlen_k)
        full_hi = tl.maximum(full_hi, 0)
        full_hi = (full_hi // BLOCK_N) * BLOCK_N
    hi = tl.maximum(hi, lo)
    full_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
    full_hi = tl.minimum(tl.maximum(full_hi, full_lo), hi)
    return lo, full_lo, full_hi, hi


@triton.jit
def query_block_bounds(start_n, seqlen_q, seqlen_k, window_left, window_right,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr, shift=0):
    """For the keys [start_n, start_n + BLOCK_N): query blocks lo <= full_lo <= full_hi <= hi.

    Query i sees key j when j - offset - right <= i <= j - offset + left. Blocks in
    [full_lo, full_hi) have every (query, key) pair visible and all their queries < seqlen_q; the
    keys themselves may run past seqlen_k, which only touches dK/dV rows that are never stored.
    """
    offset = seqlen_k - seqlen_q + shift
    first_key = start_n
    last_key = tl.minimum(start_n + BLOCK_N, seqlen_k) - 1
    lo = 0
    hi = seqlen_q
    full_lo = 0
    full_hi = (seqlen_q // BLOCK_M) * BLOCK_M
    if WINDOW_RIGHT:
        lo = tl.maximum(first_key - offset - window_right, 0)
        lo = (lo // BLOCK_M) * BLOCK_M
        full_lo = tl.maximum(last_key - offset - window_right, 0)
        full_lo = tl.cdiv(full_lo, BLOCK_M) * BLOCK_M
    if WINDOW_LEFT:
        hi = tl.minimum(last_key - offset + window_left + 1, seqlen_q)
        full_hi = tl.minimum(first_key - offset + window_left + 1, seqlen_q)
        full_hi = tl.maximum(full_hi, 0)
        full_hi = (full_hi // BLOCK_M) * BLOCK_M
    hi = tl.maximum(hi, lo)
    full_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
    full_hi = tl.minimum(tl.maximum(full_hi, full_lo), hi)
    return lo, full_lo, full_hi, hi


@triton.jit
def stage_range(STAGE: tl.constexpr, lo, full_lo, full_hi, hi):
    """The blocks of one stage of a tile's loop: 0 = boundary blocks before the interior (masked),
    1 = the interior (no masks), 2 = boundary blocks after it (masked). Callers unroll the stages
    with ``tl.static_range(3)`` and pass ``MASKED = stage != 1``."""
    if STAGE == 0:
        start = lo
        end = full_lo
    elif STAGE == 1:
        start = full_lo
        end = full_hi
    else:
        start = full_hi
        end = hi
    return start, end


@triton.jit
def sequence_bounds(CuSeqlensQ, CuSeqlensK, batch, total_q, total_k, K_PACKED: tl.constexpr):
    """Varlen: (first query token, seqlen_q, first key token, seqlen_k) of sequence ``batch``.

    Clamped into the tokens there are (``total_q``; ``total_k`` when K_PACKED, else only to be >= 0: paged keys,
    whose lengths the caller cuts at the block table's pages), so that cu_seqlens that the host did not read never
    address a token outside q, k and v."""
    q_start = tl.minimum(tl.maximum(tl.load(CuSeqlensQ + batch), 0), total_q)
    q_end = tl.minimum(tl.maximum(tl.load(CuSeqlensQ + batch + 1), q_start), total_q)
    k_start = tl.maximum(tl.load(CuSeqlensK + batch), 0)
    k_end = tl.maximum(tl.load(CuSeqlensK + batch + 1), k_start)
    if K_PACKED:
        k_start = tl.minimum(k_start, total_k)
        k_end = tl.minimum(k_end, total_k)
    return q_start, q_end - q_start, k_start, k_end - k_start


@triton.jit
def record_fault(Faults, slot: tl.constexpr, batch, bad):
    """Where ``bad``: slot ``slot`` of the fault buffer (``flashattn.faults``) takes ``batch + 1``. A store, never a
    wait: racing programs all write the number of some faulty batch element."""
    tl.store(Faults + slot, batch + 1, mask=bad)


@triton.jit
def paged_kv_rows(positions, first_position, table_row, page_size, num_pages,
                  stride_kb, stride_kn, stride_vb, stride_vn, ONE_PAGE: tl.constexpr):
    """Element offsets of the K and V rows at key ``positions`` of a paged cache, and which rows exist.

    Position p lives in page ``table_row[p // page_size]`` (``table_row`` points at the sequence's row of
    the block table, whose last dimension is contiguous), row ``p % page_size``; ``stride_*b`` step over
    pages, ``stride_*n`` over the rows of a page. ONE_PAGE: every position lies in the page of
    ``first_position`` (a block that starts on a multiple of its size, which divides page_size), so the
    table is read once for the block instead of once per row. A page index outside [0, num_pages) (refused
    on the host wherever it can be checked) is replaced by page 0 and its rows are marked missing
    (``exists`` false): callers mask them, or read page 0 (num_pages >= 1), never outside the cache.
    """
    if ONE_PAGE:
        page = tl.load(table_row + first_position // page_size)
        in_page = first_position % page_size + (positions - first_position)
        exists = tl.broadcast_to((page >= 0) & (page < num_pages), positions.shape)
    else:
        page = tl.load(table_row + positions // page_size)
        in_page = positions % page_size
        exists = (page >= 0) & (page < num_pages)
    page = tl.where(exists, page, 0).to(tl.int64)
    in_page = in_page.to(tl.int64)
    return page * stride_kb + in_page * stride_kn, page * stride_vb + in_page * stride_vn, exists


@triton.jit
def dropout_row_base(rng_offset, row, row_stride, first_key):
    """The counter of score (0, 0) of one (batch x head) slice: ``offset + row * row_stride + first_key``.

    Dense: row = bh * Sq, row_stride = Sk, first_key = 0; in a position frame Sq and Sk are the frame's
    lengths and the launcher adds the frame's start to ``offset`` (``PositionFrame.dropout_offset``).
    Varlen (the packed stream of ``dropout.py``): row = head * total_q + cu_seqlens_q[b], row_stride = total_k,
    first_key = cu_seqlens_k[b].
    """
    return rng_offset + row.to(tl.int64) * row_stride + first_key


@triton.jit
def dropout_keep(rng_seed, row_base, offs_m, offs_n, row_stride, dropout_p):
    """Keep-mask for scores (offs_m, offs_n) of one slice: counter = row_base + i * row_stride + j."""
    counter = row_base + offs_m.to(tl.int64)[:, None] * row_stride + offs_n[None, :].to(tl.int64)
    return tl.rand(rng_seed, counter) >= dropout_p


@triton.jit
def dot(a, b, UPCAST_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr):
    if UPCAST_DOT:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision=DOT_PRECISION)
    return tl.dot(a, b, input_precision=DOT_PRECISION)


@triton.jit
def dot_short_chains(a, b, CHUNK: tl.constexpr):
    """a @ b in float32, its reduction cut into CHUNK-long pieces that are summed at the end.

    Triton's float32 ("ieee") dot is one chain of FMAs along the reduction: at head dim 256 a score
    gathers ~sqrt(256) half-ulps of its partial sums, about 3x what cuBLAS's sgemm loses. Where one
    key dominates a row (ALiBi's steep slopes) that score error passes straight into the output and
    put a decode case past twice PyTorch's float32 error. Chains of CHUNK keep it under PyTorch's.
    """
    M: tl.constexpr = a.shape[0]
    K: tl.constexpr = a.shape[1]
    N: tl.constexpr = b.shape[1]
    a_pieces = tl.permute(tl.reshape(a, (M, K // CHUNK, CHUNK)), (1, 0, 2))
    b_pieces = tl.reshape(b, (K // CHUNK, CHUNK, N))
    return tl.sum(tl.dot(a_pieces, b_pieces, input_precision="ieee"), 0)


@triton.jit
def accumulate(acc, compensation, increment, COMPENSATED: tl.constexpr):
    """acc + increment, Kahan-compensated when COMPENSATED (float32 inputs).

    An accumulator that sums one tile product per block over a long sequence is a chain of
    thousands of float32 additions, and loses about sqrt(chain) ulps; PyTorch's blocked reductions
    lose less, and the float32 tests hold flashattn to within 3x of them.
    """
    if COMPENSATED:
        corrected = increment - compensation
        total = acc + corrected
        compensation = (total - acc) - corrected
        return total, compensation
    return acc + increment, compensation


@triton.jit
def apply_attn_mask(s, mask_base, stride_mask_m, stride_mask_n, offs_m, offs_n, seqlen_q, seqlen_k,
                    MASK_IS_BOOL: tl.constexpr):
    """Base-2 scores ``s`` with the SDPA mask tile at (offs_m, offs_n) applied.

    A boolean mask keeps the scores where it is True (-inf elsewhere); a float mask is a bias in
    natural-log units, added after the softcap. Broadcast dims have stride 0, so one (Lq, Lk) mask
    serves every batch and head. Scores outside the sequences read as hidden.
    """
    in_bounds = (offs_m[:, None] < seqlen_q) & (offs_n[None, :] < seqlen_k)
    ptrs = (mask_base + offs_m[:, None].to(tl.int64) * stride_mask_m
            + offs_n[None, :].to(tl.int64) * stride_mask_n)
    if MASK_IS_BOOL:
        keep = tl.load(ptrs, mask=in_bounds, other=0)  # torch.bool arrives viewed as uint8
        return tl.where(keep != 0, s, float("-inf"))
    bias = tl.load(ptrs, mask=in_bounds, other=float("-inf")).to(tl.float32)
    return s + bias * LOG2E


@triton.jit
def query_tile_key_blocks(start_m, seqlen_q, seqlen_k, window_left, window_right,
                          BlockMap, stride_map_b, stride_map_h, stride_map_row, batch, head,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr, HAS_BLOCK_MAP: tl.constexpr,
                          shift=0):
    """The key loop of the query tile at start_m (forward and dQ): (block list, lo, full_lo, full_hi, hi).

    Without a block map, :func:`key_block_bounds`' three stages over key positions. With one, only the
    key blocks with a score the SDPA mask shows, in one masked stage over positions in the list.
    """
    lo, full_lo, full_hi, hi = key_block_bounds(start_m, seqlen_q, seqlen_k, window_left, window_right,
                                                BLOCK_M, BLOCK_N, WINDOW_LEFT, WINDOW_RIGHT, shift)
    block_list = BlockMap
    if HAS_BLOCK_MAP:
        block_list, lo, hi = mapped_blocks(BlockMap, stride_map_b, stride_map_h, stride_map_row, batch, head,
                                           start_m // BLOCK_M, lo, hi, tl.cdiv(seqlen_k, BLOCK_N), BLOCK_N)
        full_lo = lo
        full_hi = hi
    return block_list, lo, full_lo, full_hi, hi


@triton.jit
def load_kt_v(kt_ptrs, v_ptrs, offs_d, key_ok, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
              CHECK_KEYS: tl.constexpr):
    """K^T (BLOCK_D x keys) and V (keys x BLOCK_D) through per-element pointers; the padding of the head
    dim loads 0, and with CHECK_KEYS so do the keys where key_ok is false (interior blocks skip it)."""
    if CHECK_KEYS:
        if BLOCK_D == HEAD_DIM:
            kt = tl.load(kt_ptrs, mask=key_ok[None, :], other=0.0)
            v = tl.load(v_ptrs, mask=key_ok[:, None], other=0.0)
        else:
            kt = tl.load(kt_ptrs, mask=key_ok[None, :] & (offs_d[:, None] < HEAD_DIM), other=0.0)
            v = tl.load(v_ptrs, mask=key_ok[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
    else:
        if BLOCK_D == HEAD_DIM:
            kt = tl.load(kt_ptrs)
            v = tl.load(v_ptrs)
        else:
            kt = tl.load(kt_ptrs, mask=offs_d[:, None] < HEAD_DIM, other=0.0)
            v = tl.load(v_ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
    return kt, v


@triton.jit
def mapped_blocks(BlockMap, stride_map_b, stride_map_h, stride_map_row, batch, head, row, lo, hi, columns,
                  BLOCK: tl.constexpr):
    """Row ``row`` of a (batch, head)'s block map (``flashattn.mask_blocks``), for a loop over [lo, hi).

    Returns (the row's list of visible blocks, first, last): the list's positions [first, last) hold
    the visible blocks inside [lo, hi), in order; ``columns`` is the number of blocks in a row.
    """
    map_row = (BlockMap + batch.to(tl.int64) * stride_map_b + head.to(tl.int64) * stride_map_h
               + row.to(tl.int64) * stride_map_row)
    first = tl.load(map_row + lo // BLOCK)  # visible blocks before block lo // BLOCK
    last = tl.load(map_row + tl.cdiv(hi, BLOCK))
    return map_row + columns + 1, first, last


@triton.jit
def online_softmax_step(
    acc, acc_comp, row_sum, row_max, qk, v, offs_m, offs_n, seqlen_q, seqlen_k,
    qk_scale, softcap_log2, alibi_slope_log2,
    window_left, window_right, dropout_p, rng_seed, rng_row_base, rng_row_stride,
    MASKED: tl.constexpr, WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr,
    UPCAST_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr, COMPENSATED: tl.constexpr, DEFER_SCALE: tl.constexpr,
    mask_base, stride_mask_m, stride_mask_n, HAS_MASK: tl.constexpr, MASK_IS_BOOL: tl.constexpr, shift=0,
):
    """Fold one key block into the running (acc, row_sum, row_max), given its raw scores qk = q k^T.

    The forward's and the decode kernel's step (the decode kernel's rows are (token, head) pairs:
    ``offs_m`` are then the rows' query tokens). Masks, ALiBi and dropout follow offs_m and offs_n.
    """
    if DEFER_SCALE:
        # plain scores with a positive scale: max(qk * scale) = max(qk) * scale, so the scale can
        # wait for exp2's argument, where scale * qk - max is one FFMA per score (not FMUL + FADD)
        s = qk
    else:
        s, _ = scores_log2(qk, offs_m, offs_n, seqlen_q, seqlen_k, qk_scale, softcap_log2,
                           alibi_slope_log2, HAS_SOFTCAP, HAS_ALIBI, shift)
    if MASKED:
        seen = visible(offs_m, offs_n, seqlen_q, seqlen_k, window_left, window_right,
                       WINDOW_LEFT, WINDOW_RIGHT, shift)
        s = tl.where(seen, s, float("-inf"))
    if HAS_MASK:
        s = apply_attn_mask(s, mask_base, stride_mask_m, stride_mask_n, offs_m, offs_n, seqlen_q, seqlen_k,
                            MASK_IS_BOOL)
    # -- online softmax: rescale what was accumulated when the running max grows --
    if DEFER_SCALE:
        new_max = tl.maximum(row_max, tl.max(s, 1) * qk_scale)
    else:
        new_max = tl.maximum(row_max, tl.max(s, 1))
    if MASKED:
        # a row that has seen no key yet keeps max = -inf; shift it by 0 to avoid inf - inf
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)
    else:
        shift = new_max
    if DEFER_SCALE:
        p = tl.math.exp2(s * qk_scale - shift[:, None])
    else:
        p = tl.math.exp2(s - shift[:, None])
    correction = tl.math.exp2(row_max - shift)
    row_sum = row_sum * correction + tl.sum(p, 1)
    if HAS_DROPOUT:
        keep = dropout_keep(rng_seed, rng_row_base, offs_m, offs_n, rng_row_stride, dropout_p)
        p = tl.where(keep, p, 0.0)
    acc = acc * correction[:, None]
    if COMPENSATED:
        acc_comp = acc_comp * correction[:, None]
        acc, acc_comp = accumulate(acc, acc_comp, dot(p.to(v.dtype), v, UPCAST_DOT, DOT_PRECISION), COMPENSATED)
    else:
        acc = acc + dot(p.to(v.dtype), v, UPCAST_DOT, DOT_PRECISION)
    return acc, acc_comp, row_sum, new_max
