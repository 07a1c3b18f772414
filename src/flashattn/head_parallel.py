"""The all-to-all mode of ``flashattn.distributed`` (head-parallel, DeepSpeed-Ulysses style), and the rule that
picks a mode.

q, k and v go from sequence shards to head shards (``all_to_all.py``: every rank then holds the whole sequence
for H / W query heads and Hk / W key/value heads, which keeps GQA's grouping), one call of the library's op
computes the attention of those heads, and the output goes back to sequence shards (the log-sum-exp too). The three
input exchanges are started together and waited for in turn; the backward does the same with dO, and dQ, dK, dV.

One call for all of the rank's heads, not a pipeline of head groups whose exchanges overlap the previous group's
compute: the groups' smaller calls cost more than the overlap won (docs/context-parallel.md, "The all-to-all mode").

Dropout draws the single call's mask: the group's one (seed, offset) (rank 0's, broadcast), and, since the call
numbers its heads from 0, the offset moved to the rank's first head: dense counters are
``((b * H + h) * N + i) * N + j``, so head h_local of rank r in batch b starts at ``(b * H + r H/W) * N * N`` (one
call per batch element when the batch is larger than 1), packed ones ``(h * total + tq) * total + tk``, one call at
``r H/W * total * total``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import all_to_all, ops
from .all_to_all import HeadExchange
from .options import AttentionOptions
from .ring import Ring

MODES = ("ring", "all_to_all", "auto")
# "auto" takes the all-to-all on one sequence from this many tokens a rank: below it the ring was faster (2 x H200,
# 32 / 8 heads, causal 32k tokens: 98% of ideal against 87%), from it the two tie or the all-to-all leads, with less
# memory (docs/context-parallel.md, "Choosing a mode")
ALL_TO_ALL_TOKENS_PER_RANK = 32768


def choose_mode(mode: str, nheads_k: int, world_size: int, seqlen: int, packed: bool = False) -> str:
    """"ring" or "all_to_all" for ``mode`` over a sequence (or, ``packed``, a packed batch) of ``seqlen`` tokens in
    all. ``auto``: on one sequence, the all-to-all when the group's size divides the number of key/value heads (every
    rank then gets whole GQA groups) and the ranks hold ``ALL_TO_ALL_TOKENS_PER_RANK`` tokens or more, the ring
    otherwise; on a packed batch the ring, whose whole documents never travel where the all-to-all exchanges every
    token. Decided from the whole length, which every rank knows alike (docs/context-parallel.md)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(map(repr, MODES))}, got {mode!r}")
    divides = nheads_k % world_size == 0
    if mode == "auto":
        long_enough = seqlen >= ALL_TO_ALL_TOKENS_PER_RANK * world_size
        return "all_to_all" if divides and long_enough and not packed else "ring"
    if mode == "all_to_all" and not divides:
        raise ValueError(f"mode='all_to_all' shards the heads over the group: its size ({world_size}) must divide "
                         f"the number of key/value heads (k.shape[-2] = {nheads_k}); use mode='ring' (or 'auto')")
    return mode


