"""Blocked attention in plain PyTorch: the CPU path (and ``FLASHATTN_BACKEND=torch`` anywhere).

Same semantics as the Triton kernels, in float32, tile by tile: a tile is BLOCK_M queries against
BLOCK_N keys, over every batch and head at once. The forward walks the query blocks, and for each one
its key blocks with the online softmax, writing the block's output and log-sum-exp straight into the
results; the backward walks the key blocks, and for each one the query blocks that see it, recomputing
the probabilities from the saved log-sum-exp. No seqlen_q x seqlen_k tensor is ever built, and no
float32 copy of a whole q, k, v or output either: inputs are converted a block at a time.

Extra memory, besides the results: the float32 log-sum-exp (forward) and the float32 dq accumulator
(backward, of q's size: none when q is float32, where the accumulator is dq itself), which grow as
seqlen; and a working set of a few tiles, (batch, heads, BLOCK_M, BLOCK_N) float32 scores and
(batch, heads, BLOCK_M, head_dim) float32 rows, which does not. BLOCK_M is chosen so that a score tile
holds at most TILE_ELEMENTS elements (4 MiB; at least MIN_BLOCK_M rows), so the working set grows with
seqlen_q only up to BLOCK_M queries and is constant beyond. An SDPA mask is read one tile at a time,
through a broadcast view; its gradient (when asked for) has the mask's own shape.
"""

from __future__ import annotations

import functools
import itertools
from typing import NamedTuple

import torch

from . import masks
from .dropout import StreamFrame, keep_mask
from .options import AttentionOptions

BLOCK_N = 128  # keys per tile
TILE_ELEMENTS = 1 << 20  # float32 scores in a (batch, heads, BLOCK_M, BLOCK_N) tile: 4 MiB
MIN_BLOCK_M = 64  # queries per tile at least, however many batches and heads share it


