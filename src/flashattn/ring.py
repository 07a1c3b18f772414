"""Ring attention: the sequence sharded over a process group, K/V passed around the ring (``distributed.py``'s
engine).

Layout (zigzag): the full sequence of N tokens is cut into 2W chunks for a group of W ranks; rank r holds chunks r
and 2W-1-r, one from each end, so that under a causal mask every rank has as much work as every other. When 2W does
not divide N the chunks differ by one token (:class:`ZigzagLayout`); nothing is padded.

Forward: at step s rank r holds the K/V shard of rank ``src = r - s (mod W)``; it sends it on to rank r + 1 and
receives the next one from rank r - 1 (batched isend/irecv) while it attends to it. Each step's partial outputs are
merged into float32 accumulators by their log-sum-exps (:class:`Merge`). Backward: the same ring, each step
recomputing with the *global* output and log-sum-exp (so the partial gradients are exact parts of the full ones); dQ
accumulates locally in float32, and each K/V shard's dK/dV accumulator (float32) travels the ring with it and arrives
home after W steps (the last hop, a finished sum, already rounded to the inputs' dtype).

Which queries see which keys at a step. Without position-dependent options (causal or no mask, softcap, GQA), the
chunk order alone decides, with no position offsets:

- ``src == r``: the local queries against the local keys, causal or not (both are the chunks r and 2W-1-r in
  order, so the bottom-right causal mask of an Sq == Sk call is the global one);
- causal, ``src < r``: every local query against the first chunk of the received keys, unmasked (its second chunk
  lies after both local chunks);
- causal, ``src > r``: the second local chunk against all received keys, unmasked (the first local chunk lies
  before both);
- not causal: every local query against every received key.

A window, ALiBi and dropout depend on global positions: then each (query chunk, key chunk) pair is its own call,
with a :class:`~flashattn.options.PositionFrame` that places it in the full sequence, and pairs that see nothing
are skipped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from . import masks, ops
from .options import AttentionOptions, PositionFrame, new_rng_state


@dataclass(frozen=True)
class ZigzagLayout:
    """Where each rank's tokens lie in a sequence of ``seqlen`` tokens over ``world_size`` ranks.

    Rank r holds ``seqlen // W`` tokens, one more for the first ``seqlen % W`` ranks; its first chunk (chunk r of
    the 2W) takes the larger half of them, its second (chunk 2W-1-r) the smaller. Every chunk then has
    ``seqlen // 2W`` or one more token, and the ranks' loads differ by at most one token per chunk.
    """

    seqlen: int
    world_size: int

    def rank_length(self, rank: int) -> int:
        base, extra = divmod(self.seqlen, self.world_size)
        return base + (1 if rank < extra else 0)

    def chunk_length(self, chunk: int) -> int:
        w = self.world_size
        if chunk < w:
            return -(-self.rank_length(chunk) // 2)
        return self.rank_length(2 * w - 1 - chunk) // 2

    def chunk_start(self, chunk: int) -> int:
        return sum(self.chunk_length(c) for c in range(chunk))

    def chunks(self, rank: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """(global start, length) of rank ``rank``'s first and second chunk, in the order the rank holds them."""
        second = 2 * self.world_size - 1 - rank
        return ((self.chunk_start(rank), self.chunk_length(rank)),
                (self.chunk_start(second), self.chunk_length(second)))

    def runs(self, rank: int) -> list[tuple[int, int]]:
        """(global start, length) of the rank's runs of tokens, in the order the rank holds them (``shard``'s
        cut; ``ring_varlen.PackedLayout`` has the same method)."""
        return list(self.chunks(rank))

    def sent_length(self, rank: int) -> int:
        """How many of rank ``rank``'s tokens travel the ring (the first ones it holds): all of them here; a packed
        layout keeps whole sequences home (``ring_varlen.PackedLayout``)."""
        return self.rank_length(rank)


