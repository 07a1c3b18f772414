"""The FP8 quantizer's launches (``kernels/quantize_fp8.py``): the rotation's operands, the one pass or the two."""

from __future__ import annotations

import functools
import math

import torch

from .. import configs
from ..backend import interpreting
from ..fp8_format import e4m3_descale, sylvester_hadamard
from .common import cdiv, last_dim_contiguous
from .launcher import launch


def rotation_operands(signs: torch.Tensor, pieces: list[int], dtype: torch.dtype, width: int):
    """(S, col_scale): the +-1 matrix diag(signs) H (block-diagonal over ``pieces``), zero-padded to ``width`` and
    in ``dtype`` (exact), and each column's 1 / sqrt(its piece's size), float32. H is built once a shape and device
    (:func:`hadamard_operands`); a call costs one small launch with the signs."""
    from ..kernels.quantize_fp8 import signed_hadamard_kernel

    h, col_scale = hadamard_operands(tuple(pieces), width, signs.device)
    s = torch.empty(width, width, dtype=dtype, device=signs.device)
    rows = min(width, configs.SIGNED_HADAMARD_ROWS)
    launch(signed_hadamard_kernel, (width // rows,), signs, h, s, signs.numel(), BLOCK_D=width, ROWS=rows)
    return s, col_scale


@functools.lru_cache(maxsize=16)
def hadamard_operands(pieces: tuple[int, ...], width: int, device: torch.device):
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
    out, descale, _ = _quantize(x, rotation, None, nheads_k, block_rows, e4m3_max, per_head, fp8_dtype)
    return out, descale


def quantize_rows_and_delta(dout: torch.Tensor, o: torch.Tensor, nheads_k: int, block_rows: int, e4m3_max: float,
                            per_head: bool, fp8_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`quantize_rows` of dO (not rotated), and in the same pass delta = rowsum(dequantized e4m3 dO * O), float32
    (batch, nheads, seqlen) contiguous: from the rounded dO, the one dP = dO V^T sees (``fp8_backward``'s)."""
    return _quantize(dout, None, last_dim_contiguous(o), nheads_k, block_rows, e4m3_max, per_head, fp8_dtype)


def _quantize(x, rotation, o, nheads_k, block_rows, e4m3_max, per_head, fp8_dtype):
    """(out, descale, delta or None): the kernels, one pass where a block's rows fit a program's registers."""
    x = last_dim_contiguous(x)
    batch, seqlen, nheads, head_dim = x.shape
    width = configs.padded_head_dim(head_dim)
    group = nheads // nheads_k
    descale = torch.empty(batch, nheads_k, cdiv(seqlen, block_rows), dtype=torch.float32, device=x.device)
    out = torch.empty(x.shape, dtype=fp8_dtype, device=x.device)
    delta = torch.empty(batch, nheads, seqlen, dtype=torch.float32, device=x.device) if o is not None else None
    s, col_scale = rotation if rotation is not None else (x, x)  # any pointer: the kernels never read it
    rowsum = (o, delta) if o is not None else (x, descale)  # without a delta, any pointers: the kernels never read them
    if not per_head and one_pass(width, group):
        _quantize_one_pass(x, s, col_scale, rotation is not None, rowsum, o is not None, block_rows, group, e4m3_max,
                           descale, out)
        return out, descale, delta
    out, descale = _quantize_two_passes(x, s, col_scale, rotation is not None, rowsum, o is not None, nheads_k,
                                        block_rows, e4m3_max, per_head, descale, out)
    return out, descale, delta


def one_pass(width: int, group: int) -> bool:
    """Whether block descales of rows ``width`` wide in groups of ``group`` heads take the one-pass kernel: the
    rotated float32 rows of a 128-row block (128 x group x width, the group padded to a power of two) stay in
    registers up to 32K floats a program (sm90 builds on 16 warps: 95-120 registers, no spills); past that they would
    spill, and the two passes read x twice instead."""
    largest_group = configs.QUANTIZE_ONE_PASS_TILES[width][0]
    return configs.next_power_of_2(group) <= largest_group


def _quantize_one_pass(x, s, col_scale, rotate: bool, rowsum: tuple, with_delta: bool, block_rows: int, group: int,
                       e4m3_max: float, descale: torch.Tensor, out: torch.Tensor) -> None:
    """One program a (block, kv head, batch): x read and rotated once (``block_quantize_kernel``); ``rowsum``: (O,
    delta), written ``with_delta`` (dO's)."""
    from ..kernels.quantize_fp8 import block_quantize_kernel

    batch, seqlen, _, head_dim = x.shape
    width = configs.padded_head_dim(head_dim)
    _, depth, warps, stages = configs.QUANTIZE_ONE_PASS_TILES[width]
    o, delta = rowsum
    launch(block_quantize_kernel, (descale.shape[2], descale.shape[1], batch), x, s, col_scale, descale, out, o, delta,
           seqlen, x.stride(0), x.stride(1), x.stride(2), out.stride(0), out.stride(1), out.stride(2),
           descale.stride(0), descale.stride(1), o.stride(0), o.stride(1), o.stride(2), e4m3_max, HEAD_DIM=head_dim,
           BLOCK_D=width, BLOCK_ROWS=block_rows, GROUP=group, TILE_ROWS=block_rows * configs.next_power_of_2(group),
           DEPTH=depth, ROTATE=rotate, UPCAST=interpreting(), DELTA=with_delta, num_warps=warps,
           num_stages=stages)


def _quantize_two_passes(x, s, col_scale, rotate: bool, rowsum: tuple, with_delta: bool, nheads_k: int,
                         block_rows: int, e4m3_max: float, per_head: bool, descale: torch.Tensor, out: torch.Tensor):
    """(out, descale): the block amaxes (``block_amax_kernel``), then x read and rotated again and rounded
    (``quantize_kernel``); per-head descales reduce the blocks' amaxes in between."""
    from ..kernels.quantize_fp8 import block_amax_kernel, quantize_kernel

    batch, seqlen, nheads, head_dim = x.shape
    width = configs.padded_head_dim(head_dim)
    # No spills at any width (sm90 builds). One stage: pipelining the row loop would stage every column chunk's S
    # tiles at once, more shared memory than a Hopper program has.
    rows, cols, warps, stages = configs.QUANTIZE_TILES[width]
    shapes = dict(HEAD_DIM=head_dim, BLOCK_D=width, BLOCK_ROWS=block_rows, ROWS=rows, COLS=cols, ROTATE=rotate,
                  UPCAST=interpreting(), num_warps=warps, num_stages=stages)
    grid = (descale.shape[2], nheads_k, batch)
    launch(block_amax_kernel, grid, x, s, col_scale, descale, seqlen, nheads // nheads_k, x.stride(0), x.stride(1),
           x.stride(2), descale.stride(0), descale.stride(1), e4m3_max, DESCALE=not per_head, **shapes)
    if per_head:  # the blocks' amaxes first
        amax = descale.amax(dim=2)
        descale = e4m3_descale(amax)
    o, delta = rowsum
    launch(quantize_kernel, grid, x, s, col_scale, descale, out, o, delta, seqlen, nheads // nheads_k, x.stride(0),
           x.stride(1), x.stride(2), out.stride(0), out.stride(1), out.stride(2), descale.stride(0),
           descale.stride(1), 0 if per_head else descale.stride(2), o.stride(0), o.stride(1), o.stride(2), e4m3_max,
           DELTA=with_delta, **shapes)
    return out, descale
