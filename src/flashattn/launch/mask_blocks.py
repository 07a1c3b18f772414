"""Which tiles of scores an SDPA mask hides entirely: the kernels skip them.

A tile of (BLOCK_M queries x BLOCK_N keys) whose every score a mask hides (a boolean mask False, a float
mask -inf) adds nothing to the softmax nor to a gradient, so the kernels need not load its K/V (or Q/dO)
nor compute it. The host summarizes the mask once per op call, in a few torch reductions on the mask's
device (no synchronization), and each kernel gets a *block map* at its own tile sizes (int32):

    block_map[b, h, r] = [before_0, ..., before_n, listed_0, ..., listed_{n-1}]

Row ``r`` is a program's block: a query block for the forward and dQ kernels (its ``n`` tiles run over
key blocks), a key block for the dK/dV kernel (they run over query blocks). ``listed`` holds the blocks
with a visible score, in increasing order; ``before_j`` counts those before block ``j``. A kernel whose
causal or window bounds give it blocks [lo, hi) walks ``listed[before_lo:before_hi]``: a plain loop that
loads one block index per step, so it visits no hidden tile (leading, trailing or in between) and,
unlike a branch per block, keeps Triton's software pipelining of the K/V (Q/dO) loads.

Batch and head dims where the mask broadcasts (size 1, or stride 0 after ``expand``) stay of size 1 in
the summary and the map, and reach the kernels as stride-0 dims, as the mask does. The summary reads the
mask once; its largest temporary is one flag per (query, key block), Sq x Sk / BLOCK_N of them.
"""

from __future__ import annotations

import math

import torch

from .. import configs
from .launcher import launch


def _collapse_broadcast(mask: torch.Tensor) -> torch.Tensor:
    """The mask with its stride-0 (expanded) dims cut to size 1: they hold one value, summarized once."""
    index = tuple(slice(0, 1) if size > 1 and stride == 0 else slice(None)
                  for size, stride in zip(mask.shape, mask.stride(), strict=True))
    return mask[index]


def _any_over_blocks(x: torch.Tensor, dim: int, block: int) -> torch.Tensor:
    """Reduce ``dim`` of ``x`` in groups of ``block`` (the last group may be shorter): ``any`` for bool,
    ``amax`` otherwise. A dim of size 1 stays 1: it is a broadcast that stands for every block."""
    size = x.shape[dim]
    if size == 1 or block == 1:
        return x
    reduce = (lambda t, d: t.any(d)) if x.dtype == torch.bool else (lambda t, d: t.amax(d))
    whole = size // block
    parts = []
    if whole:
        parts.append(reduce(x.narrow(dim, 0, whole * block).unflatten(dim, (whole, block)), dim + 1))
    if size % block:
        parts.append(reduce(x.narrow(dim, whole * block, size - whole * block), dim).unsqueeze(dim))
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim)


def block_summary(attn_mask: torch.Tensor, block_m: int, block_n: int) -> torch.Tensor:
    """Bool (Bm, Hm, cdiv(Lq, block_m), cdiv(Lk, block_n)): whether any score of each tile is visible.

    ``attn_mask``: a 4-dim SDPA mask (bool, True = visible; or float, visible where not -inf) of shape
    broadcastable to (B, H, Lq, Lk). Bm, Hm are 1 where the mask broadcasts, as is a tile dim where
    its Lq or Lk is 1 (one entry then stands for every block). A bool summary may be summarized again
    to coarser tiles whose sizes are multiples of these: ``block_summary(s, 2, 4)``.
    """
    mask = _collapse_broadcast(attn_mask.detach())
    # keys first: (.., Lq, Lk) -> (.., Lq, key blocks) is the one temporary of size O(Lq x Lk / block_n)
    reduced = _any_over_blocks(_any_over_blocks(mask, 3, block_n), 2, block_m)
    return reduced if reduced.dtype == torch.bool else reduced != float("-inf")  # NaN counts as visible


def block_map(summary: torch.Tensor, rows: int, columns: int, transpose: bool = False) -> torch.Tensor:
    """int32 (Bm, Hm, rows, 2 * columns + 1): per row, the visible blocks before each block, then their list.

    ``summary``: a (Bm, Hm, query blocks, key blocks) bool :func:`block_summary`, whose tile dims may be
    1 (broadcast); ``rows`` x ``columns`` is the kernel's grid of tiles, query blocks x key blocks, or
    key blocks x query blocks with ``transpose`` (the dK/dV kernel's rows are key blocks). Entry ``j``
    of a row, ``j <= columns``, counts the visible blocks before block ``j``; the list of the visible
    blocks in increasing order starts at ``columns + 1``, and the hidden blocks follow it (never read).
    One launch of ``kernels/block_map.py`` per map.
    """
    from ..kernels.block_map import block_map_kernel  # triton is imported only where kernels run

    tiles = summary.transpose(2, 3) if transpose else summary
    # a tile dim of size 1 stands for every block: it is read with stride 0
    strides = [0 if size == 1 else stride for size, stride in zip(tiles.shape, tiles.stride(), strict=True)]
    batch, heads = tiles.shape[:2]
    result = torch.empty(batch, heads, rows, 2 * columns + 1, dtype=torch.int32, device=summary.device)
    launch(
        block_map_kernel, (batch * heads, rows),
        tiles.view(torch.uint8) if tiles.dtype == torch.bool else tiles, result, *strides,
        *result.stride()[:3], heads, columns, BLOCK=max(16, configs.next_power_of_2(columns)))
    return result


def block_maps(attn_mask: torch.Tensor, seqlen_q: int, seqlen_k: int,
               *tiles: tuple[int, int, bool]) -> tuple[torch.Tensor, ...]:
    """One block map per kernel, each ``(block_m, block_n, rows_are_keys)``, from one pass over the mask.

    The kernels of one call tile differently (the backward's dK/dV and dQ kernels): the mask is
    summarized once at the finest common tiles (the gcd of their sizes), and that small summary is
    reduced to each kernel's tiles.
    """
    fine_m = math.gcd(*(block_m for block_m, _, _ in tiles))
    fine_n = math.gcd(*(block_n for _, block_n, _ in tiles))
    fine = block_summary(attn_mask, fine_m, fine_n)
    maps = []
    for block_m, block_n, rows_are_keys in tiles:
        summary = block_summary(fine, block_m // fine_m, block_n // fine_n)
        query_blocks, key_blocks = -(-seqlen_q // block_m), -(-seqlen_k // block_n)
        if rows_are_keys:
            maps.append(block_map(summary, key_blocks, query_blocks, transpose=True))
        else:
            maps.append(block_map(summary, query_blocks, key_blocks))
    return tuple(maps)
