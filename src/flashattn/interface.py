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

from .autograd import FlashAttnFunction
from .options import AttentionOptions
from .validation import check_dense, check_tensor


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
            i + Sk - Sq - left <= j <= i + Sk - Sq + right; -1 means unbounded.
        softcap: if > 0, scores become softcap * tanh(scores / softcap).
        alibi_slopes: float32 (nheads,) or (batch, nheads); adds -slope * |i + Sk - Sq - j|.
        deterministic: accepted for compatibility; the backward is always deterministic (no atomics).
        return_attn_probs: also return the log-sum-exp.

    Returns:
        out of q's shape and dtype; or, with ``return_attn_probs``, ``(out, softmax_lse, None)`` where
        softmax_lse is float32 (batch, nheads, seqlen_q) in natural log (+inf for a row that sees no
        key). The third item, flash-attn's ``S_dmask`` debugging matrix, is always None: flashattn
        never materializes the scores.
    """
    check_dense(q, k, v, dropout_p, window_size, softcap, alibi_slopes, softmax_scale)
    opts = AttentionOptions.build(q.shape[-1], softmax_scale, causal, window_size, softcap, dropout_p,
                                  deterministic)
    out, lse = FlashAttnFunction.apply(q, k, v, alibi_slopes, opts)
    return (out, lse, None) if return_attn_probs else out


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
