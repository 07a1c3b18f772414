"""The FLOP convention every FlashAttention benchmark uses: what a call's TFLOP/s are counted from."""

from __future__ import annotations


def forward_flops(batch: int, seqlen_q: int, seqlen_k: int, heads: int, head_dim: int, causal: bool) -> int:
    """Two matmuls of 2 * Sq * Sk * D each per head, halved when causal."""
    full = 4 * batch * heads * seqlen_q * seqlen_k * head_dim
    return full // 2 if causal else full


def backward_flops(batch: int, seqlen_q: int, seqlen_k: int, heads: int, head_dim: int, causal: bool) -> int:
    """:func:`backward_of` the forward's."""
    return backward_of(forward_flops(batch, seqlen_q, seqlen_k, heads, head_dim, causal))


def backward_of(forward):
    """A backward's FLOPs from its forward's: 2.5x (dV, dP, dQ, dK and a recomputed Q K^T: 5 matmuls for 2)."""
    return forward * 5 // 2
