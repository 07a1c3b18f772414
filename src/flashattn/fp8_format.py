"""The FP8 format, shared by the public FP8 functions (``fp8``) and the launches below them (``launch.forward_fp8``,
``launch.quantize_fp8``): the element type, its range, the block of sequence rows a descale covers, the scale P takes
before its rounding to e4m3, how a descale divides and what a descaled e4m3 tensor stands for, and the
Hadamard matrices of the rotation."""

from __future__ import annotations

import math

import torch

FP8_DTYPE = torch.float8_e4m3fn
E4M3_MAX = 448.0  # the largest finite e4m3 value
SCALE_BLOCK = 128  # sequence rows per block descale
P_SCALE = 256.0
"""The kernel's probabilities P in [0, 1] are multiplied by this before their rounding to e4m3 (and the output
divided by it): 256 P stays below E4M3_MAX, a power of two scales exactly, and it keeps P down to 2^-17 out of
e4m3's subnormals (P < 2^-10 would round to zero unscaled)."""


def amax_over_e4m3_max(amax: torch.Tensor) -> torch.Tensor:
    """amax / E4M3_MAX rounded as one IEEE division on every device, as the kernels' ``div_rn`` rounds it. PyTorch's
    CUDA division by a Python number multiplies by its reciprocal instead, an ulp off the quotient for some amaxes, and
    a descale an ulp apart moves the e4m3 rounding of the 16-bit values that lie on a midpoint between two e4m3
    values (about one in a thousand of a block's)."""
    return amax / torch.full_like(amax, E4M3_MAX)


def e4m3_descale(amax: torch.Tensor) -> torch.Tensor:
    """The descale of a block (or row, or head) of this amax: :func:`amax_over_e4m3_max`, 1 where the amax is 0 (an
    all-zero block quantizes exactly at any scale)."""
    return torch.where(amax > 0, amax_over_e4m3_max(amax), torch.ones_like(amax))


def has_blocks(descales: tuple[torch.Tensor, ...]) -> bool:
    """Whether any of the (batch, nheads_k, blocks) descales has more than one block (block quantization)."""
    return any(d.shape[2] > 1 for d in descales)


def sylvester_hadamard(n: int, device: torch.device) -> torch.Tensor:
    """The (n, n) +-1 Sylvester-Hadamard matrix, float32 (exact in any float dtype), n a power of two."""
    h = torch.ones(1, 1, device=device)
    while h.shape[0] < n:  # H_2n = [[H, H], [H, -H]]
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    return h


def hadamard_pieces(head_dim: int) -> list[int]:
    """The power-of-two pieces of the head dim that are rotated separately, largest first (its binary digits)."""
    return [1 << bit for bit in reversed(range(head_dim.bit_length())) if head_dim >> bit & 1]


def rotation_matrix(signs: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The (head_dim, head_dim) orthogonal matrix diag(signs) H: H block-diagonal over :func:`hadamard_pieces`, each
    block the normalized Sylvester-Hadamard matrix of its size (entries +-1 / sqrt(n))."""
    blocks = [sylvester_hadamard(n, signs.device).to(dtype) / math.sqrt(n) for n in hadamard_pieces(signs.numel())]
    return signs.to(dtype)[:, None] * torch.block_diag(*blocks)


def dequantize(x: torch.Tensor, descale: torch.Tensor | None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """x_fp8 (batch, seqlen, nheads, head_dim) times its descale ((batch, nheads_k), (batch, nheads_k, blocks) or
    None for 1), in ``dtype``: the values the attention computes with."""
    values = x.to(dtype)
    if descale is None:
        return values
    batch, seqlen, nheads, head_dim = x.shape
    nheads_k = descale.shape[1]
    per_row = descale.to(dtype)
    if per_row.dim() == 3 and per_row.shape[2] == 1:
        per_row = per_row[:, :, 0]  # one block: one descale for the sequence (``canonical_descales``)
    if per_row.dim() == 3:
        per_row = per_row.repeat_interleave(SCALE_BLOCK, dim=2)[:, :, :seqlen].transpose(1, 2)  # (b, s, hk)
    else:
        per_row = per_row[:, None, :]
    grouped = values.reshape(batch, seqlen, nheads_k, nheads // nheads_k, head_dim)
    return (grouped * per_row[..., None, None]).reshape(x.shape)
