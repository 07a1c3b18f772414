"""Context parallelism: exact attention over a sequence sharded across a ``torch.distributed`` process group.

Each rank of a group of W holds a shard of the sequence, (batch, local_seqlen, nheads, headdim), laid out by
:func:`shard`: the sequence cut into 2W chunks, rank r holding chunks r and 2W-1-r (zigzag), so that a causal mask
gives every rank the same work. :func:`ring_flash_attn_func` computes the local rows of attention over the whole
sequence, forward and backward, passing K/V around the ring (NCCL on GPUs, gloo on CPUs); :func:`unshard` puts
results back together. The design: docs/context-parallel.md.

::

    q_local, k_local, v_local = (shard(x, group) for x in (q, k, v))        # every rank holds the full q, k, v
    out_local = ring_flash_attn_func(q_local, k_local, v_local, group=group, causal=True)
    out = unshard(out_local, group)                                          # == flash_attn_func(q, k, v, causal=True)

Lengths that 2W does not divide are cut into chunks of two sizes, one token apart (nothing is padded). When W
does not divide the length the ranks hold different numbers of tokens: pass the full length as ``seqlen``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .autograd import RingFlashAttnFunction
from .options import AttentionOptions
from .ring import Ring, ZigzagLayout
from .validation import check_dense, check_tensor

__all__ = [
    "ring_flash_attn_func",
    "ring_flash_attn_kvpacked_func",
    "ring_flash_attn_qkvpacked_func",
    "shard",
    "unshard",
]


def _group_ring(group, seqlen: int | None, local_seqlen: int, name: str = "q") -> Ring:
    """The ring of ``group`` for a sequence of ``seqlen`` tokens (default: W x local_seqlen), checked against this
    rank's ``local_seqlen``."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("flashattn.distributed needs an initialized default process group: call "
                           "torch.distributed.init_process_group first")
    world_size = dist.get_world_size(group)
    if seqlen is None:
        seqlen = world_size * local_seqlen
    elif isinstance(seqlen, bool) or not isinstance(seqlen, int) or seqlen < 0:
        raise TypeError(f"seqlen must be an int >= 0 (the full sequence's length) or None, got {seqlen!r}")
    ring = Ring.of(group, seqlen)
    expected = ring.layout.rank_length(ring.rank)
    if local_seqlen != expected:
        raise ValueError(f"{name} holds {local_seqlen} tokens on rank {ring.rank}, but a sequence of seqlen={seqlen} "
                         f"over {world_size} ranks gives this rank {expected} (flashattn.distributed.shard's "
                         "layout): pass the full sequence's length as seqlen")
    return ring


def ring_flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group: dist.ProcessGroup | None = None,
    causal: bool = False,
    softmax_scale: float | None = None,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    seqlen: int | None = None,
):
    """:func:`flashattn.flash_attn_func` over a sequence sharded across ``group`` (zigzag, see :func:`shard`).

    Every rank of the group calls it with its shards; each gets the attention of its own query rows over the
    whole sequence, exactly (the same function as the single call on the full sequence, in another order), and
    gradients for its own q, k and v.

    Args:
        q: (batch, local_seqlen, nheads, headdim), this rank's shard of the queries.
        k, v: (batch, local_seqlen, nheads_k, headdim), this rank's shards of keys and values (self-attention:
            the same tokens as q's).
        group: the process group the sequence is sharded over (default: the default group).
        causal, softmax_scale, window_size, softcap, alibi_slopes, dropout_p: as in ``flash_attn_func``,
            in the full sequence's positions. Dropout draws the single call's mask: one seed and offset for the
            whole group (rank 0's, broadcast), and counters from global positions.
        deterministic: the backward is always deterministic: a fixed order of accumulation around the ring.
        return_attn_probs: also return the local rows' log-sum-exp (as ``flash_attn_func``).
        seqlen: the full sequence's length; default W x local_seqlen (every rank holds as many tokens, which is
            what :func:`shard` gives when W divides the length).

    Returns:
        out (q's shape and dtype), or ``(out, softmax_lse, None)`` with softmax_lse float32
        (batch, nheads, local_seqlen).
    """
    check_dense(q, k, v, dropout_p, window_size, softcap, alibi_slopes, softmax_scale)
    if k.shape[1] != q.shape[1]:
        raise ValueError(f"k and v must hold the same tokens as q (self-attention over the sharded sequence): "
                         f"q has local seqlen {q.shape[1]}, k {k.shape[1]}")
    ring = _group_ring(group, seqlen, q.shape[1])
    opts = AttentionOptions.build(q.shape[-1], softmax_scale, causal, window_size, softcap, dropout_p,
                                  deterministic)
    out, lse = RingFlashAttnFunction.apply(q, k, v, alibi_slopes, opts, ring)
    return (out, lse, None) if return_attn_probs else out


