"""Public functions, with the flash-attn 2 signatures: validation, defaults and docstrings.

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

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256


def _check_tensor(name: str, x, rank: int, layout: str = "(batch, seqlen, nheads, headdim)") -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != rank:
        raise ValueError(f"{name} must have {rank} dimensions {layout}, got shape {tuple(x.shape)}")
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{name} must be float16, bfloat16 or float32, got {x.dtype}")


def _check_kv_like_q(q, k, v) -> None:
    """k and v against q: dtype, device, shapes and heads (GQA), whatever the layout's rank."""
    for name, x in (("k", k), ("v", v)):
        if x.dtype != q.dtype:
            raise TypeError(f"{name} must have q's dtype {q.dtype}, got {x.dtype}")
        if x.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}, got {x.device}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    nheads, head_dim = q.shape[-2:]
    if k.shape[-1] != head_dim:
        raise ValueError(f"k and v must have q's head dim {head_dim}, got {k.shape[-1]}")
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"head dim must be between 1 and {MAX_HEAD_DIM}, got {head_dim}")
    nheads_k = k.shape[-2]
    if nheads_k == 0 or nheads % nheads_k != 0:
        raise ValueError(f"the number of query heads ({nheads}) must be a multiple of the number of "
                         f"key/value heads ({nheads_k})")


def _check_options(dropout_p, window_size, softcap) -> None:
    if not 0.0 <= float(dropout_p) < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    if len(window_size) != 2 or any(int(w) != w or w < -1 for w in window_size):
        raise ValueError(f"window_size must be a pair of ints >= -1 (-1: unbounded), got {window_size}")
    if softcap < 0:
        raise ValueError(f"softcap must be >= 0 (0: off), got {softcap}")


def _check_alibi(alibi_slopes, batch: int, nheads: int, device: torch.device) -> None:
    if alibi_slopes is None:
        return
    if not isinstance(alibi_slopes, torch.Tensor):
        raise TypeError(f"alibi_slopes must be a torch.Tensor, got {type(alibi_slopes).__name__}")
    if alibi_slopes.dtype != torch.float32:
        raise TypeError(f"alibi_slopes must be float32, got {alibi_slopes.dtype}")
    if tuple(alibi_slopes.shape) not in ((nheads,), (batch, nheads)):
        raise ValueError(f"alibi_slopes must have shape ({nheads},) or ({batch}, {nheads}), "
                         f"got {tuple(alibi_slopes.shape)}")
    if alibi_slopes.device != device:
        raise ValueError(f"alibi_slopes must be on q's device {device}, got {alibi_slopes.device}")


def _validate(q, k, v, dropout_p, window_size, softcap, alibi_slopes) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, x, 4)
    _check_kv_like_q(q, k, v)
    batch, _, nheads, _ = q.shape
    if k.shape[0] != batch:
        raise ValueError(f"k must have q's batch size {batch}, got {k.shape[0]}")
    if q.shape[1] == 0 or k.shape[1] == 0:
        raise ValueError(f"seqlens must be >= 1, got seqlen_q={q.shape[1]}, seqlen_k={k.shape[1]}")
    _check_options(dropout_p, window_size, softcap)
    _check_alibi(alibi_slopes, batch, nheads, q.device)


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
    _validate(q, k, v, dropout_p, window_size, softcap, alibi_slopes)
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
    _check_tensor("qkv", qkv, 5)
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
    _check_tensor("kv", kv, 5)
    if kv.shape[2] != 2:
        raise ValueError(f"kv must have shape (batch, seqlen_k, 2, nheads_k, headdim), got {tuple(kv.shape)}")
    k, v = kv.unbind(dim=2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs)