@dataclass(frozen=True)
class Ring:
    """A process group seen from one rank: its place in the ring, and the sequence's layout over it."""

    group: dist.ProcessGroup
    rank: int
    world_size: int
    layout: ZigzagLayout  # or a packed batch's, ``ring_varlen.PackedLayout``

    @classmethod
    def of(cls, group: dist.ProcessGroup | None, seqlen: int) -> Ring:
        group = group if group is not None else dist.group.WORLD
        world_size = dist.get_world_size(group)
        return cls(group, dist.get_rank(group), world_size, ZigzagLayout(seqlen, world_size))

    def peer(self, offset: int) -> int:
        """The global rank of the group's rank ``rank + offset`` (mod W): P2P ops address global ranks."""
        return dist.get_global_rank(self.group, (self.rank + offset) % self.world_size)

    def source(self, step: int) -> int:
        """The rank whose K/V shard this rank holds at ``step``."""
        return (self.rank - step) % self.world_size

    def shared_rng_state(self, device: torch.device) -> torch.Tensor:
        """One dropout (seed, offset) for the whole call: every rank draws one (so that their generators advance
        alike) and takes rank 0's. The pair travels on ``device`` (NCCL moves no CPU tensors) and is returned on the
        CPU, where the ops read it."""
        return shared_rng_state(self.group, device)


def shared_rng_state(group: dist.ProcessGroup, device: torch.device) -> torch.Tensor:
    """:meth:`Ring.shared_rng_state` for any group (the all-to-all mode's too)."""
    state = new_rng_state(device).to(device)
    dist.broadcast(state, dist.get_global_rank(group, 0), group=group)
    return state.cpu()


@dataclass(frozen=True)
class Piece:
    """One attention call of a ring step: local query rows ``rows`` against rows ``keys`` of the received K/V, with
    ``opts`` (its frame, when positions matter)."""

    rows: slice
    keys: slice
    opts: AttentionOptions


def needs_frame(opts: AttentionOptions, alibi_slopes: torch.Tensor | None) -> bool:
    """Whether the scores depend on global positions beyond the chunk order: a window other than causal, ALiBi, or
    dropout (whose random stream is keyed by positions)."""
    return (opts.window_left >= 0 or opts.window_right > 0 or opts.dropout_p > 0 or alibi_slopes is not None)


def step_pieces(ring: Ring, src: int, opts: AttentionOptions, framed: bool) -> list[Piece]:
    """The calls of the step that attends to rank ``src``'s K/V (see the module docstring)."""
    (q_first, q_second) = ring.layout.chunks(ring.rank)
    (k_first, k_second) = ring.layout.chunks(src)
    local, received = _halves(q_first[1], q_second[1]), _halves(k_first[1], k_second[1])
    if framed:
        pieces = []
        for (q_start, q_len), rows in zip((q_first, q_second), local, strict=True):
            for (k_start, k_len), keys in zip((k_first, k_second), received, strict=True):
                frame = PositionFrame(q_start, k_start, ring.layout.seqlen, ring.layout.seqlen)
                lo, hi = masks.visible_key_range(q_len, k_len, opts.window_left, opts.window_right,
                                                 frame.diagonal_shift(q_len, k_len))
                if q_len and k_len and lo < hi:
                    pieces.append(Piece(rows, keys, dataclasses.replace(opts, frame=frame)))
        return pieces
    everything = slice(0, q_first[1] + q_second[1])
    every_key = slice(0, k_first[1] + k_second[1])
    if opts.window_right < 0 or src == ring.rank:
        pieces = [Piece(everything, every_key, opts)]
    else:
        unmasked = dataclasses.replace(opts, window_right=-1)
        if src < ring.rank:
            pieces = [Piece(everything, received[0], unmasked)]
        else:
            pieces = [Piece(local[1], every_key, unmasked)]
    return [p for p in pieces if p.rows.stop > p.rows.start and p.keys.stop > p.keys.start]


def _halves(first: int, second: int) -> tuple[slice, slice]:
    return slice(0, first), slice(first, first + second)


def _sent(kv: torch.Tensor, length: int) -> torch.Tensor:
    """The first ``length`` tokens of a K/V (or dK/dV) buffer, contiguous, as they travel."""
    return kv if kv.shape[-3] == length else kv.narrow(-3, 0, length).contiguous()


def _steps(ring: Ring) -> int:
    """The ring's steps: W, or only the rank's own when no rank has tokens that travel (every packed sequence
    whole on one rank)."""
    alone = not any(ring.layout.sent_length(rank) for rank in range(ring.world_size))
    return 1 if alone else ring.world_size


def _exchange(ring: Ring, send: torch.Tensor, recv: torch.Tensor) -> list:
    """Send ``send`` to the next rank and receive ``recv`` from the previous one, asynchronously (on NCCL, on its
    own stream: compute on the current stream goes on meanwhile). Returns the works to wait for."""
    return dist.batch_isend_irecv([dist.P2POp(dist.isend, send, ring.peer(1), ring.group),
                                   dist.P2POp(dist.irecv, recv, ring.peer(-1), ring.group)])


