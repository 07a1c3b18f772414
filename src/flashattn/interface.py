"""Public functions, with the flash-attn 2 signatures: defaults and docstrings (the checks: ``validation.py``).

Layout: (batch, seqlen, nheads, headdim). Causal and window masks are aligned to the bottom-right
corner of the score matrix when seqlen_q != seqlen_k. For seqlen_q = 2, seqlen_k = 5, causal=True::

    1 1 1 1 0
    1 1 1 1 1

and for seqlen_q = 5, seqlen_k = 2 (rows 0-2 see no key: their output is 0)::

    0 0
    0 0
    0 0
    1 0
    1 1
"""

from __future__ import annotations

import torch

from . import fp8, ops_fp8
from .autograd import EmptyAttentionFunction, FlashAttnFunction
from .options import AttentionOptions
from .sinks import check_sinks
from .validation import check_dense, check_kv_like_q, check_options, check_scale, check_tensor


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
    q_descale: torch.Tensor | None = None,
    k_descale: torch.Tensor | None = None,
    v_descale: torch.Tensor | None = None,
    learnable_sink: torch.Tensor | None = None,
):
    """Exact attention softmax(q k^T * scale) v, computed in tiles without the N x N matrix.

    Args:
        q: (batch, seqlen_q, nheads, headdim), float16 / bfloat16 / float32, headdim 1..256.
        k, v: (batch, seqlen_k, nheads_k, headdim), nheads divisible by nheads_k (GQA/MQA:
            query head h uses kv head h // (nheads // nheads_k)).
        dropout_p: dropout probability on the attention probabilities (use 0.0 at evaluation).
        softmax_scale: defaults to 1 / sqrt(headdim).
        causal: bottom-right aligned causal mask (see the module docstring).
        window_size: (left, right); query i sees key j when
            i + Sk - Sq - left <= j <= i + Sk - Sq + right; a negative side (-1) is unbounded.
        softcap: if > 0, scores become softcap * tanh(scores / softcap).
        alibi_slopes: float32 (nheads,) or (batch, nheads); adds -slope * |i + Sk - Sq - j|.
        deterministic: bitwise repeatable gradients. False (the default) lets the sm90 backward add dQ into float32
            by TMA reductions in no fixed order (the fused dK/dV/dQ kernel); True keeps its two passes, as does
            ``torch.use_deterministic_algorithms(True)``.
        return_attn_probs: also return the log-sum-exp.
        q_descale, k_descale, v_descale: FP8 inputs only (q, k, v all ``torch.float8_e4m3fn``; see
            ``flashattn.fp8``): float32 descales, the real value of an element being ``x_fp8 * descale``, per
            (batch, kv head), shape (batch, nheads_k), or per ``fp8.SCALE_BLOCK`` = 128 sequence rows, shape
            (batch, nheads_k, ceil(seqlen / 128)) with seqlen_q for q_descale and seqlen_k for the others; None
            means 1. The FP8 call is forward only and returns bfloat16; dropout_p and alibi_slopes are refused.
        learnable_sink: attention sinks (FlashAttention-4's argument; GPT-OSS's sinks): (nheads,) floating point,
            one logit per query head that joins every row's softmax without a value, so a row's probabilities
            are exp(s_ij) / (sum_j exp(s_ij) + exp(sink_h)). It gets a gradient; the log-sum-exp returned counts
            it. Not with FP8 inputs.

    Returns:
        out of q's shape and dtype (bfloat16 for FP8 inputs); or, with ``return_attn_probs``,
        ``(out, softmax_lse, None)`` where softmax_lse is float32 (batch, nheads, seqlen_q) in natural log
        (+inf for a row that sees no key: with seqlen_k = 0 every row, and out is zeros). The third item,
        flash-attn's ``S_dmask`` debugging matrix, is always None: flashattn never materializes the scores.
    """
    descales = {"q_descale": q_descale, "k_descale": k_descale, "v_descale": v_descale}
    if fp8.is_fp8(q) or any(d is not None for d in descales.values()):
        fp8.refuse_options(learnable_sink=learnable_sink)
        out, lse = _fp8_attention(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                                  descales)
        return (out, lse, None) if return_attn_probs else out
    check_dense(q, k, v, dropout_p, window_size, softcap, alibi_slopes, softmax_scale, empty_ok=True)
    check_sinks("learnable_sink", learnable_sink, q.shape[2], q.device)
    if q.shape[1] == 0 or k.shape[1] == 0:  # as flash-attn: zeros, +inf log-sum-exps, zero gradients
        out, lse = EmptyAttentionFunction.apply(q, k, v)
        return (out, lse, None) if return_attn_probs else out
    opts = AttentionOptions.build(q.shape[-1], softmax_scale, causal, window_size, softcap, dropout_p,
                                  deterministic)
    out, lse = FlashAttnFunction.apply(q, k, v, alibi_slopes, opts, None, None, learnable_sink)
    return (out, lse, None) if return_attn_probs else out


def _fp8_attention(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, descales: dict):
    """flash_attn_func's checks and op for float8 inputs."""
    if not fp8.is_fp8(q):
        raise TypeError(f"q_descale, k_descale and v_descale apply to float8_e4m3fn inputs, but q is {q.dtype}")
    fp8.check_inputs({"q": q, "k": k, "v": v})
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dim() != 4:
            raise ValueError(f"{name} must have 4 dimensions (batch, seqlen, nheads, headdim), got {tuple(x.shape)}")
    check_kv_like_q(q, k, v)
    if k.shape[0] != q.shape[0]:
        raise ValueError(f"k must have q's batch size {q.shape[0]}, got {k.shape[0]}")
    if q.shape[1] == 0 or k.shape[1] == 0:
        raise ValueError(f"seqlens must be >= 1, got seqlen_q={q.shape[1]}, seqlen_k={k.shape[1]}")
    fp8.refuse_options(dropout_p=dropout_p, alibi_slopes=alibi_slopes)
    check_options(0.0, window_size, softcap)
    check_scale("softmax_scale", softmax_scale)
    fp8.check_descales(q, k, descales, q.shape[0], (q.shape[1], k.shape[1]))
    opts = AttentionOptions.build(q.shape[-1], softmax_scale, causal, window_size, softcap, 0.0, False)
    return ops_fp8.dense(q, k, v, *descales.values(), opts)


def flash_attn_qkvpacked_func(
    qkv: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
):
    """:func:`flash_attn_func` on qkv of shape (batch, seqlen, 3, nheads, headdim); no copies are made."""
    check_tensor("qkv", qkv, 5)
    if qkv.shape[2] != 3:
        raise ValueError(f"qkv must have shape (batch, seqlen, 3, nheads, headdim), got {tuple(qkv.shape)}")
    q, k, v = qkv.unbind(dim=2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs)


def flash_attn_kvpacked_func(
    q: torch.Tensor,
    kv: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
):
    """:func:`flash_attn_func` on q and kv of shape (batch, seqlen_k, 2, nheads_k, headdim)."""
    check_tensor("kv", kv, 5)
    if kv.shape[2] != 2:
        raise ValueError(f"kv must have shape (batch, seqlen_k, 2, nheads_k, headdim), got {tuple(kv.shape)}")
    k, v = kv.unbind(dim=2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs)
