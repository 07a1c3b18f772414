"""Ring attention over packed (varlen) batches: ``ring.py``'s ring over the sequences too long to stay on one rank.

Layout (:class:`PackedLayout`): a sequence whose attention is a small share of a rank's load stays whole on one
rank, placed so that every rank gets about as much attention and as many tokens (:func:`place_sequences`); a longer
one is cut into 2W chunks as ``ring.ZigzagLayout`` cuts a dense sequence (two sizes one token apart when 2W does
not divide ``N_b``, nothing padded), rank r holding chunks r and 2W-1-r. A rank holds its parts of the cut
sequences first, then its whole sequences: only the first part travels the ring, and a whole sequence's K/V and
dK/dV never leave its rank. A rank's packed shard is itself a packed batch, with local cu_seqlens of its own; a
sequence a rank does not hold is an empty segment there.

Steps. Without position-dependent options each step is **one** varlen call over the whole received K/V and the local
q: all of it at the own step, only the cut sequences' rows (the first the rank holds) at the others, so that the
whole sequences' rows, which receive nothing, cost neither the call nor the merge and dQ's sum. The step kinds of
``ring.py`` become per-sequence segments, and the keys or queries a step must not pair are put in segments of their
own facing an empty side, which the kernels skip (no compute, weight 0 in the merge, gradient 0). For ``src < r``
under a causal mask sequence b's segments are (every local query, the first received chunk) and (no query, the
second received chunk); for ``src > r``, (the first local chunk, no key) and (the second local chunk, every received
key). A window, ALiBi and dropout need global positions, which the varlen kernels do not take: then each (sequence,
query chunk, key chunk) pair is a dense call of batch 1 with a position frame in the whole packed stream
(``options.PositionFrame`` at ``cu_seqlens[b] + chunk start``, of total x total tokens), which is exactly the varlen
dropout counter and each sequence's own mask and ALiBi.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from itertools import accumulate

import torch

from . import masks, ops
from .options import AttentionOptions, PositionFrame
from .ring import Merge, Ring, Sum, ZigzagLayout, needs_frame, run_backward_ring, run_forward_ring

# a sequence stays whole on one rank while its attention (N² of its tokens, causal or not) is at most this share of
# a rank's even load and its tokens fit under the same share above a rank's even count; longer ones are cut
WHOLE_SHARE = 1 / 8


def place_sequences(seqlens: tuple[int, ...], world_size: int) -> tuple[int | None, ...]:
    """For each sequence of a packed batch, the rank that holds it whole, or None: cut in the zigzag over every rank.

    Sequences whose attention is more than ``WHOLE_SHARE`` of a rank's even load are cut (every rank then takes an
    even part of their work). The others, longest first, go whole to the rank with the least attention so far among
    those whose tokens stay within ``WHOLE_SHARE`` of the even count (the rest of a model's work goes by tokens); a
    sequence that fits no rank is cut too. A pure function of the lengths: every rank places alike."""
    costs = [n * n for n in seqlens]
    even_cost, even_tokens = sum(costs) / world_size, sum(seqlens) / world_size
    load, tokens = [0.0] * world_size, [0.0] * world_size
    owners: list[int | None] = [None] * len(seqlens)

    def cut(b: int) -> None:
        for rank in range(world_size):
            load[rank] += costs[b] / world_size
            tokens[rank] += seqlens[b] / world_size

    whole = []
    for b in sorted(range(len(seqlens)), key=lambda b: (-costs[b], b)):
        if world_size > 1 and costs[b] > WHOLE_SHARE * even_cost:
            cut(b)
        else:
            whole.append(b)
    for b in whole:
        fits = [rank for rank in range(world_size) if tokens[rank] + seqlens[b] <= (1 + WHOLE_SHARE) * even_tokens]
        if not fits:
            cut(b)
            continue
        rank = min(fits, key=lambda rank: (load[rank], tokens[rank], rank))
        owners[b] = rank
        load[rank] += costs[b]
        tokens[rank] += seqlens[b]
    return tuple(owners)


@dataclass(frozen=True)
class PackedLayout:
    """Where each rank's tokens lie in a packed batch of sequences of ``seqlens`` tokens over ``world_size`` ranks.

    Each sequence is either whole on one rank or cut over every rank in ``ZigzagLayout``'s zigzag
    (:func:`place_sequences`). A rank holds its parts of the cut sequences first, each sequence's two chunks
    together, then its whole sequences, each group in the batch's order: the parts that travel the ring are the
    first ``sent_length`` tokens, and whole sequences never leave their rank. Every per-sequence list below follows
    ``order()``, the same on every rank.

    ``plans`` keeps the calls of a call's steps (:func:`plan`) from its forward to its backward."""

    seqlens: tuple[int, ...]
    world_size: int
    plans: dict = field(default_factory=dict, compare=False, repr=False)

    @functools.cached_property
    def owners(self) -> tuple[int | None, ...]:
        return place_sequences(self.seqlens, self.world_size)

    @property
    def seqlen(self) -> int:
        """All tokens of the batch (total_tokens)."""
        return sum(self.seqlens)

    def starts(self) -> list[int]:
        """The global cu_seqlens."""
        return [0, *accumulate(self.seqlens)]

    def order(self) -> list[int]:
        """The sequences in the order every rank holds them: the cut ones, then the whole ones."""
        cut = [b for b, owner in enumerate(self.owners) if owner is None]
        return cut + [b for b, owner in enumerate(self.owners) if owner is not None]

    def chunks(self, sequence: int, rank: int, sent: bool = False) -> tuple[tuple[int, int], tuple[int, int]]:
        """(start in the sequence, length) of the sequence's first and second chunk on rank ``rank`` (of what it
        sends, with ``sent``): a cut sequence's zigzag chunks; a whole one's (0, N), (N, 0) on its rank, empty
        elsewhere and in what travels."""
        n, owner = self.seqlens[sequence], self.owners[sequence]
        if owner is None:
            return ZigzagLayout(n, self.world_size).chunks(rank)
        length = n if owner == rank and not sent else 0
        return (0, length), (length, 0)

    def chunk_lengths(self, rank: int, sent: bool = False) -> list[tuple[int, int]]:
        """(first, second) chunk lengths of every sequence in ``order()`` on rank ``rank`` (of what it sends)."""
        return [(first[1], second[1]) for first, second in (self.chunks(b, rank, sent) for b in self.order())]

    def rank_length(self, rank: int) -> int:
        return sum(first + second for first, second in self.chunk_lengths(rank))

    def sent_length(self, rank: int) -> int:
        """Rank ``rank``'s tokens that travel the ring: its parts of the cut sequences, the first it holds."""
        return sum(first + second for first, second in self.chunk_lengths(rank, sent=True))

    def local_cu_seqlens(self, rank: int, sent: bool = False) -> list[int]:
        return [0, *accumulate(first + second for first, second in self.chunk_lengths(rank, sent))]

    def runs(self, rank: int) -> list[tuple[int, int]]:
        """(global start, length) of the rank's runs of tokens, in the order the rank holds them: two a sequence,
        empty ones included (a rank may hold no token at all, and ``shard`` still cuts it an empty part)."""
        starts = self.starts()
        return [(starts[b] + start, length) for b in self.order() for start, length in self.chunks(b, rank)]


@dataclass(frozen=True)
class PackedCall:
    """One varlen call of a step: the local query rows ``rows`` against the whole received K/V, in these segments
    (every row at the own step; at the others only the cut sequences' rows, the first the rank holds: its whole
    sequences' rows see no received key)."""

    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int
    opts: AttentionOptions
    rows: slice

    def arguments(self) -> tuple:
        return (self.cu_seqlens_q, self.cu_seqlens_k, self.max_seqlen_q, self.max_seqlen_k)


@dataclass(frozen=True)
class FramedPiece:
    """One dense call of batch 1: local rows ``rows`` of sequence ``sequence`` against received rows ``keys``."""

    rows: slice
    keys: slice
    opts: AttentionOptions
    sequence: int


def plan(ring: Ring, opts: AttentionOptions, framed: bool, device: torch.device) -> list[list]:
    """The calls of every step (``plan(...)[step]``), built once per call: the local cu_seqlens of all steps go to
    the device in one copy, before any step is queued, and the backward finds them in ``ring.layout.plans``."""
    key = (ring.rank, opts, framed, device)
    if key not in ring.layout.plans:
        steps = [step_segments(ring, ring.source(step), opts, framed) for step in range(ring.world_size)]
        lengths = [lengths for calls in steps for call in calls if not isinstance(call, FramedPiece)
                   for lengths in call[:2]]
        flat = [bound for lengths_ in lengths for bound in (0, *accumulate(lengths_))]
        bounds = torch.tensor(flat, dtype=torch.int32).to(device) if flat else None
        offset, plans = 0, []
        for calls in steps:
            planned = []
            for call in calls:
                if isinstance(call, FramedPiece):
                    planned.append(call)
                    continue
                q_lengths, k_lengths, call_opts = call
                rows = slice(0, sum(q_lengths))
                cu_q = bounds[offset:offset + len(q_lengths) + 1]
                offset += len(q_lengths) + 1
                cu_k = bounds[offset:offset + len(k_lengths) + 1]
                offset += len(k_lengths) + 1
                planned.append(PackedCall(cu_q, cu_k, max(q_lengths), max(k_lengths), call_opts, rows))
            plans.append(planned)
        ring.layout.plans[key] = plans
    return ring.layout.plans[key]


def _segments(q_lengths: list[int], k_lengths: list[int], opts: AttentionOptions) -> list:
    if not any(sq and sk for sq, sk in zip(q_lengths, k_lengths, strict=True)):
        return []
    return [(q_lengths, k_lengths, opts)]


def step_segments(ring: Ring, src: int, opts: AttentionOptions, framed: bool) -> list:
    """The calls of the step that attends to rank ``src``'s K/V (see the module docstring): framed pieces, or one
    (query lengths, key lengths, options) of segments for a varlen call, whose queries are the first rows the rank
    holds: all of them at the own step, the cut sequences' at the others (whole ones receive nothing)."""
    layout: PackedLayout = ring.layout
    local, received = layout.chunk_lengths(ring.rank), layout.chunk_lengths(src, sent=src != ring.rank)
    if framed:
        return _framed_pieces(ring, src, opts)
    if src != ring.rank:  # the cut sequences come first in order()
        cut = layout.owners.count(None)
        local, received = local[:cut], received[:cut]
    if opts.window_right < 0 or src == ring.rank:
        return _segments([a + b for a, b in local], [a + b for a, b in received], opts)
    unmasked = dataclasses.replace(opts, window_right=-1)
    q_lengths, k_lengths = [], []
    for (q_first, q_second), (k_first, k_second) in zip(local, received, strict=True):
        if src < ring.rank:  # every local query sees the first received chunk, none the second
            q_lengths += [q_first + q_second, 0]
            k_lengths += [k_first, k_second]
        else:  # the second local chunk sees every received key, the first none
            q_lengths += [q_first, q_second]
            k_lengths += [0, k_first + k_second]
    return _segments(q_lengths, k_lengths, unmasked)


def _framed_pieces(ring: Ring, src: int, opts: AttentionOptions) -> list[FramedPiece]:
    layout: PackedLayout = ring.layout
    starts, total, sent = layout.starts(), layout.seqlen, src != ring.rank
    local_starts, received_starts = layout.local_cu_seqlens(ring.rank), layout.local_cu_seqlens(src, sent)
    pieces = []
    for i, b in enumerate(layout.order()):
        q_chunks, k_chunks = layout.chunks(b, ring.rank), layout.chunks(b, src, sent)
        q_offset = local_starts[i]
        for q_start, q_len in q_chunks:
            k_offset = received_starts[i]
            for k_start, k_len in k_chunks:
                frame = PositionFrame(starts[b] + q_start, starts[b] + k_start, total, total)
                lo, hi = masks.visible_key_range(q_len, k_len, opts.window_left, opts.window_right,
                                                 frame.diagonal_shift(q_len, k_len))
                if q_len and k_len and lo < hi:
                    pieces.append(FramedPiece(slice(q_offset, q_offset + q_len), slice(k_offset, k_offset + k_len),
                                              dataclasses.replace(opts, frame=frame), b))
                k_offset += k_len
            q_offset += q_len
    return pieces


def _slopes(alibi_slopes: torch.Tensor | None, sequence: int) -> torch.Tensor | None:
    """A sequence's ALiBi slopes for a dense call of batch 1."""
    if alibi_slopes is None or alibi_slopes.dim() == 1:
        return alibi_slopes
    return alibi_slopes[sequence:sequence + 1]


def _travelling(k: torch.Tensor, v: torch.Tensor, ring: Ring) -> torch.Tensor:
    """The K/V rows that travel the ring, the first ``sent_length`` (the cut sequences'), in one buffer (2, rows, Hk,
    D); the own step reads k and v where they are."""
    sent = ring.layout.sent_length(ring.rank)
    return torch.stack((k[:sent], v[:sent]))


def forward(q, k, v, alibi_slopes, rng_state, opts: AttentionOptions, ring: Ring):
    """(out, lse) of the local packed queries over every whole sequence: out in q's dtype, lse float32 (H, total)."""
    framed = needs_frame(opts, alibi_slopes)
    steps = plan(ring, opts, framed, q.device)
    # as a batch of 1; without frames only the cut sequences' rows take more than the own step's part
    merged = Merge((1, *q.shape), q.device, None if framed else ring.layout.sent_length(ring.rank))

    def compute(step: int, kv: torch.Tensor) -> None:
        for call in steps[step]:
            if isinstance(call, PackedCall):
                out, lse = ops.eager_call(ops.varlen_attention_forward, ops.varlen_attention_forward_cuda,
                                          q[call.rows], kv[0], kv[1], *call.arguments(), None, None,
                                          *call.opts.op_arguments())
                merged.add(out[None], lse[None], call.rows)
            else:
                out, lse = ops.eager_call(
                    ops.attention_forward, ops.attention_forward_cuda, q[None, call.rows], kv[0][None, call.keys],
                    kv[1][None, call.keys], _slopes(alibi_slopes, call.sequence), rng_state,
                    *call.opts.op_arguments(), None, call.opts.frame_argument())
                merged.add(out, lse, call.rows)

    run_forward_ring(ring, _travelling(k, v, ring), compute, local=(k, v))
    out, lse = merged.result(q.dtype)
    return out[0], lse[0]


def backward(dout, q, k, v, out, lse, alibi_slopes, rng_state, opts: AttentionOptions, ring: Ring):
    """(dq, dk, dv) of the local packed shards, from the global out and lse of :func:`forward` (``ring.backward``'s
    ring: dQ stays, each shard's dK/dV accumulator travels with it)."""
    framed = needs_frame(opts, alibi_slopes)
    steps = plan(ring, opts, framed, q.device)
    dq_sum = Sum(q.shape, q.device, slice(None) if framed else slice(0, ring.layout.sent_length(ring.rank)))

    def gradients(step: int, kv: torch.Tensor) -> list:
        partials = []
        for call in steps[step]:
            if isinstance(call, PackedCall):
                rows = call.rows
                dq, dk, dv = ops.eager_call(
                    ops.varlen_attention_backward, ops.varlen_attention_backward_cuda, dout[rows], q[rows], kv[0],
                    kv[1], out[rows], lse[:, rows].contiguous(), *call.arguments(), None, None,
                    *call.opts.op_arguments())
                dq_sum.add(dq, rows)
                partials.append((slice(None), dk, dv))
            else:
                rows = call.rows
                # the caller's deterministic, as in ring.backward
                dq, dk, dv, _ = ops.eager_call(
                    ops.attention_backward, ops.attention_backward_cuda, dout[None, rows], q[None, rows],
                    kv[0][None, call.keys], kv[1][None, call.keys], out[None, rows], lse[None, :, rows].contiguous(),
                    _slopes(alibi_slopes, call.sequence), rng_state, *call.opts.op_arguments(), None, False,
                    call.opts.frame_argument(), call.opts.deterministic)
                dq_sum.add(dq[0], rows)
                partials.append((call.keys, dk[0], dv[0]))
        return partials

    dkv = run_backward_ring(ring, _travelling(k, v, ring), gradients, local=(k, v))
    return dq_sum.result(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype)