def _wait(works: list) -> None:
    """Wait for ``works``: on NCCL the current stream waits for the communication (the host does not)."""
    for work in works:
        work.wait()


def _kv_buffer(kv: torch.Tensor, length: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """An empty K/V buffer like ``kv`` (dense (2, B, S, Hk, D) or packed (2, S, Hk, D)) of ``length`` tokens."""
    return kv.new_empty((*kv.shape[:-3], length, *kv.shape[-2:]), dtype=dtype or kv.dtype)


def run_forward_ring(ring: Ring, kv: torch.Tensor, compute: Callable[[int, torch.Tensor], None],
                     local=None) -> None:
    """The forward's ring: at each step ``compute(step, kv)`` queues the work on the K/V shard held while the next
    one travels from the previous rank. The travelling shards are the tokens each rank sends
    (``layout.sent_length``: the first ones it holds). ``local``: what the own step computes on, a (k, v) pair of
    every local token, when ``kv`` holds only those that travel (default: ``kv``)."""
    steps = _steps(ring)
    for step in range(steps):
        works = []
        if step + 1 < steps:
            next_kv = _kv_buffer(kv, ring.layout.sent_length(ring.source(step + 1)))
            works = _exchange(ring, _sent(kv, ring.layout.sent_length(ring.source(step))), next_kv)
        compute(step, local if step == 0 and local is not None else kv)
        if works:
            _wait(works)
            kv = next_kv


def run_backward_ring(ring: Ring, kv: torch.Tensor, gradients: Callable[[int, torch.Tensor], list],
                      local=None) -> torch.Tensor:
    """The backward's ring: dQ stays (``gradients(step, kv)`` adds to it), each shard's float32 dK/dV accumulator
    travels with the shard. ``gradients`` returns the step's (index into a K/V shard, dk, dv) parts. Returns this
    rank's own dK/dV (2, ...) once every rank has added to it: in the inputs' dtype after a ring of two or more
    steps (the last hop's), float32 after one (a group of one, or no token travelling). ``local``: as in
    :func:`run_forward_ring`."""
    own = kv.shape if local is None else torch.Size((2, *local[0].shape))  # the whole local shard's dK/dV
    pending = None  # (works, buffer): the dK/dV accumulator of the shard held next, on its way from rank - 1
    home = None  # the dK/dV of tokens that do not travel (whole packed sequences): finished at the own step
    steps = _steps(ring)
    for step in range(steps):
        kv_works = []
        if step + 1 < steps:
            next_kv = _kv_buffer(kv, ring.layout.sent_length(ring.source(step + 1)))
            kv_works = _exchange(ring, _sent(kv, ring.layout.sent_length(ring.source(step))), next_kv)
        partials = gradients(step, local if step == 0 and local is not None else kv)
        # this shard's accumulator: what the ranks before added (waited for only now, after this step's compute
        # was queued), plus this rank's part
        sent = ring.layout.sent_length(ring.source(step))
        if pending is not None:
            _wait(pending[0])
            dkv = pending[1]
        elif steps > 1 and len(partials) == 1 and partials[0][1].shape == own[1:]:
            # one part of the whole shard (an own step without frames): the tokens that stay are finished as it
            # gives them (0 + x, rounded back, is x), and only those that travel take a float32 accumulator
            _, dk, dv = partials[0]
            rest = dk.shape[-3] - sent
            home = torch.stack((dk.narrow(-3, sent, rest), dv.narrow(-3, sent, rest))) if rest else None
            dkv = torch.empty((*kv.shape[:-3], sent, *kv.shape[-2:]), dtype=torch.float32, device=kv.device)
            dkv[0].copy_(dk.narrow(-3, 0, sent))
            dkv[1].copy_(dv.narrow(-3, 0, sent))
            partials = []
        else:
            dkv = torch.zeros(own, dtype=torch.float32, device=kv.device)
        for index, dk, dv in partials:
            dkv[0][index] += dk
            dkv[1][index] += dv
        # on to the next rank; the accumulator of the shard held next (after the last step: this rank's own)
        # comes from the previous one
        if steps == 1:
            break
        if step == 0 and dkv.shape[-3] > sent:
            # the tokens that stay are finished at the own step (only this rank's queries see them): rounded now,
            # so that the whole float32 accumulator is not held through the ring
            home = dkv.narrow(-3, sent, dkv.shape[-3] - sent).to(kv.dtype, copy=True)
            dkv = _sent(dkv, sent)
        if step + 1 == steps:
            # the last hop carries a finished sum home, where it is only rounded to the inputs' dtype: rounded here
            # instead, it is the same bits in half the bytes (this transfer is the one that nothing overlaps)
            dkv = dkv.to(kv.dtype)
        incoming = _kv_buffer(kv, ring.layout.sent_length(ring.source(step + 1)), dkv.dtype)
        pending = (_exchange(ring, dkv, incoming), incoming, dkv)  # dkv stays referenced until it is sent
        if kv_works:
            _wait(kv_works)
            kv = next_kv
    if pending is not None:
        _wait(pending[0])
        dkv = pending[1]
    if home is not None:
        dkv = torch.cat((dkv, home), dim=-3)
    return dkv


class Merge:
    """The float32 accumulators of a forward's partial results, by their log-sum-exps: per row the largest lse seen
    (``top``), the sum of the parts' weights ``exp(lse_i - top)`` and the weighted sum of their outputs. A weight is
    rescaled only when ``top`` moves (by ``exp(old - new)``; otherwise by exactly 1), and the output is divided by
    the sum of the same weights once, at the end: the rounding of a log-sum-exp never enters the weights. The ops'
    +inf (a row that sees no key) counts as a weight of 0.

    ``merged_rows``: only the rows before it take more than one part (a packed ring's cut sequences). The rows from it
    on take the first part alone, which covers every row (a ring's own step): they are final as it gives them, and
    only the merged rows get float32 accumulators. By default every row.
    """

    def __init__(self, shape: torch.Size, device: torch.device, merged_rows: int | None = None) -> None:
        self.shape, self.device = shape, device
        self.merged_rows = shape[1] if merged_rows is None else merged_rows
        self.out = self.top = self.weight = None  # allocated by the first part
        self.first = None  # (out, lse) of a first part that covers every row, when rows past merged_rows are final

    def add(self, out: torch.Tensor, lse: torch.Tensor, rows: slice = slice(None)) -> None:
        """Fold a partial result of the rows ``rows`` (within the merged rows, after a first part that covers every
        row), out (B, rows, H, D) and lse (B, H, rows), in place."""
        merged = self.merged_rows
        if self.out is None and out.shape == self.shape:
            # the first part covers every row (a ring's own step does): its merged rows are the state, one conversion
            # and no rescaling; a row it did not see has out 0 (the ops' convention) and weight 0
            if merged < self.shape[1]:
                self.first = (out, lse)
                out, lse = out[:, :merged], lse[:, :, :merged]
            lse = lse.masked_fill(lse == float("inf"), float("-inf"))
            self.out, self.top = out.to(torch.float32, copy=True), lse
            self.weight = (lse > float("-inf")).float()
            return
        lse = lse.masked_fill(lse == float("inf"), float("-inf"))
        if self.out is None:
            batch, _, nheads, head_dim = self.shape  # out (B, S, H, D); the lse-like (B, H, S)
            self.out = torch.zeros((batch, merged, nheads, head_dim), dtype=torch.float32, device=self.device)
            self.top = torch.full((batch, nheads, merged), float("-inf"), device=self.device)
            self.weight = torch.zeros((batch, nheads, merged), device=self.device)
        out_acc, top, weight = self.out[:, rows], self.top[:, :, rows], self.weight[:, :, rows]
        new_top = torch.maximum(top, lse)
        shift = new_top.masked_fill(new_top == float("-inf"), 0.0)  # rows no part has seen: both weights 0
        old_scale, new_weight = torch.exp(top - shift), torch.exp(lse - shift)
        weight.mul_(old_scale).add_(new_weight)
        out_acc.mul_(old_scale.transpose(1, 2).unsqueeze(-1)).addcmul_(
            out, new_weight.transpose(1, 2).unsqueeze(-1))  # (B, S, H, 1) weights; one pass, no float32 copy
        top.copy_(new_top)

    def result(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(out in ``dtype``, lse float32 (B, H, S)); a row that saw no key: out 0, lse +inf (the library's mark)."""
        if self.out is None:  # no part at all: every row saw no key
            self.merged_rows = self.shape[1]
            self.add(torch.zeros(self.shape, device=self.device),
                     torch.full((self.shape[0], self.shape[2], self.shape[1]), float("inf"), device=self.device))
        merged = self.merged_rows
        if self.first is not None:  # the final rows as the first part gave them; the merged ones written over it
            out, lse = self.first[0].to(dtype), self.first[1]
        elif merged < self.shape[1]:  # rows that took no part: out 0, lse +inf
            out = torch.zeros(self.shape, dtype=dtype, device=self.device)
            lse = torch.full((self.shape[0], self.shape[2], self.shape[1]), float("inf"), device=self.device)
        else:
            out, lse = torch.empty(self.shape, dtype=dtype, device=self.device), None
        seen = self.weight > 0
        merged_lse = torch.where(seen, self.top + torch.log(self.weight), float("inf"))
        # divided and rounded in one pass
        torch.div(self.out, torch.where(seen, self.weight, 1.0).transpose(1, 2).unsqueeze(-1), out=out[:, :merged])
        if lse is None:
            return out, merged_lse
        lse[:, :, :merged] = merged_lse
        return out, lse


class Sum:
    """A float32 sum of parts of a tensor of ``shape`` (dQ over a ring's steps). A first part that covers the whole
    shape becomes the sum by one conversion: no zero fill and no read of zeros.

    ``summed``: the index of the part of the shape that takes more than one part (a packed ring's cut sequences'
    rows, a slice from 0); elsewhere a first part that covers the whole shape is final as it is, and only the summed
    part is kept in float32. By default the whole shape."""

    def __init__(self, shape: torch.Size, device: torch.device, summed: slice = slice(None)) -> None:
        self.shape, self.device, self.summed, self.total = shape, device, summed, None
        self.first = None  # a first part that covers the whole shape, when only ``summed`` of it takes more

    def add(self, part: torch.Tensor, index=slice(None)) -> None:
        if self.total is None:
            if part.shape == self.shape:  # a part of the whole shape is the whole
                if self.summed != slice(None):
                    self.first = part
                self.total = part[self.summed].to(torch.float32, copy=True)
                return
            self.total = torch.zeros(self.shape, dtype=torch.float32, device=self.device)
        self.total[index] += part

    def result(self, dtype: torch.dtype) -> torch.Tensor:
        if self.total is None:
            return torch.zeros(self.shape, dtype=dtype, device=self.device)
        if self.first is None:
            return self.total.to(dtype)
        first = self.first.to(dtype)
        first[self.summed] = self.total
        return first


def forward(q, k, v, alibi_slopes, rng_state, opts: AttentionOptions, ring: Ring):
    """(out, lse) of the local queries over the whole sequence: out in q's dtype, lse float32 (B, H, local)."""
    framed = needs_frame(opts, alibi_slopes)
    merged = Merge(q.shape, q.device)

    def compute(step: int, kv: torch.Tensor) -> None:
        for piece in step_pieces(ring, ring.source(step), opts, framed):
            out, lse = ops.eager_call(
                ops.attention_forward, ops.attention_forward_cuda, q[:, piece.rows], kv[0, :, piece.keys],
                kv[1, :, piece.keys], alibi_slopes, rng_state, *piece.opts.op_arguments(), None,
                piece.opts.frame_argument())
            merged.add(out, lse, piece.rows)

    run_forward_ring(ring, torch.stack((k, v)), compute)  # one contiguous buffer travels: (2, B, local, Hk, D)
    return merged.result(q.dtype)


def backward(dout, q, k, v, out, lse, alibi_slopes, rng_state, opts: AttentionOptions, ring: Ring):
    """(dq, dk, dv) of the local shards, from the global out and lse of :func:`forward`."""
    framed = needs_frame(opts, alibi_slopes)
    dq_sum = Sum(q.shape, q.device)
    lse_rows: dict[tuple[int, int], torch.Tensor] = {}  # the kernels read a contiguous lse

    def gradients(step: int, kv: torch.Tensor) -> list:
        partials = []
        for piece in step_pieces(ring, ring.source(step), opts, framed):
            rows = piece.rows
            key = (rows.start, rows.stop)
            if key not in lse_rows:
                lse_rows[key] = lse[:, :, rows].contiguous()
            # the caller's deterministic: with it the ring's gradients repeat bitwise (the two passes); without it a
            # step takes the single call's fastest backward (on Hopper the fused one, whose dQ adds are atomic)
            dq, dk, dv, _ = ops.eager_call(
                ops.attention_backward, ops.attention_backward_cuda, dout[:, rows], q[:, rows],
                kv[0, :, piece.keys], kv[1, :, piece.keys], out[:, rows], lse_rows[key], alibi_slopes, rng_state,
                *piece.opts.op_arguments(), None, False, piece.opts.frame_argument(), piece.opts.deterministic)
            dq_sum.add(dq, (slice(None), rows))
            partials.append(((slice(None), piece.keys), dk, dv))
        return partials

    dkv = run_backward_ring(ring, torch.stack((k, v)), gradients)
    return dq_sum.result(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype)
