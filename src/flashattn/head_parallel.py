"""The all-to-all mode of ``flashattn.distributed`` (head-parallel, DeepSpeed-Ulysses style), and the rule that
picks a mode.

q, k and v go from sequence shards to head shards (``all_to_all.py``: every rank then holds the whole sequence
for H / W query heads and Hk / W key/value heads, which keeps GQA's grouping), ordinary calls of the library's ops
compute the attention of those heads, and the output goes back to sequence shards (the log-sum-exp too).

Pipelined by head groups: the rank's Hk / W key/value heads are cut into G groups (``groups``: up to ``GROUPS``),
each with its query heads. Every group's q, k, v exchange is started at once; the attention of group g waits only
for its own, and its output starts back while group g + 1 computes. The backward does the same with dO and dQ,
dK, dV. Only the first group's inputs and the last group's outputs wait with nothing to overlap them; on NCCL the
exchanges run on the communicator's stream beside the compute.

Dropout draws the single call's mask: the group's one (seed, offset) (rank 0's, broadcast), and, since each call
numbers its heads from 0, the offset moved to the call's first head: dense counters are
``((b * H + h) * N + i) * N + j``, so head h_local of a call starting at global head h0 in batch b starts at
``(b * H + h0) * N * N`` (one call per batch element when the batch is larger than 1), packed ones
``(h * total + tq) * total + tk``, one call at ``h0 * total * total``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import all_to_all, ops
from .all_to_all import HeadExchange
from .options import AttentionOptions
from .ring import Ring

MODES = ("ring", "all_to_all", "auto")
# "auto" takes the all-to-all from this many tokens a rank: below it the ring was faster (2 x H200, 32 / 8 heads,
# causal 32k tokens: 98% of ideal against 87%), from it the two tie or the all-to-all leads, with less memory
# (docs/context-parallel.md, "Choosing a mode")
ALL_TO_ALL_TOKENS_PER_RANK = 32768
# the most head groups the exchanges are pipelined in: each group's exchange overlaps the previous group's attention,
# and smaller groups leave less exposed at the two ends, at the cost of more, smaller collectives
GROUPS = 4


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


def groups(nheads_k: int, world_size: int) -> int:
    """The head groups of the pipeline: the largest divisor of a rank's key/value heads up to ``GROUPS``."""
    local = nheads_k // world_size
    return max(g for g in range(1, min(GROUPS, local) + 1) if local % g == 0)


@dataclass(frozen=True)
class HeadCall:
    """What one all-to-all call computes: the exchange, the group's heads, and, for a packed batch, the global
    cu_seqlens and the longest sequence (None, 0 for a dense batch)."""

    exchange: HeadExchange
    nheads: int  # H, the whole group's query heads
    groups: int
    cu_seqlens: torch.Tensor | None
    longest: int

    @classmethod
    def of(cls, ring: Ring, q: torch.Tensor, nheads_k: int, cu_seqlens: torch.Tensor | None = None) -> HeadCall:
        batch = 1 if cu_seqlens is not None else q.shape[0]
        longest = max(ring.layout.seqlens) if cu_seqlens is not None else 0
        return cls(HeadExchange.of(ring, q.device, batch), q.shape[-2], groups(nheads_k, ring.world_size),
                   cu_seqlens, longest)

    def first_head(self, group: int) -> int:
        """The global index of this rank's first query head of head group ``group``."""
        per_rank = self.nheads // self.exchange.world_size
        return self.exchange.rank * per_rank + group * (per_rank // self.groups)


def _batched(x: torch.Tensor, call: HeadCall) -> torch.Tensor:
    """A packed (T, H, D) tensor as a batch of one; a dense one as it is."""
    return x[None] if call.cu_seqlens is not None else x


def _pieces(call: HeadCall, group: int, batch: int, seqlen: int, alibi_slopes, rng_state):
    """The op calls of one head group: (batch rows, ALiBi slopes, dropout (seed, offset)) each. One call, but one per
    batch element with dropout on a dense batch of more than one (the counters of element b start at (b H + h0)
    N^2)."""
    heads = slice(call.first_head(group), call.first_head(group) + call.nheads // call.exchange.world_size
                  // call.groups)
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
    exchange, count = call.exchange, call.groups
    q, k, v = (_batched(x, call) for x in (q, k, v))
    arriving = [[all_to_all.start_seq_to_head(x, exchange, g, count) for x in (q, k, v)] for g in range(count)]
    leaving, saved, lses = [], [], []
    for g in range(count):
        qh, kh, vh = (all_to_all.finish_seq_to_head(p, exchange) for p in arriving[g])
        arriving[g] = None  # the send buffers go once the collectives are waited for
        parts = [_attend(qh[rows], kh[rows], vh[rows], slopes, rng, opts, call)
                 for rows, slopes, rng in _pieces(call, g, q.shape[0], qh.shape[1], alibi_slopes, rng_state)]
        out, lse = (torch.cat(x) if len(parts) > 1 else x[0] for x in zip(*parts, strict=True))
        leaving.append(all_to_all.start_head_to_seq(out, exchange))
        saved += [qh, kh, vh, out, lse]
        lses.append(lse)
    out = torch.empty_like(q)
    for g, pending in enumerate(leaving):
        all_to_all.finish_head_to_seq(pending, exchange, out, g, count)
    lse = _lse_to_seq(torch.cat(lses, dim=1), exchange)
    if call.cu_seqlens is not None:
        out, lse = out[0], lse[0]
    return out, lse, saved


def backward(dout, saved, alibi_slopes, rng_state, opts: AttentionOptions, call: HeadCall, k_shape):
    """(dq, dk, dv) of the local shards, from :func:`forward`'s ``saved``; ``k_shape``: the local k's shape."""
    exchange, count = call.exchange, call.groups
    dout = _batched(dout, call)
    arriving = [all_to_all.start_seq_to_head(dout, exchange, g, count) for g in range(count)]
    leaving = []
    for g in range(count):
        douth = all_to_all.finish_seq_to_head(arriving[g], exchange)
        arriving[g] = None
        qh, kh, vh, out, lse = saved[5 * g:5 * g + 5]
        parts = [_gradients(douth[rows], qh[rows], kh[rows], vh[rows], out[rows], lse[rows], slopes, rng, opts, call)
                 for rows, slopes, rng in _pieces(call, g, dout.shape[0], qh.shape[1], alibi_slopes, rng_state)]
        grads = [torch.cat(x) if len(parts) > 1 else x[0] for x in zip(*parts, strict=True)]
        leaving.append([all_to_all.start_head_to_seq(grad, exchange) for grad in grads])
    dq = torch.empty_like(dout)
    dk, dv = (_batched(dout.new_empty(k_shape), call) for _ in range(2))
    for g, pendings in enumerate(leaving):
        for pending, grad in zip(pendings, (dq, dk, dv), strict=True):
            all_to_all.finish_head_to_seq(pending, exchange, grad, g, count)
    if call.cu_seqlens is not None:
        dq, dk, dv = dq[0], dk[0], dv[0]
    return dq, dk, dv


def _lse_to_seq(lse_heads: torch.Tensor, exchange: HeadExchange) -> torch.Tensor:
    """(B, H/W, N) -> (B, H, T): the log-sum-exp of this rank's tokens, every head."""
    return all_to_all.head_to_seq(lse_heads.transpose(1, 2).unsqueeze(-1), exchange).squeeze(-1).transpose(1, 2) \
        .contiguous()
