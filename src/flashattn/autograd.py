"""The autograd layer: bookkeeping only. It saves q, k, v, out, the LSE, the dropout seed and the SDPA mask."""

from __future__ import annotations

import torch

from . import ops
from .options import AttentionOptions, new_rng_state


class FlashAttnFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, alibi_slopes, opts: AttentionOptions, attn_mask=None):
        rng_state = new_rng_state() if opts.dropout_p > 0 else None
        out, lse = ops.attention_forward(q, k, v, alibi_slopes, rng_state, *ops.op_arguments(opts), attn_mask)
        ctx.save_for_backward(q, k, v, out, lse, alibi_slopes, rng_state, attn_mask)
        ctx.opts = opts
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse, alibi_slopes, rng_state, attn_mask = ctx.saved_tensors
        mask_needs_grad = attn_mask is not None and ctx.needs_input_grad[5]
        dq, dk, dv, dmask = ops.attention_backward(
            dout, q, k, v, out, lse, alibi_slopes, rng_state, *ops.op_arguments(ctx.opts), attn_mask, mask_needs_grad
        )
        return dq, dk, dv, None, None, dmask if mask_needs_grad else None