def block_m(batch: int, nheads: int) -> int:
    """Queries per tile: as many as keep a score tile within TILE_ELEMENTS, a multiple of MIN_BLOCK_M."""
    rows = TILE_ELEMENTS // (max(1, batch * nheads) * BLOCK_N)
    return max(MIN_BLOCK_M, rows // MIN_BLOCK_M * MIN_BLOCK_M)


@functools.cache
def _settle_exp_kernel() -> None:
    """One throwaway exp before the first real one.

    With torch 2.13 (CPU build, AVX512, 2 threads) the first large float32 ``torch.exp`` of a process
    returned values off by up to 1e-4 relative in about one run in seven, always the same wrong values,
    and every later call was right: it looks like a race in the kernel's lazy setup. A first call on a
    scratch tensor large enough to run in parallel made 40 of 40 runs exact.
    """
    torch.exp(torch.zeros(1 << 17))


def _heads_first(x: torch.Tensor, nheads_k: int) -> torch.Tensor:
    """(B, S, H, D) -> float32 (B, Hk, H // Hk, S, D): a query head's group is its kv head."""
    batch, seqlen, nheads, head_dim = x.shape
    return x.transpose(1, 2).float().reshape(batch, nheads_k, nheads // nheads_k, seqlen, head_dim)


def _grouped_mask(attn_mask: torch.Tensor | None, q_shape: torch.Size, seqlen_k: int) -> torch.Tensor | None:
    """The SDPA mask as a broadcast view (B, Hk, G, Sq, Sk), matching the grouped queries. No copy."""
    if attn_mask is None:
        return None
    batch, nheads_k, group, seqlen_q = q_shape[:4]
    full = attn_mask.expand(batch, nheads_k * group, seqlen_q, seqlen_k)
    return full.unflatten(1, (nheads_k, group))


def _block_scores(
    q: torch.Tensor,
    k_block: torch.Tensor,
    key_idx: torch.Tensor,
    opts: AttentionOptions,
    alibi_slopes: torch.Tensor | None,
    seqlen_q: int,
    seqlen_k: int,
    mask_block: torch.Tensor | None = None,
    query_start: int = 0,
    fully_visible: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Scores of the queries ``query_start, ...`` (q's rows, already multiplied by the softmax scale) against
    one key block: (scores, tanh of the softcap or None). ``fully_visible``: every one of these queries sees
    every key of the block.

    ``mask_block``: the SDPA mask for these rows and keys, (B, Hk, G, rows, n) broadcast; a bool mask hides
    the scores where it is False, a float mask is added after the softcap.
    """
    raw = q @ k_block.unsqueeze(2).transpose(-1, -2)
    capped = None
    if opts.softcap > 0:
        capped = torch.tanh(raw / opts.softcap)
        raw = opts.softcap * capped
    query_end = query_start + q.shape[-2]
    query_idx = torch.arange(query_start, query_end, device=q.device).view(-1, 1)
    shift = opts.diagonal_shift(seqlen_q, seqlen_k)
    if alibi_slopes is not None:
        batch, nheads_k, group = q.shape[:3]
        slopes = alibi_slopes.view(batch, nheads_k, group, 1, 1)
        raw = raw - slopes * masks.alibi_distance(query_idx, key_idx, seqlen_q, seqlen_k, shift)
    if mask_block is not None:
        raw = raw.masked_fill(~mask_block, float("-inf")) if mask_block.dtype == torch.bool else raw + mask_block
    if fully_visible:
        return raw, capped
    seen = masks.visible(query_idx, key_idx, seqlen_q, seqlen_k, opts.window_left, opts.window_right, shift)
    return raw.masked_fill(~seen, float("-inf")), capped


def _dropout_frame(opts: AttentionOptions, frame: StreamFrame | None) -> StreamFrame | None:
    """The dropout stream's frame: a varlen sequence's, or the position frame's (a call of a larger problem)."""
    if opts.frame is None:
        return frame
    assert frame is None, "a varlen sequence has no position frame"
    return StreamFrame(opts.frame.query_start, opts.frame.key_start, opts.frame.seqlen_q, opts.frame.seqlen_k)


def _block_keep(rng_state, opts, q_shape, rows: slice, key_idx, seqlen_q, seqlen_k, frame) -> torch.Tensor:
    batch, nheads_k, group = q_shape[:3]
    query_idx = torch.arange(rows.start, rows.stop, device=key_idx.device)
    keep = keep_mask(rng_state, opts.dropout_p, batch, nheads_k * group, query_idx, key_idx.view(-1),
                     seqlen_q, seqlen_k, frame=frame)
    return keep.view(batch, nheads_k, group, len(query_idx), -1)


def _expand_slopes(alibi_slopes: torch.Tensor | None, batch: int, nheads: int) -> torch.Tensor | None:
    if alibi_slopes is None:
        return None
    return alibi_slopes.float().expand(batch, nheads)


def _mask_block(mask: torch.Tensor | None, rows: slice, start: int, end: int) -> torch.Tensor | None:
    """The grouped mask's rows and key block, float masks in float32."""
    if mask is None:
        return None
    block = mask[..., rows, start:end]
    return block if block.dtype == torch.bool else block.float()


def forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    opts: AttentionOptions,
    alibi_slopes: torch.Tensor | None,
    rng_state: torch.Tensor | None,
    attn_mask: torch.Tensor | None = None,
    dropout_frame: StreamFrame | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q: (B, Sq, Hq, D), k/v: (B, Sk, Hk, D) -> out (B, Sq, Hq, D), lse float32 (B, Hq, Sq).

    ``attn_mask``: optional SDPA mask, 4 dims broadcastable to (B, Hq, Sq, Sk).
    ``dropout_frame`` places a single sequence of a varlen batch in the packed dropout stream. A position frame
    (``opts.frame``) places the call in a larger problem: its masks, ALiBi and dropout stream.
    """
    _settle_exp_kernel()
    dropout_frame = _dropout_frame(opts, dropout_frame)
    batch, seqlen_q, nheads, head_dim = q.shape
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    grouped = (batch, nheads_k, nheads // nheads_k)  # a query head's group is its kv head
    slopes = _expand_slopes(alibi_slopes, batch, nheads)
    mask = _grouped_mask(attn_mask, (*grouped, seqlen_q), seqlen_k)
    # rows that see no key keep out = 0 and lse = +inf
    out = torch.zeros_like(q, memory_format=torch.contiguous_format)
    lse = torch.full((batch, nheads, seqlen_q), float("inf"), device=q.device)
    rows_per_block = block_m(batch, nheads)
    by_query_block: dict[int, list[Tile]] = {}
    for tile in _tiles(seqlen_q, seqlen_k, opts, rows_per_block):
        by_query_block.setdefault(tile.query_block, []).append(tile)
    for first, tiles in sorted(by_query_block.items()):
        block = slice(first, min(first + rows_per_block, seqlen_q))
        # -- the block's state: queries scaled once (a view of q when it is float32: not in place) --
        qf = _heads_first(q[:, block], nheads_k) * opts.softmax_scale
        row_max = torch.full(qf.shape[:-1], float("-inf"), device=q.device)
        row_sum = torch.zeros_like(row_max)
        acc = torch.zeros_like(qf)
        for tile in tiles:
            local = slice(tile.rows.start - first, tile.rows.stop - first)
            key_idx = torch.arange(tile.start, tile.end, device=q.device).view(1, -1)
            k_block = k[:, tile.start : tile.end].transpose(1, 2).float()  # (B, Hk, n, D)
            v_block = v[:, tile.start : tile.end].transpose(1, 2).float()
            scores, _ = _block_scores(qf[..., local, :], k_block, key_idx, opts, slopes, seqlen_q, seqlen_k,
                                      _mask_block(mask, tile.rows, tile.start, tile.end), tile.rows.start,
                                      tile.fully_visible)
            # -- online softmax: rescale what the block holds to the new row maxima --
            seen_max = row_max[..., local]
            new_max = torch.maximum(seen_max, scores.amax(dim=-1))
            shift = new_max.masked_fill(new_max == float("-inf"), 0.0)  # rows with nothing seen yet
            probs = scores.sub_(shift.unsqueeze(-1)).exp_()  # scores is this tile's own tensor
            correction = torch.exp(seen_max - shift)
            row_sum[..., local].mul_(correction).add_(probs.sum(dim=-1))
            if opts.dropout_p > 0:
                keep = _block_keep(rng_state, opts, grouped, tile.rows, key_idx, seqlen_q, seqlen_k, dropout_frame)
                probs = probs.masked_fill(~keep, 0.0)
            acc[..., local, :].mul_(correction.unsqueeze(-1)).add_(probs @ v_block.unsqueeze(2))
            row_max[..., local] = new_max
        # -- the block's results, written in place: out in q's layout and dtype --
        empty = row_sum == 0
        out_block = acc.div_(row_sum.masked_fill(empty, 1.0).unsqueeze(-1))
        if opts.dropout_p > 0:
            out_block.div_(1.0 - opts.dropout_p)
        rows = block.stop - block.start
        out[:, block] = out_block.reshape(batch, nheads, rows, head_dim).transpose(1, 2)
        lse[:, :, block] = (row_max + torch.log(row_sum)).masked_fill(empty, float("inf")).reshape(batch, nheads, rows)
    return out, lse


def backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    opts: AttentionOptions,
    alibi_slopes: torch.Tensor | None,
    rng_state: torch.Tensor | None,
    attn_mask: torch.Tensor | None = None,
    mask_needs_grad: bool = False,
    dropout_frame: StreamFrame | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (dq, dk, dv, dmask) recomputed tile by tile from the saved log-sum-exp.

    Each key block gathers its dk and dv over the query blocks that see it; dq gathers over key blocks in
    a float32 accumulator of q's layout. dmask, the gradient of a float ``attn_mask`` in its own shape and
    dtype, is computed when ``mask_needs_grad``; otherwise it is an empty tensor. ``dropout_frame``: as in
    :func:`forward`, and so is ``opts.frame``.
    """
    _settle_exp_kernel()
    dropout_frame = _dropout_frame(opts, dropout_frame)
    batch, seqlen_q, nheads, head_dim = q.shape
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    grouped = (batch, nheads_k, nheads // nheads_k)
    slopes = _expand_slopes(alibi_slopes, batch, nheads)
    mask = _grouped_mask(attn_mask, (*grouped, seqlen_q), seqlen_k)
    dmask = torch.zeros(attn_mask.shape, dtype=torch.float32, device=q.device) if mask_needs_grad else None
    rows_per_block = block_m(batch, nheads)
    lse_f = lse.view(*grouped, seqlen_q)
    delta = torch.empty_like(lse_f)  # rowsum(dO * O), a query block at a time
    for first in range(0, seqlen_q, rows_per_block):
        block = slice(first, first + rows_per_block)
        delta[..., block] = (_heads_first(dout[:, block], nheads_k) * _heads_first(out[:, block], nheads_k)).sum(-1)
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)  # q's layout: the result, when q is float32
    dq_grouped = dq.transpose(1, 2).unflatten(1, grouped[1:])  # a (B, Hk, G, Sq, D) view
    dk = torch.zeros(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.zeros(v.shape, dtype=v.dtype, device=v.device)
    keep_scale = 1.0 / (1.0 - opts.dropout_p)
    for (start, end), tiles in itertools.groupby(_tiles(seqlen_q, seqlen_k, opts, rows_per_block),
                                                 key=lambda tile: (tile.start, tile.end)):
        key_idx = torch.arange(start, end, device=q.device).view(1, -1)
        k_block = k[:, start:end].transpose(1, 2).float()
        v_block = v[:, start:end].transpose(1, 2).float()
        dk_block = torch.zeros(batch, nheads_k, end - start, head_dim, device=q.device)
        dv_block = torch.zeros_like(dk_block)
        for tile in tiles:
            rows = tile.rows
            q_rows = _heads_first(q[:, rows], nheads_k) * opts.softmax_scale  # as in forward; dq scales at the end
            do_rows = _heads_first(dout[:, rows], nheads_k)
            scores, capped = _block_scores(q_rows, k_block, key_idx, opts, slopes, seqlen_q, seqlen_k,
                                           _mask_block(mask, rows, start, end), rows.start, tile.fully_visible)
            probs = scores.sub_(lse_f[..., rows].unsqueeze(-1)).exp_()  # masked scores and empty rows give 0
            dprobs = do_rows @ v_block.unsqueeze(2).transpose(-1, -2)
            if opts.dropout_p > 0:
                keep = _block_keep(rng_state, opts, grouped, rows, key_idx, seqlen_q, seqlen_k, dropout_frame)
                kept_probs = probs.masked_fill(~keep, 0.0) * keep_scale
                dprobs = dprobs.masked_fill(~keep, 0.0) * keep_scale
            else:
                kept_probs = probs
            dscores = dprobs.sub_(delta[..., rows].unsqueeze(-1)).mul_(probs)
            if dmask is not None:
                # the mask is added after the softcap: its gradient is dS before the softcap's derivative
                _accumulate_mask_grad(dmask, dscores.flatten(1, 2), rows, start, end)
            if capped is not None:
                dscores.mul_(1.0 - capped * capped)
            dq_grouped[..., rows, :] += dscores @ k_block.unsqueeze(2)
            # sum over the query heads that share each kv head
            dk_block += (dscores.transpose(-1, -2) @ q_rows).sum(dim=2)
            dv_block += (kept_probs.transpose(-1, -2) @ do_rows).sum(dim=2)
        dk[:, start:end] = dk_block.transpose(1, 2)
        dv[:, start:end] = dv_block.transpose(1, 2)
    dq = dq.mul_(opts.softmax_scale).to(q.dtype)  # no copy when q is float32
    dmask = dmask.to(attn_mask.dtype) if dmask is not None else q.new_empty(0)
    return dq, dk, dv, dmask


def _accumulate_mask_grad(dmask: torch.Tensor, dscores: torch.Tensor, rows: slice, start: int, end: int) -> None:
    """Add one block's dS (B, Hq, rows, n) into ``dmask``, summed over the dims the mask broadcasts."""
    target = dmask if dmask.shape[2] == 1 else dmask[:, :, rows]  # a view: += writes into dmask
    if dmask.shape[3] == 1:
        target += masks.sum_to_shape(dscores, target.shape)
    else:
        target[..., start:end] += masks.sum_to_shape(dscores, (*target.shape[:3], end - start))


class Tile(NamedTuple):
    """Keys [start, end) against ``rows``, the queries of the block that starts at ``query_block`` that see at
    least one of those keys; ``fully_visible``: each of them sees every one of the keys (no mask to apply)."""

    query_block: int
    start: int
    end: int
    rows: slice
    fully_visible: bool


def _tiles(seqlen_q: int, seqlen_k: int, opts: AttentionOptions, rows_per_block: int) -> list[Tile]:
    """The tiles that some query sees, key block by key block, each one's query blocks in order. The queries
    that see none of a key block's keys are not computed there (their scores would all be hidden): about
    half the work under a causal mask."""
    shift = opts.diagonal_shift(seqlen_q, seqlen_k)
    key_lo, key_hi = masks.visible_key_range(seqlen_q, seqlen_k, opts.window_left, opts.window_right, shift)
    tiles = []
    for start in range(key_lo, key_hi, BLOCK_N):
        end = min(start + BLOCK_N, key_hi)
        query_lo, query_hi = masks.visible_query_range(start, end, seqlen_q, seqlen_k, opts.window_left,
                                                       opts.window_right, shift)
        for block in range(query_lo - query_lo % rows_per_block, query_hi, rows_per_block):
            lo, hi = max(query_lo, block), min(query_hi, block + rows_per_block)
            fully_visible = masks.block_fully_visible(lo, hi, start, end, seqlen_q, seqlen_k, opts.window_left,
                                                      opts.window_right, shift)
            tiles.append(Tile(block, start, end, slice(lo, hi), fully_visible))
    return tiles


# ---------------------------------------------------------------------------------------------
# Varlen: one dense call per sequence. cu_seqlens arrive as host lists (the op reads them once).
# ---------------------------------------------------------------------------------------------


def _sequences(cu_seqlens_q: list[int], cu_seqlens_k: list[int], alibi_slopes: torch.Tensor | None):
    """(b, query slice, key slice, that sequence's ALiBi slopes) for each sequence with queries and keys."""
    for b in range(len(cu_seqlens_q) - 1):
        queries = slice(cu_seqlens_q[b], cu_seqlens_q[b + 1])
        keys = slice(cu_seqlens_k[b], cu_seqlens_k[b + 1])
        if queries.start == queries.stop or keys.start == keys.stop:
            continue  # nothing to compute: no output rows, or rows that see no key (out = 0, lse = +inf)
        slopes = alibi_slopes[b] if alibi_slopes is not None and alibi_slopes.dim() == 2 else alibi_slopes
        yield b, queries, keys, slopes


def paged_rows(pool: torch.Tensor, table_row: torch.Tensor, length: int) -> torch.Tensor:
    """The first ``length`` rows of a sequence in a paged pool (num_pages, page_size, ...), gathered in order."""
    page_size = pool.shape[1]
    pages = table_row[: -(-length // page_size)].long()
    return pool[pages].flatten(0, 1)[:length]


def varlen_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: list[int],
    cu_seqlens_k: list[int],
    opts: AttentionOptions,
    alibi_slopes: torch.Tensor | None,
    rng_state: torch.Tensor | None,
    block_table: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q: (total_q, Hq, D), k/v: (total_k, Hk, D) -> out (total_q, Hq, D), lse float32 (Hq, total_q).

    With ``block_table`` (batch, max_pages), k and v are page pools (num_pages, page_size, Hk, D): each
    sequence's keys are gathered through its row of the table, and then attended to exactly as packed keys
    would be (the dropout stream included: key j of sequence b is packed key ``cu_seqlens_k[b] + j``).
    """
    total_q, nheads = q.shape[:2]
    out = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.full((nheads, total_q), float("inf"), dtype=torch.float32, device=q.device)
    for b, queries, keys, slopes in _sequences(cu_seqlens_q, cu_seqlens_k, alibi_slopes):
        frame = StreamFrame(queries.start, keys.start, total_q, cu_seqlens_k[-1])
        if block_table is None:
            seq_k, seq_v = k[keys], v[keys]
        else:
            length = keys.stop - keys.start
            seq_k, seq_v = paged_rows(k, block_table[b], length), paged_rows(v, block_table[b], length)
        seq_out, seq_lse = forward(q[None, queries], seq_k[None], seq_v[None], opts, slopes, rng_state,
                                  dropout_frame=frame)
        out[queries] = seq_out[0]
        lse[:, queries] = seq_lse[0]
    return out, lse


def varlen_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    cu_seqlens_q: list[int],
    cu_seqlens_k: list[int],
    opts: AttentionOptions,
    alibi_slopes: torch.Tensor | None,
    rng_state: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (dq, dk, dv) of the packed tensors; tokens of sequences with nothing to see get 0."""
    dq, dk, dv = (torch.zeros(x.shape, dtype=x.dtype, device=x.device) for x in (q, k, v))
    for _, queries, keys, slopes in _sequences(cu_seqlens_q, cu_seqlens_k, alibi_slopes):
        frame = StreamFrame(queries.start, keys.start, q.shape[0], k.shape[0])
        seq_lse = lse[None, :, queries].contiguous()
        seq_dq, seq_dk, seq_dv, _ = backward(
            dout[None, queries], q[None, queries], k[None, keys], v[None, keys], out[None, queries], seq_lse,
            opts, slopes, rng_state, dropout_frame=frame,
        )
        dq[queries], dk[keys], dv[keys] = seq_dq[0], seq_dk[0], seq_dv[0]
    return dq, dk, dv
