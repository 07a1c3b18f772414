"""Head-parallel context parallelism (DeepSpeed-Ulysses): the all-to-all exchanges between a sequence-sharded
layout and a head-sharded one.

A group of W ranks holds a sequence of N tokens in the zigzag layout of ``ring.py`` (or a packed batch in
``ring_varlen.py``'s), all H heads of its T local tokens: (batch, T, H, D). :func:`seq_to_head` gives every rank
all N tokens, in their natural order, of H / W heads, rank r the heads ``r H/W .. (r+1) H/W - 1``: (batch, N, H/W,
D). :func:`head_to_seq` is its inverse. Each is one ``torch.distributed.all_to_all_single`` (rank r sends rank s
its tokens' slice of s's heads) and one permutation of the tokens, since the pieces arrive in rank order, each in
the zigzag order of its rank: the permutation (:class:`HeadExchange`) puts them in the natural order, and back.
Each permutation is one gather straight from the receive buffer (or into the send buffer), whose blocks are each
rank's (batch, tokens) rows, so that an exchange makes two passes over the tensor besides the transfer: the heads'
regrouping and the tokens' permutation. The backward of one exchange is the other (``autograd.SeqToHeadFunction``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from .ring import Ring


@dataclass(frozen=True)
class HeadExchange:
    """The exchange of one layout over one group, from one rank: how many tokens each rank holds, and where the
    rank-ordered concatenation of their tokens lies in the natural order."""

    group: dist.ProcessGroup
    rank: int
    world_size: int
    lengths: tuple[int, ...]
    inverse: torch.Tensor  # int64 (N,): the row of the rank-ordered concatenation of tokens that holds position p

    @classmethod
    def of(cls, ring: Ring, device: torch.device) -> HeadExchange:
        runs = [run for rank in range(ring.world_size) for run in ring.layout.runs(rank)]
        order = torch.cat([torch.arange(start, start + length, dtype=torch.int64) for start, length in runs])
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(order.numel(), dtype=torch.int64)
        lengths = tuple(ring.layout.rank_length(rank) for rank in range(ring.world_size))
        return cls(ring.group, ring.rank, ring.world_size, lengths, inverse.to(device))

    def block_rows(self, batch: int) -> torch.Tensor:
        """int64 (batch * N,): for each (b, global position p), b-major, its row in the rank-ordered buffer of
        ``batch`` sequences whose block r is rank r's (batch, tokens) rows, the blocks in rank order."""
        device = self.inverse.device
        lengths = torch.tensor(self.lengths, device=device)
        starts = torch.cumsum(lengths, 0) - lengths
        holder = torch.repeat_interleave(torch.arange(self.world_size, device=device), lengths,
                                         output_size=self.inverse.numel())[self.inverse]  # the rank holding p
        first = batch * starts[holder] + self.inverse - starts[holder]  # row of (0, p); (b, p) is b * n_r further
        return (first + torch.arange(batch, device=device)[:, None] * lengths[holder]).reshape(-1)


def seq_to_head(x: torch.Tensor, exchange: HeadExchange) -> torch.Tensor:
    """(B, T, H, D) of this rank's tokens, every head -> (B, N, H/W, D) of every token, this rank's heads."""
    batch, tokens, nheads, head_dim = x.shape
    world_size, local_heads = exchange.world_size, nheads // exchange.world_size
    send = x.reshape(batch, tokens, world_size, local_heads, head_dim).permute(2, 0, 1, 3, 4).contiguous()
    row = batch * local_heads * head_dim  # the elements of one token of one head group
    recv = x.new_empty(row * sum(exchange.lengths))
    dist.all_to_all_single(recv, send.view(-1), [row * n for n in exchange.lengths], [row * tokens] * world_size,
                           group=exchange.group)
    rows = recv.view(-1, local_heads, head_dim).index_select(0, exchange.block_rows(batch))
    return rows.view(batch, -1, local_heads, head_dim)


def head_to_seq(y: torch.Tensor, exchange: HeadExchange) -> torch.Tensor:
    """(B, N, H/W, D) of every token, this rank's heads -> (B, T, H, D) of this rank's tokens, every head."""
    batch, total, local_heads, head_dim = y.shape
    world_size, tokens = exchange.world_size, exchange.lengths[exchange.rank]
    block_rows = exchange.block_rows(batch)
    sources = torch.empty_like(block_rows)  # the row of y that each row of the send buffer takes
    sources[block_rows] = torch.arange(batch * total, device=y.device)
    send = y.reshape(batch * total, local_heads, head_dim).index_select(0, sources).view(-1)
    row = batch * local_heads * head_dim
    recv = y.new_empty(world_size * row * tokens)
    dist.all_to_all_single(recv, send, [row * tokens] * world_size, [row * n for n in exchange.lengths],
                           group=exchange.group)
    gathered = recv.view(world_size, batch, tokens, local_heads, head_dim).permute(1, 2, 0, 3, 4)
    return gathered.reshape(batch, tokens, world_size * local_heads, head_dim)
