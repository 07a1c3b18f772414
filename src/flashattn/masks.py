"""One definition of which key a query sees, and of the ALiBi bias it gets.

Query ``i`` sees key ``j`` when ``i + Sk - Sq - left <= j <= i + Sk - Sq + right``, a bound of -1 being
absent. Causal attention is ``right == 0``: the diagonal is aligned to the bottom-right corner when
``Sq != Sk``. ALiBi adds ``-slope * |i + Sk - Sq - j|`` to the score.

A call placed in a larger problem by a position frame (``options.PositionFrame``: a ring step's pair of chunks)
moves the diagonal by ``shift`` (``PositionFrame.diagonal_shift``): every ``i + Sk - Sq`` above becomes
``i + Sk - Sq + shift``, which is the larger problem's rule in its own positions. The bounds stay as they are, so
any window, -1 included, keeps its meaning.

The reference, the CPU path and the Triton kernels (``kernels/common.py``) all use this rule; the tests
check them against each other. An SDPA ``attn_mask`` (bool: True = take part; float: added to the
scores after the softcap) applies on top of it, in ``kernels/common.apply_attn_mask``, ``cpu.py`` and
the reference.
"""

from __future__ import annotations

import torch


def visible(
    query_idx: torch.Tensor,
    key_idx: torch.Tensor,
    seqlen_q: int,
    seqlen_k: int,
    window_left: int,
    window_right: int,
    shift: int = 0,
) -> torch.Tensor:
    """Boolean tensor (broadcast of the two index tensors): whether each query sees each key."""
    diagonal = query_idx + (seqlen_k - seqlen_q + shift)
    seen = key_idx < seqlen_k
    if window_left >= 0:
        seen = seen & (key_idx >= diagonal - window_left)
    if window_right >= 0:
        seen = seen & (key_idx <= diagonal + window_right)
    return seen


def alibi_distance(query_idx: torch.Tensor, key_idx: torch.Tensor, seqlen_q: int, seqlen_k: int,
                   shift: int = 0) -> torch.Tensor:
    """|i + Sk - Sq - j|: the ALiBi bias is ``-slope`` times this."""
    return (query_idx + (seqlen_k - seqlen_q + shift) - key_idx).abs()


def visible_key_range(seqlen_q: int, seqlen_k: int, window_left: int, window_right: int,
                      shift: int = 0) -> tuple[int, int]:
    """The keys [lo, hi) that at least one query sees; a loop over keys may skip the rest."""
    offset = seqlen_k - seqlen_q + shift
    lo = max(0, offset - window_left) if window_left >= 0 else 0
    hi = min(seqlen_k, seqlen_q - 1 + offset + window_right + 1) if window_right >= 0 else seqlen_k
    return lo, max(lo, hi)


def visible_query_range(key_start: int, key_end: int, seqlen_q: int, seqlen_k: int, window_left: int,
                        window_right: int, shift: int = 0) -> tuple[int, int]:
    """The queries [lo, hi) that see at least one key of [key_start, key_end); the others see none of them."""
    offset = seqlen_k - seqlen_q + shift
    lo = max(0, key_start - offset - window_right) if window_right >= 0 else 0
    hi = min(seqlen_q, key_end - offset + window_left) if window_left >= 0 else seqlen_q
    return lo, max(lo, hi)


def block_fully_visible(query_start: int, query_end: int, key_start: int, key_end: int, seqlen_q: int,
                        seqlen_k: int, window_left: int, window_right: int, shift: int = 0) -> bool:
    """Whether every query of [query_start, query_end) sees every key of [key_start, key_end)."""
    offset = seqlen_k - seqlen_q + shift
    if key_end > seqlen_k:
        return False
    if window_left >= 0 and key_start < query_end - 1 + offset - window_left:
        return False
    return not (window_right >= 0 and key_end - 1 > query_start + offset + window_right)


def sum_to_shape(grad: torch.Tensor, shape) -> torch.Tensor:
    """Sum ``grad`` over the dims where ``shape`` has size 1 (a broadcast mask's gradient), keeping the rank."""
    dims = [d for d, (size, full) in enumerate(zip(shape, grad.shape, strict=True)) if size == 1 and full != 1]
    return grad.sum(dim=dims, keepdim=True) if dims else grad
