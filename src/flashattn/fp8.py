"""FP8 (e4m3) attention: quantization with incoherent processing, descales, their checks, and trainable FP8
attention.

FlashAttention-3's FP8 forward (Shah et al., 2024, arXiv:2407.08608, section 3.3) takes q, k, v in
``torch.float8_e4m3fn`` with float32 *descales*: the real value of an element is ``x_fp8 * descale``. A descale
is either one per (batch, kv head), shape (batch, nheads_k), or one per ``SCALE_BLOCK`` rows of the sequence
(block quantization), shape (batch, nheads_k, ceil(seqlen / SCALE_BLOCK)); query heads share their kv head's
descale (a GQA group is quantized together). The output is bfloat16.

:func:`quantize` makes such inputs from 16/32-bit ones. Its incoherent processing multiplies Q and K along the
head dim by the same random orthogonal matrix ``diag(s) H`` (random signs ``s``, then a normalized Walsh-Hadamard
transform ``H``): ``(Q M)(K M)^T = Q K^T`` exactly in real arithmetic, while an outlier channel is spread over
every channel, so that the block's amax (and with it the quantization step) shrinks. V is not rotated (the output
would have to be rotated back). A head dim that is not a power of two is cut into power-of-two pieces, largest
first (96 = 64 + 32, 80 = 64 + 16), each rotated on its own: a block-diagonal Hadamard matrix, still orthogonal,
that spreads an outlier over its own piece only.

:func:`flash_attn_func` here is the trainable form: it takes 16-bit q, k, v, quantizes them inside (block descales,
the rotation), runs the FP8 forward, and differentiates through an FP8 backward whose products see e4m3 dO, P and
dS (``fp8_backward``; docs/fp8.md, "The backward"). The quantizer itself lives in ``fp8_quantize``, below the ops,
and is re-exported here.
"""

from __future__ import annotations

import torch

from .autograd import FP8FlashAttnFunction
from .fp8_format import E4M3_MAX as E4M3_MAX
from .fp8_format import FP8_DTYPE as FP8_DTYPE
from .fp8_format import P_SCALE as P_SCALE  # what the kernels scale P by
from .fp8_format import SCALE_BLOCK as SCALE_BLOCK
from .fp8_format import dequantize as dequantize
from .fp8_format import hadamard_pieces as hadamard_pieces
from .fp8_format import rotation_matrix as rotation_matrix
from .fp8_quantize import Quantized as Quantized
from .fp8_quantize import canonical_descales as canonical_descales
from .fp8_quantize import check_quantize_options
from .fp8_quantize import quantize as quantize
from .fp8_quantize import quantize_packed as quantize_packed
from .fp8_quantize import quantize_tensor as quantize_tensor
from .fp8_quantize import random_signs as random_signs
from .fp8_quantize import rotate as rotate
from .fp8_quantize import round_to_e4m3 as round_to_e4m3
from .options import AttentionOptions, FP8Options
from .validation import check_dense


def flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    hadamard: bool = True,
    seed: int | None = None,
    granularity: str = "block",
):
    """Trainable FP8 attention: :func:`flashattn.flash_attn_func`'s arguments on bfloat16 / float16 q, k, v, which
    it quantizes to e4m3 inside; the forward is the FP8 forward, the backward rounds dO, P and dS to e4m3 too.

    Args:
        q: (batch, seqlen_q, nheads, headdim), bfloat16 or float16, headdim 1..256.
        k, v: (batch, seqlen_k, nheads_k, headdim), q's dtype; nheads divisible by nheads_k (GQA/MQA).
        softmax_scale, causal, window_size, softcap: as in :func:`flashattn.flash_attn_func` (the causal mask is
            aligned to the bottom-right corner: query i sees key j when j <= i + seqlen_k - seqlen_q).
        dropout_p, alibi_slopes: refused (the FP8 forward has neither); the defaults only.
        deterministic: as in ``flash_attn_func``: with it the backward repeats bitwise; without it the sm90 kernels
            add dQ in any order at head dim 64 (dQ inside the dK/dV kernel).
        return_attn_probs: also return the log-sum-exp, as flash_attn_func does.
        hadamard: rotate q and k by a random orthogonal matrix before quantizing (see :func:`quantize`); dq and dk
            are rotated back, so the gradients are in q's and k's own basis either way.
        seed: the rotation's random signs (None: drawn from torch's default generator at the call).
        granularity: "block" (a descale per 128 rows of a kv head's group) or "head" (one per batch and kv head),
            for q, k, v and dO alike.

    Returns:
        out of q's shape and dtype (the FP8 forward computes bfloat16; float16 inputs get it converted); with
        ``return_attn_probs``, ``(out, softmax_lse, None)``. Gradients of q, k, v come in their dtype.
    """
    check_dense(q, k, v, dropout_p, window_size, softcap, alibi_slopes, softmax_scale)
    if q.dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"q must be bfloat16 or float16 (the FP8 attention quantizes 16-bit inputs), got {q.dtype}")
    refuse_options(dropout_p=dropout_p, alibi_slopes=alibi_slopes)
    check_quantize_options(hadamard, seed, granularity)
    attention = AttentionOptions.build(q.shape[-1], softmax_scale, causal, window_size, softcap, 0.0, deterministic)
    out, lse = FP8FlashAttnFunction.apply(q, k, v, FP8Options(attention, hadamard, seed, granularity))
    return (out, lse, None) if return_attn_probs else out


# ---------------------------------------------------------------------------------------------
# Checks of an FP8 call: dtypes, descales, and the options that do not carry over
# ---------------------------------------------------------------------------------------------


def is_fp8(x) -> bool:
    return isinstance(x, torch.Tensor) and x.dtype in (torch.float8_e4m3fn, torch.float8_e5m2,
                                                        torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)


def check_inputs(tensors: dict) -> None:
    """Every one of ``tensors`` (name -> tensor or None) float8_e4m3fn, none requiring grad."""
    for name, x in tensors.items():
        if x is None:
            continue
        if not isinstance(x, torch.Tensor) or x.dtype != FP8_DTYPE:
            got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
            raise TypeError(f"{name} must be torch.float8_e4m3fn like q (the FP8 forward takes e4m3 only), got {got}")
        if x.requires_grad:
            raise ValueError(f"{name} requires grad, but the FP8 attention is forward only: no gradient flows to "
                             f"float8 inputs (quantize detached tensors, or use bfloat16 inputs for training)")


def refuse_options(**options) -> None:
    """ValueError naming the first option that the FP8 forward does not carry (a value other than its default)."""
    for name, value in options.items():
        if value is not None and value is not False and not (isinstance(value, float | int) and value == 0):
            raise ValueError(f"{name} is not supported with float8 inputs (the FP8 forward has no {name}), got "
                             f"{value!r}")


def check_descales(q: torch.Tensor, k: torch.Tensor, descales: dict, batch: int, seqlens: tuple[int, int] | None,
                   ) -> None:
    """descales (name -> tensor or None): float32 on q's device, (batch, nheads_k), or with ``seqlens`` (dense calls)
    also (batch, nheads_k, ceil(seqlen / SCALE_BLOCK)), seqlen_q for q_descale and seqlen_k for the others."""
    nheads_k = k.shape[-2]
    for name, descale in descales.items():
        if descale is None:
            continue
        if not isinstance(descale, torch.Tensor):
            raise TypeError(f"{name} must be a float32 torch.Tensor or None, got {type(descale).__name__}")
        if descale.dtype != torch.float32:
            raise TypeError(f"{name} must be float32, got {descale.dtype}")
        if descale.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}, got {descale.device}")
        shapes = [(batch, nheads_k)]
        if seqlens is not None:
            seqlen = seqlens[0] if name == "q_descale" else seqlens[1]
            shapes.append((batch, nheads_k, -(-seqlen // SCALE_BLOCK)))
        if tuple(descale.shape) not in shapes:
            wanted = " or ".join(str(s) for s in shapes)
            raise ValueError(f"{name} must have shape {wanted} (batch, nheads_k"
                             f"{'[, seqlen blocks of ' + str(SCALE_BLOCK) + ']' if seqlens else ''}), "
                             f"got {tuple(descale.shape)}")
