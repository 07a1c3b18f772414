"""The FP8 backward's arithmetic in blocked PyTorch: the reference path, on CPU and on CUDA calls that the sm90 Gluon
kernels (``launch/backward_fp8.py``) do not cover, and what those kernels are tested against (docs/fp8.md, "The
backward").

It takes what the FP8 forward saved (e4m3 q and k in the rotated basis, e4m3 v, their descales, the output and the
log-sum-exp) and dO, and rounds every operand of the backward's products to e4m3 where the kernels do:

- dO: quantized like q (``fp8_quantize.quantize_tensor``: a descale per 128 rows of a kv head's group, or per head),
  when the backward starts; delta = rowsum(dO * O) takes the rounded dO, the one dP = dO V^T sees, so that each row
  of dS still sums to about zero;
- P: recomputed in float32 from the log-sum-exp, scaled by ``P_SCALE`` and rounded, as in the forward, for dV = P^T dO;
- dS = P * (dP - delta): rounded with its own descale, amax / 448 over each tile of ``DS_BLOCK_M`` queries x
  ``BLOCK_N`` keys of one query head, for dK = dS^T Q and dQ = dS K.

Products take those values dequantized (e4m3 value x descale) and sum in float32 into float32 gradients, a key block
at a time with up to ``ROW_SLAB`` of its queries in one product, not a 64-row tile at a time; dQ and dK are then
rotated back by the transpose of the forward's rotation and, like dV, returned in dO's dtype. Nothing of size
seqlen_q x seqlen_k is built.
"""

from __future__ import annotations

import torch

from . import masks
from .fp8_format import P_SCALE, SCALE_BLOCK, amax_over_e4m3_max, dequantize, rotation_matrix
from .fp8_quantize import quantize_tensor, round_to_e4m3
from .options import AttentionOptions

BLOCK_N = SCALE_BLOCK  # keys per tile: a key block lies in one block descale of k and v
DS_BLOCK_M = 64  # queries per dS descale: the Hopper kernels' query block (dK/dV) and consumer rows (dQ)
# queries a product takes at once: few operations a key block (on a GPU the path's cost is their dispatch), and a
# slab's float32 temporaries of (batch, heads, ROW_SLAB, BLOCK_N) bounded whatever the length
ROW_SLAB = 128 * DS_BLOCK_M


