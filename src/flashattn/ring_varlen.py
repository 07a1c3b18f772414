"""Ring attention over packed (varlen) batches: ``ring.py``'s ring, each sequence in its own zigzag layout.

Layout: every sequence b of a packed batch (``N_b`` tokens) is cut into 2W chunks as ``ring.ZigzagLayout`` cuts a
dense one (two sizes one token apart when 2W does not divide ``N_b``, nothing padded); rank r holds chunks r and
2W-1-r of every sequence, the sequences in the batch's order, each sequence's two chunks contiguous. A rank's
packed shard is then itself a packed batch, with local cu_seqlens of its own (:class:`PackedZigzagLayout`).

Steps. Without position-dependent options each step is **one** varlen call over the whole local q and the whole
received K/V: the step kinds of ``ring.py`` become per-sequence segments, and the keys or queries a step must not
pair are put in segments of their own facing an empty side, which the kernels skip (no compute, weight 0 in the
merge, gradient 0). For ``src < r`` under a causal mask sequence b's segments are (every local query, the first
received chunk) and (no query, the second received chunk); for ``src > r``, (the first local chunk, no key) and
(the second local chunk, every received key). A window, ALiBi and dropout need global positions, which the varlen
kernels do not take: then each (sequence, query chunk, key chunk) pair is a dense call of batch 1 with a position
frame in the whole packed stream (``options.PositionFrame`` at ``cu_seqlens[b] + chunk start``, of
total x total tokens), which is exactly the varlen dropout counter and each sequence's own mask and ALiBi.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from itertools import accumulate

import torch

from . import masks, ops
from .options import AttentionOptions, PositionFrame
from .ring import Merge, Ring, Sum, ZigzagLayout, needs_frame, run_backward_ring, run_forward_ring


@dataclass(frozen=True)
class PackedZigzagLayout:
    """Where each rank's tokens lie in a packed batch of sequences of ``seqlens`` tokens over ``world_size`` ranks:
    every sequence in ``ZigzagLayout``'s zigzag, a rank's parts of the sequences in the batch's order.

    ``plans`` keeps the calls of a call's steps (:func:`plan`) from its forward to its backward."""

    seqlens: tuple[int, ...]
    world_size: int
    plans: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def seqlen(self) -> int:
        """All tokens of the batch (total_tokens)."""
        return sum(self.seqlens)

    def sequence(self, index: int) -> ZigzagLayout:
        return ZigzagLayout(self.seqlens[index], self.world_size)

    def starts(self) -> list[int]:
        """The global cu_seqlens."""
        return [0, *accumulate(self.seqlens)]

    def chunk_lengths(self, rank: int) -> list[tuple[int, int]]:
        """(first, second) chunk lengths of every sequence on rank ``rank``."""
        return [(layout.chunks(rank)[0][1], layout.chunks(rank)[1][1])
                for layout in map(self.sequence, range(len(self.seqlens)))]

    def rank_length(self, rank: int) -> int:
        return sum(self.sequence(b).rank_length(rank) for b in range(len(self.seqlens)))

    def local_cu_seqlens(self, rank: int) -> list[int]:
        return [0, *accumulate(first + second for first, second in self.chunk_lengths(rank))]

    def runs(self, rank: int) -> list[tuple[int, int]]:
        """(global start, length) of the rank's runs of tokens, in the order the rank holds them."""
        starts = self.starts()
        return [(starts[b] + start, length) for b in range(len(self.seqlens))
                for start, length in self.sequence(b).chunks(rank)]


@dataclass(frozen=True)
class PackedCall:
    """One varlen call of a step: the whole local q against the whole received K/V, in these segments."""

    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int
    opts: AttentionOptions

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
                cu_q = bounds[offset:offset + len(q_lengths) + 1]
                offset += len(q_lengths) + 1
                cu_k = bounds[offset:offset + len(k_lengths) + 1]
                offset += len(k_lengths) + 1
                planned.append(PackedCall(cu_q, cu_k, max(q_lengths), max(k_lengths), call_opts))
            plans.append(planned)
        ring.layout.plans[key] = plans
    return ring.layout.plans[key]


