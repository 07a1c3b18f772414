"""The dropout stream in plain PyTorch, bit-identical to ``tl.rand`` in the Triton kernels.

Triton's ``tl.rand(seed, offset)`` runs Philox-4x32 with 10 rounds on the counter
(offset_lo, offset_hi, 0, 0) and key (seed_lo, seed_hi), and maps the first word to [0, 1). Reproducing
it here lets the CPU path, the reference and the kernels drop exactly the same scores, so each can be
checked against the others with dropout on. A score is kept when its uniform draw is >= ``dropout_p``.

Which counter a score takes:

- dense, score (b, h, i, j) of (batch, nheads, seqlen_q, seqlen_k):
  ``offset + ((b * nheads + h) * seqlen_q + i) * seqlen_k + j``;
- varlen (packed sequences), query token ``tq`` and key token ``tk`` of the packed tensors (their rows in
  q and k, i.e. ``cu_seqlens_q[b] + i`` and ``cu_seqlens_k[b] + j``), head h:
  ``offset + (h * total_q + tq) * total_k + tk``. This is the dense formula for one batch of the whole
  packed tensors (seqlen_q = total_q, seqlen_k = total_k), so it depends only on where the tokens sit,
  never on ``max_seqlen``. A :class:`StreamFrame` places one sequence in that stream;
- a call placed in a larger dense problem by a position frame (``options.PositionFrame``, a ring step): the
  larger problem's counter, ``offset + ((b * nheads + h) * frame_seqlen_q + query_start + i) * frame_seqlen_k
  + key_start + j``, so that a ring draws the mask of the single call on the whole sequence. A
  :class:`StreamFrame` of any batch carries it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_MASK32 = 0xFFFFFFFF
_KEY_A, _KEY_B = 0x9E3779B9, 0xBB67AE85
_ROUND_A, _ROUND_B = 0xD2511F53, 0xCD9E8D57
_UNIFORM_SCALE = 4.6566127342e-10  # 2**-31, as Triton writes it


def _mulhilo(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # int64 products of two 32-bit words wrap, but their low 64 bits stay exact.
    product = b * a
    return (product >> 32) & _MASK32, product & _MASK32


def philox_uniform(seed: int, counter: torch.Tensor) -> torch.Tensor:
    """Uniform float32 draws in [0, 1) for int64 ``counter`` values, as ``tl.rand(seed, counter)``."""
    c0 = counter & _MASK32
    c1 = (counter >> 32) & _MASK32
    c2 = torch.zeros_like(c0)
    c3 = torch.zeros_like(c0)
    k0, k1 = seed & _MASK32, (seed >> 32) & _MASK32
    for _ in range(10):
        hi_b, lo_b = _mulhilo(_ROUND_B, c2)
        hi_a, lo_a = _mulhilo(_ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0 = (k0 + _KEY_A) & _MASK32
        k1 = (k1 + _KEY_B) & _MASK32
    signed = torch.where(c0 >= 2**31, c0 - 2**32, c0)
    signed = torch.where(signed < 0, -signed - 1, signed)
    return signed.to(torch.int32).to(torch.float32) * _UNIFORM_SCALE


@dataclass(frozen=True)
class StreamFrame:
    """Where a call's scores sit in a larger dropout stream (see the module doc): one sequence of a varlen batch
    (batch 1) in the packed stream, or a framed call in its larger problem's."""

    query_start: int  # cu_seqlens_q[b]; a position frame's query_start
    key_start: int  # cu_seqlens_k[b]; a position frame's key_start
    total_q: int  # the stream's row count: total_q, or the frame's seqlen_q
    total_k: int


def keep_mask(
    rng_state: torch.Tensor,
    dropout_p: float,
    batch: int,
    nheads: int,
    query_idx: torch.Tensor,
    key_idx: torch.Tensor,
    seqlen_q: int,
    seqlen_k: int,
    frame: StreamFrame | None = None,
) -> torch.Tensor:
    """Keep-mask of shape (batch, nheads, len(query_idx), len(key_idx)) for the given score indices.

    With a ``frame``, the indices are positions in the call's rows and the mask is the larger stream's;
    ``seqlen_q``/``seqlen_k`` are then unused.
    """
    if frame is not None:
        query_idx = query_idx + frame.query_start
        key_idx = key_idx + frame.key_start
        seqlen_q, seqlen_k = frame.total_q, frame.total_k
    seed, offset = (int(x) for x in rng_state.tolist())
    device = query_idx.device
    bh = torch.arange(batch * nheads, device=device, dtype=torch.int64).view(batch, nheads, 1, 1)
    rows = query_idx.to(torch.int64).view(1, 1, -1, 1)
    cols = key_idx.to(torch.int64).view(1, 1, 1, -1)
    counter = offset + (bh * seqlen_q + rows) * seqlen_k + cols
    return philox_uniform(seed, counter) >= dropout_p