@dataclass(frozen=True)
class HeadCall:
    """What one all-to-all call computes: the exchange, the group's query heads, and, for a packed batch, the
    global cu_seqlens and the longest sequence (None, 0 for a dense batch)."""

    exchange: HeadExchange
    nheads: int  # H, the whole group's query heads
    cu_seqlens: torch.Tensor | None
    longest: int

    @classmethod
    def of(cls, ring: Ring, q: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> HeadCall:
        batch = 1 if cu_seqlens is not None else q.shape[0]
        longest = max(ring.layout.seqlens) if cu_seqlens is not None else 0
        return cls(HeadExchange.of(ring, q.device, batch), q.shape[-2], cu_seqlens, longest)

    def heads(self) -> slice:
        """This rank's query heads, global indices."""
        per_rank = self.nheads // self.exchange.world_size
        return slice(self.exchange.rank * per_rank, (self.exchange.rank + 1) * per_rank)


def _batched(x: torch.Tensor, call: HeadCall) -> torch.Tensor:
    """A packed (T, H, D) tensor as a batch of one; a dense one as it is."""
    return x[None] if call.cu_seqlens is not None else x


def _pieces(call: HeadCall, batch: int, seqlen: int, alibi_slopes, rng_state):
    """The op calls: (batch rows, ALiBi slopes, dropout (seed, offset)) each. One call, but one per batch element
    with dropout on a dense batch of more than one (the counters of element b start at (b H + r H/W) N^2)."""
    heads = call.heads()
    slopes = None if alibi_slopes is None else alibi_slopes[..., heads]
    if rng_state is None:
        return [(slice(None), slopes, None)]
    if call.cu_seqlens is not None:
        return [(slice(None), slopes, _shifted(rng_state, heads.start * seqlen * seqlen))]
    return [(slice(b, b + 1), slopes if slopes is None or slopes.dim() == 1 else slopes[b:b + 1],
             _shifted(rng_state, (b * call.nheads + heads.start) * seqlen * seqlen)) for b in range(batch)]


def _shifted(rng_state: torch.Tensor, offset: int) -> torch.Tensor:
    return rng_state + torch.tensor([0, offset], dtype=rng_state.dtype)


def _attend(qh, kh, vh, slopes, rng_state, opts: AttentionOptions, call: HeadCall):
    """(out, lse) of head-sharded (B, N, h, D) inputs: out (B, N, h, D), lse (B, h, N)."""
    if call.cu_seqlens is not None:
        out, lse = ops.eager_call(ops.varlen_attention_forward, ops.varlen_attention_forward_cuda, qh[0], kh[0],
                                  vh[0], call.cu_seqlens, call.cu_seqlens, call.longest, call.longest, slopes,
                                  rng_state, *opts.op_arguments())
        return out[None], lse[None]
    return ops.eager_call(ops.attention_forward, ops.attention_forward_cuda, qh, kh, vh, slopes, rng_state,
                          *opts.op_arguments(), None)


def _gradients(dout, qh, kh, vh, out, lse, slopes, rng_state, opts: AttentionOptions, call: HeadCall):
    """(dq, dk, dv) of head-sharded (B, N, h, D) tensors."""
    if call.cu_seqlens is not None:
        grads = ops.eager_call(ops.varlen_attention_backward, ops.varlen_attention_backward_cuda, dout[0], qh[0],
                               kh[0], vh[0], out[0], lse[0], call.cu_seqlens, call.cu_seqlens, call.longest,
                               call.longest, slopes, rng_state, *opts.op_arguments())
        return tuple(g[None] for g in grads)
    dq, dk, dv, _ = ops.eager_call(ops.attention_backward, ops.attention_backward_cuda, dout, qh, kh, vh, out, lse,
                                   slopes, rng_state, *opts.op_arguments(), None, False, opts.frame_argument(),
                                   opts.deterministic)
    return dq, dk, dv


def forward(q, k, v, alibi_slopes, rng_state, opts: AttentionOptions, call: HeadCall):
    """(out, lse, saved) of the local shards (dense (B, T, H, D), packed (T, H, D)): out like q, lse (B, H, T)
    (packed: (H, T)), and the head-sharded tensors the backward needs."""
    exchange = call.exchange
    q, k, v = (_batched(x, call) for x in (q, k, v))
    arriving = [all_to_all.start_seq_to_head(x, exchange) for x in (q, k, v)]
    # each exchange's buffers go as soon as it is finished (popped), not held through the call
    qh, kh, vh = (all_to_all.finish_seq_to_head(arriving.pop(0), exchange) for _ in range(3))
    parts = [_attend(qh[rows], kh[rows], vh[rows], slopes, rng, opts, call)
             for rows, slopes, rng in _pieces(call, q.shape[0], qh.shape[1], alibi_slopes, rng_state)]
    out, lse = (torch.cat(x) if len(parts) > 1 else x[0] for x in zip(*parts, strict=True))
    saved = [qh, kh, vh, out, lse]
    out, lse = all_to_all.head_to_seq(out, exchange), _lse_to_seq(lse, exchange)
    if call.cu_seqlens is not None:
        out, lse = out[0], lse[0]
    return out, lse, saved


def backward(dout, saved, alibi_slopes, rng_state, opts: AttentionOptions, call: HeadCall):
    """(dq, dk, dv) of the local shards, from :func:`forward`'s ``saved``."""
    exchange = call.exchange
    qh, kh, vh, out, lse = saved
    douth = all_to_all.seq_to_head(_batched(dout, call), exchange)
    parts = [_gradients(douth[rows], qh[rows], kh[rows], vh[rows], out[rows], lse[rows], slopes, rng, opts, call)
             for rows, slopes, rng in _pieces(call, douth.shape[0], qh.shape[1], alibi_slopes, rng_state)]
    grads = [torch.cat(x) if len(parts) > 1 else x[0] for x in zip(*parts, strict=True)]
    del douth, parts
    leaving = []
    while grads:  # each gradient goes once its send buffer is filled, each exchange's buffers once finished
        leaving.append(all_to_all.start_head_to_seq(grads.pop(0), exchange))
    dq, dk, dv = (all_to_all.finish_head_to_seq(leaving.pop(0), exchange) for _ in range(3))
    if call.cu_seqlens is not None:
        dq, dk, dv = dq[0], dk[0], dv[0]
    return dq, dk, dv


def _lse_to_seq(lse_heads: torch.Tensor, exchange: HeadExchange) -> torch.Tensor:
    """(B, H/W, N) -> (B, H, T): the log-sum-exp of this rank's tokens, every head."""
    return all_to_all.head_to_seq(lse_heads.transpose(1, 2).unsqueeze(-1), exchange).squeeze(-1).transpose(1, 2) \
        .contiguous()