def _segments(q_lengths: list[int], k_lengths: list[int], opts: AttentionOptions) -> list:
    if not any(sq and sk for sq, sk in zip(q_lengths, k_lengths, strict=True)):
        return []
    return [(q_lengths, k_lengths, opts)]


def step_segments(ring: Ring, src: int, opts: AttentionOptions, framed: bool) -> list:
    """The calls of the step that attends to rank ``src``'s K/V (see the module docstring): framed pieces, or one
    (query lengths, key lengths, options) of segments for a varlen call."""
    layout: PackedZigzagLayout = ring.layout
    local, received = layout.chunk_lengths(ring.rank), layout.chunk_lengths(src)
    if framed:
        return _framed_pieces(ring, src, opts)
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
    layout: PackedZigzagLayout = ring.layout
    starts, total = layout.starts(), layout.seqlen
    local_starts, received_starts = layout.local_cu_seqlens(ring.rank), layout.local_cu_seqlens(src)
    pieces = []
    for b in range(len(layout.seqlens)):
        sequence = layout.sequence(b)
        q_chunks, k_chunks = sequence.chunks(ring.rank), sequence.chunks(src)
        q_offset = local_starts[b]
        for q_start, q_len in q_chunks:
            k_offset = received_starts[b]
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


def forward(q, k, v, alibi_slopes, rng_state, opts: AttentionOptions, ring: Ring):
    """(out, lse) of the local packed queries over every whole sequence: out in q's dtype, lse float32 (H, total)."""
    steps = plan(ring, opts, needs_frame(opts, alibi_slopes), q.device)
    merged = Merge((1, *q.shape), q.device)  # as a batch of 1

    def compute(step: int, kv: torch.Tensor) -> None:
        for call in steps[step]:
            if isinstance(call, PackedCall):
                out, lse = ops.eager_call(ops.varlen_attention_forward, ops.varlen_attention_forward_cuda, q, kv[0],
                                          kv[1], *call.arguments(), None, None, *call.opts.op_arguments())
                merged.add(out[None], lse[None])
            else:
                out, lse = ops.eager_call(
                    ops.attention_forward, ops.attention_forward_cuda, q[None, call.rows], kv[0, None, call.keys],
                    kv[1, None, call.keys], _slopes(alibi_slopes, call.sequence), rng_state,
                    *call.opts.op_arguments(), None, call.opts.frame_argument())
                merged.add(out, lse, call.rows)

    run_forward_ring(ring, torch.stack((k, v)), compute)  # (2, total_local, Hk, D)
    out, lse = merged.result(q.dtype)
    return out[0], lse[0]


def backward(dout, q, k, v, out, lse, alibi_slopes, rng_state, opts: AttentionOptions, ring: Ring):
    """(dq, dk, dv) of the local packed shards, from the global out and lse of :func:`forward` (``ring.backward``'s
    ring: dQ stays, each shard's dK/dV accumulator travels with it)."""
    steps = plan(ring, opts, needs_frame(opts, alibi_slopes), q.device)
    dq_sum = Sum(q.shape, q.device)

    def gradients(step: int, kv: torch.Tensor) -> list:
        partials = []
        for call in steps[step]:
            if isinstance(call, PackedCall):
                dq, dk, dv = ops.eager_call(
                    ops.varlen_attention_backward, ops.varlen_attention_backward_cuda, dout, q, kv[0], kv[1], out,
                    lse, *call.arguments(), None, None, *call.opts.op_arguments())
                dq_sum.add(dq)
                partials.append((slice(None), dk, dv))
            else:
                rows = call.rows
                # the caller's deterministic, as in ring.backward
                dq, dk, dv, _ = ops.eager_call(
                    ops.attention_backward, ops.attention_backward_cuda, dout[None, rows], q[None, rows],
                    kv[0, None, call.keys], kv[1, None, call.keys], out[None, rows], lse[None, :, rows].contiguous(),
                    _slopes(alibi_slopes, call.sequence), rng_state, *call.opts.op_arguments(), None, False,
                    call.opts.frame_argument(), call.opts.deterministic)
                dq_sum.add(dq[0], rows)
                partials.append((call.keys, dk[0], dv[0]))
        return partials

    dkv = run_backward_ring(ring, torch.stack((k, v)), gradients)
    return dq_sum.result(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype)
