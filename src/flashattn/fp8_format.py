"""The FP8 format, shared by the public FP8 functions (``fp8``) and the launches below them (``launch.forward_fp8``,
``launch.quantize_fp8``): the element type, its range, the block of sequence rows a descale covers, the scale P takes
before its rounding to e4m3, and the Hadamard matrices of the rotation."""

from __future__ import annotations

import torch

FP8_DTYPE = torch.float8_e4m3fn
E4M3_MAX = 448.0  # the largest finite e4m3 value
SCALE_BLOCK = 128  # sequence rows per block descale
P_SCALE = 256.0
"""The kernel's probabilities P in [0, 1] are multiplied by this before their rounding to e4m3 (and the output
divided by it): 256 P stays below E4M3_MAX, a power of two scales exactly, and it keeps P down to 2^-17 out of
e4m3's subnormals (P < 2^-10 would round to zero unscaled)."""


def has_blocks(descales: tuple[torch.Tensor, ...]) -> bool:
    """Whether any of the (batch, nheads_k, blocks) descales has more than one block (block quantization)."""
    return any(d.shape[2] > 1 for d in descales)


def sylvester_hadamard(n: int, device: torch.device) -> torch.Tensor:
    """The (n, n) +-1 Sylvester-Hadamard matrix, float32 (exact in any float dtype), n a power of two."""
    h = torch.ones(1, 1, device=device)
    while h.shape[0] < n:  # H_2n = [[H, H], [H, -H]]
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    return h
