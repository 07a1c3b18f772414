"""The all-to-all mode of ``flashattn.distributed`` (head-parallel, DeepSpeed-Ulysses style), and the rule that
picks a mode.

q, k and v go from sequence shards to head shards (``all_to_all.py``: every rank then holds the whole sequence
for H / W query heads and Hk / W key/value heads, which keeps GQA's grouping), one ordinary call of the library
computes the attention of those heads, and the output goes back to sequence shards. Autograd runs through the
exchanges (``autograd.SeqToHeadFunction``), the attention's backward is the library's own. The log-sum-exp goes
back the same way, without gradient.

Dropout draws the single call's mask: the group's one (seed, offset) (rank 0's, broadcast), and, since the
rank's call numbers its heads from 0, the offset moved to the rank's first head: dense counters are
``((b * H + h) * N + i) * N + j``, so head h_local of rank r in batch b starts at ``(b * H + r H/W) * N * N``
(one call per batch element when the batch is larger than 1), packed ones ``(h * total + tq) * total + tk``,
one call at ``r H/W * total * total``.
"""

from __future__ import annotations

import torch

from .all_to_all import HeadExchange, head_to_seq
from .autograd import FlashAttnFunction, FlashAttnVarlenFunction, HeadToSeqFunction, SeqToHeadFunction
from .options import AttentionOptions
from .ring import Ring, shared_rng_state

MODES = ("ring", "all_to_all", "auto")
# "auto" takes the all-to-all from this many tokens a rank: its exchanges do not overlap the compute, a cost that
# grows with the tokens as the causal compute grows with their square; below it the ring was faster (2 x H200,
# 32 / 8 heads, causal 32k tokens: 98% of ideal against 87%), from it the two tie or the all-to-all leads, with less
# memory (docs/context-parallel.md, "Choosing a mode")
ALL_TO_ALL_TOKENS_PER_RANK = 32768


def choose_mode(mode: str, nheads_k: int, world_size: int, seqlen: int) -> str:
    """"ring" or "all_to_all" for ``mode`` over a sequence (or packed batch) of ``seqlen`` tokens in all. ``auto``:
    the all-to-all when the group's size divides the number of key/value heads (every rank then gets whole GQA
    groups) and the ranks hold ``ALL_TO_ALL_TOKENS_PER_RANK`` tokens or more, the ring otherwise. Decided from the
    whole length, which every rank knows alike (docs/context-parallel.md)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(map(repr, MODES))}, got {mode!r}")
    divides = nheads_k % world_size == 0
    if mode == "auto":
        return "all_to_all" if divides and seqlen >= ALL_TO_ALL_TOKENS_PER_RANK * world_size else "ring"
    if mode == "all_to_all" and not divides:
        raise ValueError(f"mode='all_to_all' shards the heads over the group: its size ({world_size}) must divide "
                         f"the number of key/value heads (k.shape[-2] = {nheads_k}); use mode='ring' (or 'auto')")
    return mode


def _local_heads(ring: Ring, nheads: int) -> slice:
    width = nheads // ring.world_size
    return slice(ring.rank * width, (ring.rank + 1) * width)


def _shifted(rng_state: torch.Tensor, offset: int) -> torch.Tensor:
    return rng_state + torch.tensor([0, offset], dtype=rng_state.dtype)


def _lse_to_seq(lse_heads: torch.Tensor, exchange: HeadExchange) -> torch.Tensor:
    """(B, H/W, N) -> (B, H, T): the log-sum-exp of this rank's tokens, every head."""
    with torch.no_grad():
        return head_to_seq(lse_heads.transpose(1, 2).unsqueeze(-1), exchange).squeeze(-1).transpose(1, 2).contiguous()


def dense_attention(q, k, v, alibi_slopes, opts: AttentionOptions, ring: Ring):
    """(out, lse) of the local shards (B, T, H, D) by the all-to-all mode: out (B, T, H, D), lse (B, H, T)."""
    exchange = HeadExchange.of(ring, q.device)
    q_heads, k_heads, v_heads = (SeqToHeadFunction.apply(x, exchange) for x in (q, k, v))  # (B, N, H/W, D)
    heads = _local_heads(ring, q.shape[2])
    slopes = None if alibi_slopes is None else alibi_slopes[..., heads]
    if opts.dropout_p == 0:
        out, lse = FlashAttnFunction.apply(q_heads, k_heads, v_heads, slopes, opts)
    else:
        rng_state, seqlen = shared_rng_state(ring.group, q.device), ring.layout.seqlen
        parts = []
        for b in range(q.shape[0]):  # the counters of batch element b start at (b H + first head) N^2
            start = (b * q.shape[2] + heads.start) * seqlen * seqlen
            batch_slopes = slopes if slopes is None or slopes.dim() == 1 else slopes[b:b + 1]
            parts.append(FlashAttnFunction.apply(q_heads[b:b + 1], k_heads[b:b + 1], v_heads[b:b + 1], batch_slopes,
                                                 opts, None, _shifted(rng_state, start)))
        out, lse = (torch.cat(x) for x in zip(*parts, strict=True))
    return HeadToSeqFunction.apply(out, exchange), _lse_to_seq(lse, exchange)


def varlen_attention(q, k, v, cu_seqlens, alibi_slopes, opts: AttentionOptions, ring: Ring):
    """(out, lse) of the local packed shards (T, H, D) by the all-to-all mode: out (T, H, D), lse (H, T).
    ``cu_seqlens``: the whole batch's."""
    exchange = HeadExchange.of(ring, q.device)
    q_heads, k_heads, v_heads = (SeqToHeadFunction.apply(x[None], exchange)[0] for x in (q, k, v))  # (N, H/W, D)
    heads = _local_heads(ring, q.shape[1])
    slopes = None if alibi_slopes is None else alibi_slopes[..., heads]
    rng_state = None
    if opts.dropout_p > 0:
        total = ring.layout.seqlen
        rng_state = _shifted(shared_rng_state(ring.group, q.device), heads.start * total * total)
    longest = max(ring.layout.seqlens)
    out, lse = FlashAttnVarlenFunction.apply(q_heads, k_heads, v_heads, cu_seqlens, None, longest, longest, slopes,
                                             opts, rng_state)
    return HeadToSeqFunction.apply(out[None], exchange)[0], _lse_to_seq(lse[None], exchange)[0]