def _grouped(x: torch.Tensor, nheads_k: int) -> torch.Tensor:
    """(B, S, H, D) -> float32 (B, Hk, H // Hk, S, D)."""
    batch, seqlen, nheads, head_dim = x.shape
    return x.float().transpose(1, 2).reshape(batch, nheads_k, nheads // nheads_k, seqlen, head_dim)


def _ungrouped(x: torch.Tensor) -> torch.Tensor:
    """(B, Hk, G, S, D) -> (B, S, Hk * G, D)."""
    return x.flatten(1, 2).transpose(1, 2)


def rounded_tile(x: torch.Tensor) -> torch.Tensor:
    """x (..., rows, keys) rounded to e4m3 with one descale per (..., tile): amax / 448, never below float32's
    smallest normal number. A tile of dS whose P is about e^-100 (trained attention reaches logits past 100) has an
    amax under 448 x 2^-149, so amax / 448 would be 0 and the tile 0 / 0; at the floor its values round to zero."""
    amax = x.abs().amax(dim=(-2, -1), keepdim=True)
    descale = amax_over_e4m3_max(amax).clamp_min(torch.finfo(torch.float32).tiny)
    return round_to_e4m3(x / descale) * descale


def _rounded_row_tiles(x: torch.Tensor) -> torch.Tensor:
    """x (..., rows, keys), its rows from a multiple of DS_BLOCK_M: :func:`rounded_tile` over each DS_BLOCK_M rows
    (the last tile may be short: zero rows pad it, which leave its amax alone)."""
    rows = x.shape[-2]
    padded = torch.nn.functional.pad(x, (0, 0, 0, -rows % DS_BLOCK_M))
    tiles = padded.unflatten(-2, (-1, DS_BLOCK_M))
    return rounded_tile(tiles).flatten(-3, -2)[..., :rows, :]


def backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, descales: tuple, out: torch.Tensor,
             lse: torch.Tensor, signs: torch.Tensor | None, opts: AttentionOptions,
             granularity: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) in dout's dtype, dq and dk in the unrotated basis.

    dout, out: (B, Sq, H, D) 16-bit; q: e4m3 (B, Sq, H, D) and k, v: e4m3 (B, Sk, Hk, D) as the forward quantized
    them (q and k rotated by diag(signs) H when ``signs`` is given); descales: (q, k, v)'s; lse: float32 (B, H, Sq).
    """
    batch, seqlen_q, nheads, head_dim = q.shape
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    do8, do_descale = quantize_tensor(dout, nheads_k, granularity)
    qf, dof = (_grouped(dequantize(x, d), nheads_k) for x, d in ((q, descales[0]), (do8, do_descale)))
    kf, vf = (dequantize(x, d).transpose(1, 2) for x, d in ((k, descales[1]), (v, descales[2])))  # (B, Hk, Sk, D)
    delta = (dof * _grouped(out, nheads_k)).sum(-1)  # (B, Hk, G, Sq)
    lse_g = lse.view(batch, nheads_k, nheads // nheads_k, seqlen_q)
    dq = torch.zeros_like(qf)
    dk, dv = torch.zeros_like(kf), torch.zeros_like(vf)
    key_lo, key_hi = masks.visible_key_range(seqlen_q, seqlen_k, opts.window_left, opts.window_right)
    # tiles start at multiples of BLOCK_N and DS_BLOCK_M whatever the mask, so that a dS descale covers fixed keys and
    # rows (the ones no query sees have P = 0 and leave the amax alone); a key block takes its query tiles a slab at a
    # time
    for block in range(key_lo - key_lo % BLOCK_N, key_hi, BLOCK_N):
        start, end = max(block, key_lo), min(block + BLOCK_N, key_hi)
        query_lo, query_hi = masks.visible_query_range(start, end, seqlen_q, seqlen_k, opts.window_left,
                                                       opts.window_right)
        if query_lo >= query_hi:
            continue
        k_block, v_block = kf[:, :, None, start:end], vf[:, :, None, start:end]  # (B, Hk, 1, n, D)
        key_idx = torch.arange(start, end, device=q.device).view(1, -1)
        for first in range(query_lo - query_lo % DS_BLOCK_M, query_hi, ROW_SLAB):
            rows = slice(first, min(query_hi, first + ROW_SLAB))
            q_rows, do_rows = qf[..., rows, :], dof[..., rows, :]
            scores = (q_rows * opts.softmax_scale) @ k_block.transpose(-1, -2)
            capped = None
            if opts.softcap > 0:
                capped = torch.tanh(scores / opts.softcap)
                scores = opts.softcap * capped
            query_idx = torch.arange(rows.start, rows.stop, device=q.device).view(-1, 1)
            seen = masks.visible(query_idx, key_idx, seqlen_q, seqlen_k, opts.window_left, opts.window_right)
            # a row that sees no key anywhere has lse = -inf: where, not masked_fill, keeps its P at 0 rather than NaN
            probs = torch.where(seen, (scores - lse_g[..., rows, None]).exp(), 0.0)
            dscores = probs * (do_rows @ v_block.transpose(-1, -2) - delta[..., rows, None])
            if capped is not None:
                dscores = dscores * (1.0 - capped * capped)
            probs8 = round_to_e4m3(probs * P_SCALE) / P_SCALE
            dscores8 = _rounded_row_tiles(dscores)
            dv[:, :, start:end] += (probs8.transpose(-1, -2) @ do_rows).sum(dim=2)
            dk[:, :, start:end] += (dscores8.transpose(-1, -2) @ q_rows).sum(dim=2)
            dq[..., rows, :] += dscores8 @ k_block
    dq, dk = dq * opts.softmax_scale, dk * opts.softmax_scale
    if signs is not None:
        # q and k were rotated as x M, so the gradient of x is the rotated one times M^T
        back = rotation_matrix(signs, torch.float32).T
        dq, dk = dq @ back, dk @ back
    # contiguous in the inputs' (B, S, H, D) layout, as the op's fake promises
    grads = (_ungrouped(dq), dk.transpose(1, 2), dv.transpose(1, 2))
    return tuple(x.to(dout.dtype, memory_format=torch.contiguous_format) for x in grads)
