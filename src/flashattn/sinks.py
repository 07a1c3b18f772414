"""Attention sinks: one learned logit per query head that joins every row's softmax without a value
(GPT-OSS's ``sinks``, transformers' ``s_aux``).

With a sink s, a row's probabilities are exp(S_ij) / (exp(lse_i) + exp(s)), lse_i the row's log-sum-exp over its
keys: the kernels' output scaled by w_i = exp(lse_i) / (exp(lse_i) + exp(s)) = sigmoid(lse_i - s). No kernel sees
the sink. The backward runs the kernels' backward unchanged on two substitutes: dO w for dO, and the scaled
output O w for O (recomputed from the kernels' O, which the forward saves: one more output-sized tensor than
without sinks while the caller holds the returned output). The kernels recompute P from the unscaled lse and take
delta = rowsum(dO O) from their dO and O, so they form P (w dP - w^2 rowsum(dO O)) = (w P)(dP - rowsum(dO (w O))):
the sink's row probabilities' dS. The sink's own gradient is -sum over rows of w (1 - w) rowsum(dO O).

``flashattn.flash_attn_func``, ``flash_attn_varlen_func`` and ``flash_attn_with_kvcache`` take the sinks as
``learnable_sink`` (FlashAttention-4's name), ``sdpa.attention_bhle`` and the transformers integration as ``sinks``.

A row that sees no key (lse = +inf) keeps w = 1: its output and gradients are 0 either way.
"""

from __future__ import annotations

import torch


def check_sinks(name: str, sinks, nheads: int, device: torch.device) -> None:
    """Attention sinks: None, or a floating-point tensor of one logit per query head, (nheads,), on the inputs'
    device."""
    if sinks is None:
        return
    if not isinstance(sinks, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(sinks).__name__}")
    if sinks.shape != (nheads,):
        raise ValueError(f"{name} must have one logit per query head, shape ({nheads},), got shape "
                         f"{tuple(sinks.shape)}")
    if not sinks.is_floating_point():
        raise TypeError(f"{name} must be floating point, got {sinks.dtype}")
    if sinks.device != device:
        raise ValueError(f"{name} must be on q's device {device}, got {sinks.device}")


def _row_weights(lse: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """w = sigmoid(lse - sink), float32, in the output's layout: lse (batch, heads, seqlen) gives (batch, seqlen,
    heads, 1), a packed batch's (heads, total) gives (total, heads, 1)."""
    return torch.sigmoid(lse - sinks.float()[:, None]).transpose(-1, -2).unsqueeze(-1)


def apply_sinks(out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor | None):
    """(out w, the log-sum-exp with the sink counted, w) for the kernels' ``out`` (batch, seqlen, heads, d), or a
    packed batch's (total, heads, d), and their ``lse`` (batch, heads, seqlen) or (heads, total); without sinks
    (None), (out, lse, None)."""
    if sinks is None:
        return out, lse, None
    weights = _row_weights(lse, sinks)
    return (out.float() * weights).to(out.dtype), torch.logaddexp(lse, sinks.float()[:, None]), weights


def sink_backward(dout: torch.Tensor, out: torch.Tensor, weights: torch.Tensor | None, sinks: torch.Tensor | None):
    """(the dO and the O to give the kernels' backward, the sinks' gradient) for the gradient ``dout`` of the scaled
    output, from the kernels' own ``out`` (unscaled) and ``weights``; without sinks (None), (dout, out, None).
    The sinks' gradient takes O w in float32: from the scaled output as returned, rounded twice (the kernels'
    rounding, then the scaled product's), a sum over many rows drifted several times further from the exact
    gradient than PyTorch's in the same precision."""
    if sinks is None:
        return dout, out, None
    scaled = out.float() * weights
    rows = (dout.float() * scaled).sum(-1, keepdim=True)  # rowsum(dO O) w
    dsinks = -((1 - weights) * rows).movedim(-2, 0).reshape(sinks.shape[0], -1).sum(1)
    return (dout.float() * weights).to(dout.dtype), scaled.to(out.dtype), dsinks.to(sinks.dtype)