def ring_flash_attn_kvpacked_func(q, kv, group=None, causal=False, softmax_scale=None, window_size=(-1, -1),
                                  softcap=0.0, alibi_slopes=None, dropout_p=0.0, deterministic=False,
                                  return_attn_probs=False, seqlen=None):
    """:func:`ring_flash_attn_func` on q and kv of shape (batch, local_seqlen, 2, nheads_k, headdim)."""
    check_tensor("kv", kv, 5)
    if kv.shape[2] != 2:
        raise ValueError(f"kv must have shape (batch, seqlen, 2, nheads_k, headdim), got {tuple(kv.shape)}")
    k, v = kv.unbind(dim=2)
    return ring_flash_attn_func(q, k, v, group, causal, softmax_scale, window_size, softcap, alibi_slopes, dropout_p,
                                deterministic, return_attn_probs, seqlen)


def ring_flash_attn_qkvpacked_func(qkv, group=None, causal=False, softmax_scale=None, window_size=(-1, -1),
                                   softcap=0.0, alibi_slopes=None, dropout_p=0.0, deterministic=False,
                                   return_attn_probs=False, seqlen=None):
    """:func:`ring_flash_attn_func` on qkv of shape (batch, local_seqlen, 3, nheads, headdim)."""
    check_tensor("qkv", qkv, 5)
    if qkv.shape[2] != 3:
        raise ValueError(f"qkv must have shape (batch, seqlen, 3, nheads, headdim), got {tuple(qkv.shape)}")
    q, k, v = qkv.unbind(dim=2)
    return ring_flash_attn_func(q, k, v, group, causal, softmax_scale, window_size, softcap, alibi_slopes, dropout_p,
                                deterministic, return_attn_probs, seqlen)


def _check_dim(x, dim: int) -> int:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if isinstance(dim, bool) or not isinstance(dim, int) or not -x.dim() <= dim < x.dim():
        raise ValueError(f"dim must be a dimension of x (an int in [{-x.dim()}, {x.dim()})), got {dim!r}")
    return dim % x.dim()


def shard(x: torch.Tensor, group: dist.ProcessGroup | None = None, dim: int = 1) -> torch.Tensor:
    """This rank's part of a full tensor, in the layout :func:`ring_flash_attn_func` expects. Differentiable.

    The ``dim`` (the sequence's, 1 for (batch, seqlen, ...)) of length N is cut into 2W chunks for a group of W
    ranks; rank r gets chunks r and 2W-1-r, concatenated. Rank r's share is ``N // W`` tokens, one more for the
    first ``N % W`` ranks, its first chunk the larger half: chunks differ by at most one token, nothing is
    padded, and ``unshard(shard(x))`` is ``x``.
    """
    dim = _check_dim(x, dim)
    if not dist.is_initialized():
        raise RuntimeError("shard needs an initialized default process group: call "
                           "torch.distributed.init_process_group")
    ring = Ring.of(group, x.shape[dim])
    first, second = ring.layout.chunks(ring.rank)
    return torch.cat((x.narrow(dim, *first), x.narrow(dim, *second)), dim=dim)


def unshard(x: torch.Tensor, group: dist.ProcessGroup | None = None, dim: int = 1,
            seqlen: int | None = None) -> torch.Tensor:
    """The full tensor from every rank's part (:func:`shard`'s inverse), on every rank: an all-gather, no gradient.

    ``dim``: the sequence's (2 for a log-sum-exp (batch, nheads, seqlen)). ``seqlen``: the full length; by default
    the ranks' lengths are gathered first (one more small collective).
    """
    dim = _check_dim(x, dim)
    if not dist.is_initialized():
        raise RuntimeError("unshard needs an initialized default process group: call "
                           "torch.distributed.init_process_group")
    world_size = dist.get_world_size(group)
    if seqlen is None:
        lengths = [torch.zeros(1, dtype=torch.int64, device=x.device) for _ in range(world_size)]
        dist.all_gather(lengths, torch.tensor([x.shape[dim]], device=x.device), group=group)
        seqlen = int(sum(int(n) for n in lengths))
    ring = _group_ring(group, seqlen, x.shape[dim], "x")
    layout: ZigzagLayout = ring.layout
    longest = layout.rank_length(0)
    padded = x.detach().contiguous()
    if padded.shape[dim] < longest:  # all_gather moves equal sizes
        pad_shape = list(padded.shape)
        pad_shape[dim] = longest - padded.shape[dim]
        padded = torch.cat((padded, padded.new_zeros(pad_shape)), dim=dim)
    parts = [torch.empty_like(padded) for _ in range(world_size)]
    dist.all_gather(parts, padded, group=group)
    chunks: list[tuple[int, torch.Tensor]] = []
    for rank, part in enumerate(parts):
        (first_start, first_len), (second_start, second_len) = layout.chunks(rank)
        chunks.append((first_start, part.narrow(dim, 0, first_len)))
        chunks.append((second_start, part.narrow(dim, first_len, second_len)))
    return torch.cat([chunk for _, chunk in sorted(chunks, key=lambda c: c[0])], dim=dim)
