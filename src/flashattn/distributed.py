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

Packed batches (:func:`ring_flash_attn_varlen_func`): short sequences whole on one rank, long ones each in its own
zigzag (``ring_varlen.PackedLayout``), ``shard(x, cu_seqlens=...)``. ``mode``: "ring" passes K/V around the
ring; "all_to_all" exchanges sequence shards for head shards and back (the group's size must divide the key/value
heads); "auto" picks the all-to-all on one sequence when it can and the ranks hold 32k tokens or more, the ring
otherwise and on packed batches (``head_parallel.choose_mode``).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist

from . import head_parallel
from .autograd import HeadParallelFunction, RingFlashAttnFunction
from .options import AttentionOptions
from .ring import Ring
from .ring_varlen import PackedLayout
from .validation import check_dense, check_tensor, check_varlen, max_seqlen_argument

__all__ = [
    "ring_flash_attn_func",
    "ring_flash_attn_kvpacked_func",
    "ring_flash_attn_qkvpacked_func",
    "ring_flash_attn_varlen_func",
    "shard",
    "unshard",
]


def _require_group() -> None:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("flashattn.distributed needs an initialized default process group: call "
                           "torch.distributed.init_process_group first")


def _group_ring(group, seqlen: int | None, local_seqlen: int, name: str = "q") -> Ring:
    """The ring of ``group`` for a sequence of ``seqlen`` tokens (default: W x local_seqlen), checked against this
    rank's ``local_seqlen``."""
    _require_group()
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
    mode: str = "ring",
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
        deterministic: as in ``flash_attn_func``: with it every step's backward is the two passes and the gradients
            repeat bitwise (the ring fixes every other order of accumulation); without it a step takes the single
            call's fastest backward (on Hopper the fused one, whose dQ adds are atomic).
        return_attn_probs: also return the local rows' log-sum-exp (as ``flash_attn_func``).
        seqlen: the full sequence's length; default W x local_seqlen (every rank holds as many tokens, which is
            what :func:`shard` gives when W divides the length).
        mode: "ring" (K/V passed around the ring), "all_to_all" (sequence shards exchanged for head shards, one
            call on the whole sequence for H / W heads, and back; the group's size must divide nheads_k), or
            "auto": "all_to_all" when the group's size divides nheads_k and the ranks hold 32k tokens or more,
            else "ring" (the rule measured in docs/context-parallel.md). Every mode computes the same function.

    Returns:
        out (q's shape and dtype), or ``(out, softmax_lse, None)`` with softmax_lse float32
        (batch, nheads, local_seqlen).
    """
    check_dense(q, k, v, dropout_p, window_size, softcap, alibi_slopes, softmax_scale)
    if k.shape[1] != q.shape[1]:
        raise ValueError(f"k and v must hold the same tokens as q (self-attention over the sharded sequence): "
                         f"q has local seqlen {q.shape[1]}, k {k.shape[1]}")
    ring = _group_ring(group, seqlen, q.shape[1])
    mode = head_parallel.choose_mode(mode, k.shape[2], ring.world_size, ring.layout.seqlen)
    opts = AttentionOptions.build(q.shape[-1], softmax_scale, causal, window_size, softcap, dropout_p,
                                  deterministic)
    if mode == "all_to_all":
        call = head_parallel.HeadCall.of(ring, q)
        out, lse = HeadParallelFunction.apply(q, k, v, alibi_slopes, opts, call)
    else:
        out, lse = RingFlashAttnFunction.apply(q, k, v, alibi_slopes, opts, ring)
    return (out, lse, None) if return_attn_probs else out


def ring_flash_attn_kvpacked_func(q, kv, group=None, causal=False, softmax_scale=None, window_size=(-1, -1),
                                  softcap=0.0, alibi_slopes=None, dropout_p=0.0, deterministic=False,
                                  return_attn_probs=False, seqlen=None, mode="ring"):
    """:func:`ring_flash_attn_func` on q and kv of shape (batch, local_seqlen, 2, nheads_k, headdim)."""
    check_tensor("kv", kv, 5)
    if kv.shape[2] != 2:
        raise ValueError(f"kv must have shape (batch, seqlen, 2, nheads_k, headdim), got {tuple(kv.shape)}")
    k, v = kv.unbind(dim=2)
    return ring_flash_attn_func(q, k, v, group, causal, softmax_scale, window_size, softcap, alibi_slopes, dropout_p,
                                deterministic, return_attn_probs, seqlen, mode)


def ring_flash_attn_qkvpacked_func(qkv, group=None, causal=False, softmax_scale=None, window_size=(-1, -1),
                                   softcap=0.0, alibi_slopes=None, dropout_p=0.0, deterministic=False,
                                   return_attn_probs=False, seqlen=None, mode="ring"):
    """:func:`ring_flash_attn_func` on qkv of shape (batch, local_seqlen, 3, nheads, headdim)."""
    check_tensor("qkv", qkv, 5)
    if qkv.shape[2] != 3:
        raise ValueError(f"qkv must have shape (batch, seqlen, 3, nheads, headdim), got {tuple(qkv.shape)}")
    q, k, v = qkv.unbind(dim=2)
    return ring_flash_attn_func(q, k, v, group, causal, softmax_scale, window_size, softcap, alibi_slopes, dropout_p,
                                deterministic, return_attn_probs, seqlen, mode)


def _packed_ring(group, cu_seqlens, local_tokens: int | None, name: str, local_name: str) -> Ring:
    """The ring of ``group`` over the packed batch of the global ``cu_seqlens``, checked against this rank's
    ``local_tokens`` (unless None). Reads cu_seqlens on the host (on a GPU, one small copy and a synchronization)."""
    _require_group()
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 2 \
            or cu_seqlens.dtype.is_floating_point:
        raise ValueError(f"{name} must be a 1-d integer tensor (batch + 1,) of the whole batch's running sequence "
                         f"lengths, got {cu_seqlens!r}")
    bounds = cu_seqlens.tolist()
    seqlens = [end - start for start, end in zip(bounds, bounds[1:], strict=False)]
    if bounds[0] != 0 or min(seqlens) < 0:
        raise ValueError(f"{name} must start at 0 and never decrease (the whole batch's running sequence lengths), "
                         f"got {bounds}")
    ring = Ring.of(group, 0)
    ring = dataclasses.replace(ring, layout=PackedLayout(tuple(seqlens), ring.world_size))
    expected = ring.layout.rank_length(ring.rank)
    if local_tokens is not None and local_tokens != expected:
        raise ValueError(f"{local_name} holds {local_tokens} tokens on rank {ring.rank}, but the packed batch of "
                         f"{name} (the whole batch's, {bounds[-1]} tokens) over {ring.world_size} ranks gives this "
                         f"rank {expected} (flashattn.distributed.shard's layout with cu_seqlens)")
    return ring


def ring_flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int | torch.Tensor,
    max_seqlen_k: int | torch.Tensor,
    group: dist.ProcessGroup | None = None,
    causal: bool = False,
    softmax_scale: float | None = None,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    mode: str = "ring",
):
    """:func:`flashattn.flash_attn_varlen_func` over a packed batch sharded across ``group`` by
    ``shard(x, group, cu_seqlens=cu_seqlens)``.

    A sequence whose attention is a small share of a rank's load is held whole by one rank, placed so that the
    ranks get about as much attention and as many tokens; a longer one is cut over every rank, sequence b's chunks
    r and 2W-1-r of 2W on rank r (cut as the dense layout cuts a sequence: lengths 2W does not divide give chunks
    one token apart; nothing is padded). A rank holds its parts of the cut sequences, then its whole ones, each in
    the batch's order (``ring_varlen.PackedLayout``); only the parts of cut sequences travel the ring. Each rank
    gets the attention of its own query rows over their whole sequences, exactly, and gradients for its own q, k
    and v.

    Args:
        q: (local_tokens, nheads, headdim), this rank's packed shard of the queries.
        k, v: (local_tokens, nheads_k, headdim), this rank's shards of keys and values (self-attention: the same
            tokens as q's).
        cu_seqlens_q, cu_seqlens_k: int32 (batch + 1,) on q's device: the **whole** batch's cu_seqlens (the running
            sums of the full sequences' lengths, as :func:`flashattn.flash_attn_varlen_func` takes them for the
            unsharded batch), the same on every rank; self-attention: cu_seqlens_k must equal cu_seqlens_q. They
            are read on the host (on a GPU, one small copy and a synchronization per call).
        max_seqlen_q, max_seqlen_k: type-checked as in ``flash_attn_varlen_func``, their values not read: the
            exact maxima come from cu_seqlens, which each rank reads on the host to cut its shard.
        group, causal, softmax_scale, window_size, softcap, alibi_slopes, dropout_p, deterministic, mode: as in
            :func:`ring_flash_attn_func`, per sequence (each sequence's own mask and ALiBi, in its full positions;
            dropout draws the single packed call's mask); "auto" takes the ring here, whose whole sequences never
            travel.
        return_attn_probs: also return the local rows' log-sum-exp.

    Returns:
        out (q's shape and dtype), or ``(out, softmax_lse, None)`` with softmax_lse float32 (nheads, local_tokens),
        the varlen layout.
    """
    check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, dropout_p, window_size, softcap, alibi_slopes, False,
                 softmax_scale)
    max_seqlen_argument("max_seqlen_q", max_seqlen_q)
    max_seqlen_argument("max_seqlen_k", max_seqlen_k)
    if k.shape[0] != q.shape[0] or (cu_seqlens_k is not cu_seqlens_q and not torch.equal(cu_seqlens_k, cu_seqlens_q)):
        raise ValueError("k and v must hold the same tokens as q (self-attention over the sharded batch): "
                         f"cu_seqlens_k must equal cu_seqlens_q, and k.shape[0] ({k.shape[0]}) q.shape[0] "
                         f"({q.shape[0]})")
    ring = _packed_ring(group, cu_seqlens_q, q.shape[0], "cu_seqlens_q", "q")
    mode = head_parallel.choose_mode(mode, k.shape[1], ring.world_size, ring.layout.seqlen, packed=True)
    opts = AttentionOptions.build(q.shape[-1], softmax_scale, causal, window_size, softcap, dropout_p,
                                  deterministic)
    if mode == "all_to_all":
        call = head_parallel.HeadCall.of(ring, q, cu_seqlens_q)
        out, lse = HeadParallelFunction.apply(q, k, v, alibi_slopes, opts, call)
    else:
        out, lse = RingFlashAttnFunction.apply(q, k, v, alibi_slopes, opts, ring)
    return (out, lse, None) if return_attn_probs else out


def _check_dim(x, dim: int) -> int:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if isinstance(dim, bool) or not isinstance(dim, int) or not -x.dim() <= dim < x.dim():
        raise ValueError(f"dim must be a dimension of x (an int in [{-x.dim()}, {x.dim()})), got {dim!r}")
    return dim % x.dim()


def _layout_ring(group, x: torch.Tensor, dim: int, cu_seqlens, seqlen: int | None, local: bool) -> Ring:
    """The ring of ``x``'s layout along ``dim``: the dense one of ``seqlen`` tokens, or the packed batch of
    ``cu_seqlens``; ``local``: x is a rank's part (else the full tensor)."""
    if cu_seqlens is not None:
        name = "x.shape[dim]" if local else "x (the full tensor)"
        if not local and x.shape[dim] != int(cu_seqlens[-1]):
            raise ValueError(f"x must hold the whole packed batch along dim {dim}, cu_seqlens[-1] = "
                             f"{int(cu_seqlens[-1])} tokens, got {x.shape[dim]}")
        return _packed_ring(group, cu_seqlens, x.shape[dim] if local else None, "cu_seqlens", name)
    if not local:
        _require_group()
        return Ring.of(group, x.shape[dim])
    return _group_ring(group, seqlen, x.shape[dim], "x")


def shard_positions(local_seqlen: int, group: dist.ProcessGroup | None = None, seqlen: int | None = None,
                    device: torch.device | None = None) -> torch.Tensor:
    """The global positions (int64) of this rank's ``local_seqlen`` tokens of a sequence of ``seqlen`` (default: W x
    local_seqlen) in :func:`shard`'s layout, what ``shard(torch.arange(seqlen), group, dim=0)`` gives; ValueError,
    naming x, where local_seqlen is not this rank's part of seqlen."""
    ring = _group_ring(group, seqlen, local_seqlen, "x")
    return torch.cat([torch.arange(start, start + length, device=device)
                      for start, length in ring.layout.runs(ring.rank)])


def shard(x: torch.Tensor, group: dist.ProcessGroup | None = None, dim: int | None = None,
          cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
    """This rank's part of a full tensor, in the layout :func:`ring_flash_attn_func` expects. Differentiable.

    The ``dim`` (the sequence's: default 1 for (batch, seqlen, ...)) of length N is cut into 2W chunks for a group
    of W ranks; rank r gets chunks r and 2W-1-r, concatenated. Rank r's share is ``N // W`` tokens, one more for
    the first ``N % W`` ranks, its first chunk the larger half: chunks differ by at most one token, nothing is
    padded, and ``unshard(shard(x))`` is ``x``.

    ``cu_seqlens``: x is a packed batch (:func:`ring_flash_attn_varlen_func`'s layout, ``dim`` default 0 for
    (total_tokens, ...)) of these whole-batch cu_seqlens: short sequences go whole to one rank, long ones are cut
    as above (:func:`ring_flash_attn_varlen_func` says how), and rank r gets its parts.
    """
    dim = _check_dim(x, (0 if cu_seqlens is not None else 1) if dim is None else dim)
    if cu_seqlens is None and not dist.is_initialized():
        raise RuntimeError("shard needs an initialized default process group: call "
                           "torch.distributed.init_process_group")
    ring = _layout_ring(group, x, dim, cu_seqlens, None, local=False)
    return torch.cat([x.narrow(dim, start, length) for start, length in ring.layout.runs(ring.rank)], dim=dim)


def unshard(x: torch.Tensor, group: dist.ProcessGroup | None = None, dim: int | None = None,
            seqlen: int | None = None, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
    """The full tensor from every rank's part (:func:`shard`'s inverse), on every rank: an all-gather, no gradient.

    ``dim``: the sequence's (default 1; 2 for a log-sum-exp (batch, nheads, seqlen)). ``seqlen``: the full
    length; by default the ranks' lengths are gathered first (one more small collective). ``cu_seqlens``: x is a
    rank's part of a packed batch of these whole-batch cu_seqlens (``dim`` default 0; 1 for a varlen
    log-sum-exp (nheads, total_tokens)).
    """
    dim = _check_dim(x, (0 if cu_seqlens is not None else 1) if dim is None else dim)
    if not dist.is_initialized():
        raise RuntimeError("unshard needs an initialized default process group: call "
                           "torch.distributed.init_process_group")
    world_size = dist.get_world_size(group)
    if seqlen is None and cu_seqlens is None:
        lengths = [torch.zeros(1, dtype=torch.int64, device=x.device) for _ in range(world_size)]
        dist.all_gather(lengths, torch.tensor([x.shape[dim]], device=x.device), group=group)
        seqlen = int(sum(int(n) for n in lengths))
    ring = _layout_ring(group, x, dim, cu_seqlens, seqlen, local=True)
    layout = ring.layout
    longest = max(layout.rank_length(rank) for rank in range(world_size))
    padded = x.detach().contiguous()
    if padded.shape[dim] < longest:  # all_gather moves equal sizes
        pad_shape = list(padded.shape)
        pad_shape[dim] = longest - padded.shape[dim]
        padded = torch.cat((padded, padded.new_zeros(pad_shape)), dim=dim)
    parts = [torch.empty_like(padded) for _ in range(world_size)]
    dist.all_gather(parts, padded, group=group)
    runs: list[tuple[int, torch.Tensor]] = []
    for rank, part in enumerate(parts):
        offset = 0
        for start, length in layout.runs(rank):
            runs.append((start, part.narrow(dim, offset, length)))
            offset += length
    return torch.cat([run for _, run in sorted(runs, key=lambda r: r[0])], dim=dim)
