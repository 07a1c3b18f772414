"""The FP8 quantizer's launches (``kernels/quantize_fp8.py``): the rotation's operands, the two passes."""

from __future__ import annotations

import functools
import math

import torch

from .. import configs
from ..backend import interpreting
from ..fp8_format import sylvester_hadamard
from .common import cdiv, last_dim_contiguous
from .launcher import launch


def rotation_operands(signs: torch.Tensor, pieces: list[int], dtype: torch.dtype, width: int):
    """(S, col_scale): the +-1 matrix diag(signs) H (block-diagonal over ``pieces``), zero-padded to ``width`` and
    in ``dtype`` (exact), and each column's 1 / sqrt(its piece's size), float32. H is built once a shape and device:
    a call costs one product with the signs."""
    h, col_scale = _hadamard_operands(tuple(pieces), width, signs.device)
    signs = torch.nn.functional.pad(signs, (0, width - signs.numel()))
    return (signs[:, None] * h).to(dtype), col_scale


@functools.lru_cache(maxsize=16)
def _hadamard_operands(pieces: tuple[int, ...], width: int, device: torch.device):
    """The +-1 Sylvester-Hadamard blocks of ``pieces`` on the diagonal of a (width, width) float32 matrix, and each
    column's 1 / sqrt(its piece's size)."""
    blocks = [sylvester_hadamard(n, device) for n in pieces]
    scales = [torch.full((n,), 1 / math.sqrt(n), device=device) for n in pieces]
    head_dim = sum(pieces)
    s = torch.zeros(width, width, device=device)
    s[:head_dim, :head_dim] = torch.block_diag(*blocks)
    col_scale = torch.zeros(width, device=device)
    col_scale[:head_dim] = torch.cat(scales)
    return s, col_scale


def quantize_rows(x: torch.Tensor, rotation, nheads_k: int, block_rows: int, e4m3_max: float, per_head: bool,
                  fp8_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 x, float32 descale) of a 16-bit (batch, seqlen, nheads, head_dim) x, rotated first by ``rotation`` (the
    (S, col_scale) of :func:`rotation_operands`, or None); descale = amax / e4m3_max of each ``block_rows`` rows of a
    kv head's group, (batch, nheads_k, blocks), or with ``per_head`` of the whole sequence, (batch, nheads_k); an
    all-zero block or sequence takes 1."""
    from ..kernels.quantize_fp8 import block_amax_kernel, quantize_kernel

    x = last_dim_contiguous(x)
    batch, seqlen, nheads, head_dim = x.shape
    width = configs.padded_head_dim(head_dim)
    blocks = cdiv(seqlen, block_rows)
    s, col_scale = rotation if rotation is not None else (x, x)  # any pointer: the kernels never read it
    # No spills at any width (sm90 builds). One stage: pipelining the row loop would stage every column chunk's S
    # tiles at once, more shared memory than a Hopper program has.
    rows, cols, warps, stages = configs.QUANTIZE_TILES[width]
    shapes = dict(HEAD_DIM=head_dim, BLOCK_D=width, BLOCK_ROWS=block_rows, ROWS=rows, COLS=cols,
                  ROTATE=rotation is not None, UPCAST=interpreting(), num_warps=warps, num_stages=stages)
    grid = (blocks, nheads_k, batch)
    descale = torch.empty(batch, nheads_k, blocks, dtype=torch.float32, device=x.device)  # per_head: the amax first
    launch(block_amax_kernel, grid, x, s, col_scale, descale, seqlen, nheads // nheads_k, x.stride(0), x.stride(1),
           x.stride(2), descale.stride(0), descale.stride(1), e4m3_max, DESCALE=not per_head, **shapes)
    if per_head:
        amax = descale.amax(dim=2)
        descale = torch.where(amax > 0, amax / e4m3_max, torch.ones_like(amax))
    out = torch.empty(x.shape, dtype=fp8_dtype, device=x.device)
    launch(quantize_kernel, grid, x, s, col_scale, descale, out, seqlen, nheads // nheads_k, x.stride(0),
           x.stride(1), x.stride(2), out.stride(0), out.stride(1), out.stride(2), descale.stride(0),
           descale.stride(1), 0 if per_head else descale.stride(2), e4m3_max, **shapes)
    return out, descale
