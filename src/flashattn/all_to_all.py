"""Head-parallel context parallelism (DeepSpeed-Ulysses): the all-to-all exchanges between a sequence-sharded
layout and a head-sharded one.

A group of W ranks holds a sequence of N tokens in the zigzag layout of ``ring.py`` (or a packed batch in
``ring_varlen.py``'s), all H heads of its T local tokens: (batch, T, H, D). :func:`seq_to_head` gives every rank all
N tokens, in their natural order, of H / W heads, rank r the heads ``r H/W .. (r+1) H/W - 1``: (batch, N, H/W, D).
:func:`head_to_seq` is its inverse. Each is one ``torch.distributed.all_to_all_single`` (rank r sends rank s its
tokens' slice of s's heads), started asynchronously (``start_*``: on NCCL it runs on the communicator's stream, so
that several exchanges are queued at once) and finished later (``finish_*``: the current stream waits for it).

The pieces arrive in rank order, each in the zigzag order of its rank: a permutation of the tokens
(:class:`HeadExchange`) puts them in the natural order, and back. Each permutation is one gather straight from the
receive buffer (or into the send buffer), whose blocks are each rank's (batch, tokens) rows, so that an exchange
makes two passes over its tensor besides the transfer: the heads' regrouping and the tokens' permutation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from .ring import Ring


@dataclass(frozen=True)
class HeadExchange:
    """The exchange of one layout over one group for a batch of ``batch`` sequences, from one rank: how many
    tokens each rank holds, and where the tokens of the rank-ordered receive buffer go."""

    group: dist.ProcessGroup
    rank: int
    world_size: int
    lengths: tuple[int, ...]
    rows: torch.Tensor  # int64 (batch * N,): for each (b, p), b-major, its row in the rank-ordered receive buffer
    sources: torch.Tensor  # int64 (batch * N,): the inverse, the row of the natural order each sent row takes

    @classmethod
    def of(cls, ring: Ring, device: torch.device, batch: int) -> HeadExchange:
        """Built on ``device`` from the layout's runs (a few per sequence): no loop over tokens on the host."""
        lengths = tuple(ring.layout.rank_length(rank) for rank in range(ring.world_size))
        rows = block_rows(ring, lengths, batch, device)
        sources = torch.empty_like(rows)
        sources[rows] = torch.arange(rows.numel(), device=device)
        return cls(ring.group, ring.rank, ring.world_size, lengths, rows, sources)


def block_rows(ring: Ring, lengths: tuple[int, ...], batch: int, device: torch.device) -> torch.Tensor:
    """int64 (batch * N,): for each (b, global position p), b-major, its row in the rank-ordered buffer of ``batch``
    sequences whose block r is rank r's (batch, tokens) rows, the blocks in rank order. Position p of a run (start
    s, length n) at offset c of its rank's tokens sits at ``batch * block_start + b * n_r + c + p - s``."""
    runs = []  # (global start s, length n, the row of (0, p) less p, n_r), in global order once sorted
    block_start = 0
    for rank in range(ring.world_size):
        offset = 0
        for start, length in ring.layout.runs(rank):
            if length:
                runs.append((start, length, batch * block_start + offset - start, lengths[rank]))
            offset += length
        block_start += lengths[rank]
    table = torch.tensor(sorted(runs), dtype=torch.int64).reshape(-1, 4).to(device)  # one copy to the device
    counts, shifts, strides = table[:, 1], table[:, 2], table[:, 3]
    total = sum(lengths)
    first = torch.arange(total, device=device) + torch.repeat_interleave(shifts, counts, output_size=total)
    per_batch = torch.repeat_interleave(strides, counts, output_size=total)  # n_r of the rank holding p
    return (first + torch.arange(batch, device=device)[:, None] * per_batch).reshape(-1)


@dataclass
class Pending:
    """An exchange on its way: the collective's work, its receive buffer, its send buffer (kept until the work is
    waited for), and the shape it finishes into."""

    work: object
    recv: torch.Tensor
    send: torch.Tensor
    shape: tuple[int, ...]


def start_seq_to_head(x: torch.Tensor, exchange: HeadExchange) -> Pending:
    """Start the exchange of x (B, T, H, D) of this rank's tokens, every head."""
    batch, tokens, nheads, head_dim = x.shape
    world_size, heads = exchange.world_size, nheads // exchange.world_size
    send = x.unflatten(2, (world_size, heads)).permute(2, 0, 1, 3, 4).contiguous()
    row = batch * heads * head_dim  # the elements of one token of one head group
    recv = x.new_empty(row * sum(exchange.lengths))
    work = dist.all_to_all_single(recv, send.view(-1), [row * n for n in exchange.lengths],
                                  [row * tokens] * world_size, group=exchange.group, async_op=True)
    return Pending(work, recv, send, (batch, sum(exchange.lengths), heads, head_dim))


def finish_seq_to_head(pending: Pending, exchange: HeadExchange) -> torch.Tensor:
    """(B, N, H/W, D) of every token, this rank's heads, in natural order."""
    pending.work.wait()
    batch, total, heads, head_dim = pending.shape
    rows = pending.recv.view(-1, heads, head_dim).index_select(0, exchange.rows)
    return rows.view(batch, total, heads, head_dim)


def start_head_to_seq(y: torch.Tensor, exchange: HeadExchange) -> Pending:
    """Start the way back of y (B, N, H/W, D): every token, this rank's heads."""
    batch, total, heads, head_dim = y.shape
    world_size, tokens = exchange.world_size, exchange.lengths[exchange.rank]
    send = y.reshape(batch * total, heads, head_dim).index_select(0, exchange.sources).view(-1)
    row = batch * heads * head_dim
    recv = y.new_empty(world_size * row * tokens)
    work = dist.all_to_all_single(recv, send, [row * tokens] * world_size, [row * n for n in exchange.lengths],
                                  group=exchange.group, async_op=True)
    return Pending(work, recv, send, (batch, tokens, heads, head_dim))


def finish_head_to_seq(pending: Pending, exchange: HeadExchange) -> torch.Tensor:
    """(B, T, H, D) of this rank's tokens, every head."""
    pending.work.wait()
    batch, tokens, heads, head_dim = pending.shape
    arrived = pending.recv.view(exchange.world_size, batch, tokens, heads, head_dim).permute(1, 2, 0, 3, 4)
    return arrived.reshape(batch, tokens, exchange.world_size * heads, head_dim)


def seq_to_head(x: torch.Tensor, exchange: HeadExchange) -> torch.Tensor:
    """(B, T, H, D) of this rank's tokens, every head -> (B, N, H/W, D) of every token, this rank's heads."""
    return finish_seq_to_head(start_seq_to_head(x, exchange), exchange)


def head_to_seq(y: torch.Tensor, exchange: HeadExchange) -> torch.Tensor:
    """(B, N, H/W, D) of every token, this rank's heads -> (B, T, H, D) of this rank's tokens, every head."""
    return finish_head_to_seq(start_head_to_seq(y, exchange), exchange)
