"""The autograd layer: bookkeeping only. It saves q, k, v, out, the LSE, the dropout seed and the SDPA mask (the
trainable FP8 attention: the e4m3 q, k, v and their descales instead of q, k, v). It also registers the dense and
packed forward ops' own gradients, for programs that torch.export traced (the end of this module)."""

from __future__ import annotations

import torch

from . import head_parallel, ops, ops_fp8, ring, ring_varlen
from .fp8_quantize import Quantized
from .options import AttentionOptions, FP8Options, new_rng_state
from .ring import shared_rng_state
from .sinks import apply_sinks, sink_backward


class FlashAttnFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, alibi_slopes, opts: AttentionOptions, attn_mask=None, rng_state=None, sinks=None):
        """``rng_state``: the dropout (seed, offset) to use (the all-to-all mode's share of the group's stream);
        by default a fresh one. ``sinks``: a logit per query head that joins each row's softmax (``sinks.py``);
        the log-sum-exp returned then counts it."""
        if rng_state is None and opts.dropout_p > 0:
            rng_state = new_rng_state(q.device)
        out, lse = ops.eager_call(ops.attention_forward, ops.attention_forward_cuda, q, k, v, alibi_slopes, rng_state,
                                  *opts.op_arguments(), attn_mask)
        kernel_out = out
        out, lse_out, weights = apply_sinks(out, lse, sinks)
        ctx.save_for_backward(q, k, v, kernel_out, lse, alibi_slopes, rng_state, attn_mask, sinks, weights)
        ctx.opts = opts
        ctx.mark_non_differentiable(lse_out)
        # lse never has a gradient (so dout always has one): without this the engine would allocate and
        # zero a gradient for lse on every backward
        ctx.set_materialize_grads(False)
        return out, lse_out

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse, alibi_slopes, rng_state, attn_mask, sinks, weights = ctx.saved_tensors
        mask_needs_grad = attn_mask is not None and ctx.needs_input_grad[5]
        dout, out, dsinks = sink_backward(dout, out, weights, sinks)
        dq, dk, dv, dmask = ops.eager_call(
            ops.attention_backward, ops.attention_backward_cuda, dout, q, k, v, out, lse, alibi_slopes, rng_state,
            *ctx.opts.op_arguments(), attn_mask, mask_needs_grad, ctx.opts.frame_argument(), ctx.opts.deterministic,
        )
        return dq, dk, dv, None, None, dmask if mask_needs_grad else None, None, dsinks


class EmptyAttentionFunction(torch.autograd.Function):
    """A dense call with no queries or no keys, as flash-attn returns it: out zeros, the log-sum-exp +inf (no key
    seen), and zero gradients for q, k and v."""

    @staticmethod
    def forward(ctx, q, k, v):
        batch, seqlen_q, nheads, _ = q.shape
        out = q.new_zeros(batch, seqlen_q, nheads, v.shape[-1])
        lse = torch.full((batch, nheads, seqlen_q), float("inf"), dtype=torch.float32, device=q.device)
        ctx.mark_non_differentiable(lse)
        ctx.inputs = [(x.shape, x.dtype, x.device) for x in (q, k, v)]
        return out, lse

    @staticmethod
    def backward(ctx, _dout, _dlse):
        return tuple(torch.zeros(shape, dtype=dtype, device=device) for shape, dtype, device in ctx.inputs)


class FP8FlashAttnFunction(torch.autograd.Function):
    """16-bit q, k, v quantized to e4m3 inside (``fp8.flash_attn_func``). It saves the e4m3 tensors, a byte an
    element where the 16-bit function saves two, and the rotation's signs (head_dim floats, or None)."""

    @staticmethod
    def forward(ctx, q, k, v, options: FP8Options):
        quantized, out, lse, signs = ops_fp8.train_forward(q, k, v, options)
        ctx.save_for_backward(*quantized, out, lse, signs)
        ctx.options = options
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)  # as in FlashAttnFunction
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        *quantized, out, lse, signs = ctx.saved_tensors
        dq, dk, dv = ops_fp8.train_backward(dout, Quantized(*quantized), out, lse, signs, ctx.options)
        return dq, dk, dv, None


class FlashAttnVarlenFunction(torch.autograd.Function):
    """Packed (varlen) batches: the same books, plus cu_seqlens and the max lengths (ints, or -1).

    ``cu_seqlens_k`` None means cu_seqlens_q (torch.compile refuses one tensor passed twice to apply).
    """

    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes,
                opts: AttentionOptions, rng_state=None, sinks=None):
        """``sinks``: as in FlashAttnFunction, the log-sum-exp's layout (nheads, total_q)."""
        if rng_state is None and opts.dropout_p > 0:
            rng_state = new_rng_state(q.device)
        cu_seqlens_k = cu_seqlens_q if cu_seqlens_k is None else cu_seqlens_k
        out, lse = ops.eager_call(ops.varlen_attention_forward, ops.varlen_attention_forward_cuda, q, k, v,
                                  cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes, rng_state,
                                  *opts.op_arguments())
        kernel_out = out
        out, lse_out, weights = apply_sinks(out, lse, sinks)
        ctx.save_for_backward(q, k, v, kernel_out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes, rng_state, sinks,
                              weights)
        ctx.max_seqlens = (max_seqlen_q, max_seqlen_k)
        ctx.opts = opts
        ctx.mark_non_differentiable(lse_out)
        ctx.set_materialize_grads(False)  # as in FlashAttnFunction
        return out, lse_out

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes, rng_state, sinks, weights = ctx.saved_tensors
        dout, out, dsinks = sink_backward(dout, out, weights, sinks)
        dq, dk, dv = ops.eager_call(
            ops.varlen_attention_backward, ops.varlen_attention_backward_cuda, dout, q, k, v, out, lse, cu_seqlens_q,
            cu_seqlens_k, *ctx.max_seqlens, alibi_slopes, rng_state, *ctx.opts.op_arguments(),
        )
        # no gradient for cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes, opts, rng_state
        return dq, dk, dv, None, None, None, None, None, None, None, dsinks


class FlashAttnVarlenPagedFunction(torch.autograd.Function):
    """Packed queries over paged keys (a block table): forward only, as in flash-attn.

    Nothing is saved; a backward through the output raises instead of returning no gradient.
    """

    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes, block_table,
                opts: AttentionOptions):
        rng_state = new_rng_state(q.device) if opts.dropout_p > 0 else None
        out, lse = ops.eager_call(ops.varlen_attention_forward, ops.varlen_attention_forward_cuda, q, k, v,
                                  cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes, rng_state,
                                  *opts.op_arguments(), block_table)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        # q's gradient is the op that raises (the shapes of q and out agree): a graph keeps it
        return ops.paged_backward_refused(dout), None, None, None, None, None, None, None, None, None


class RingFlashAttnFunction(torch.autograd.Function):
    """Ring attention over a process group (``ring.py``; packed batches: ``ring_varlen.py``, when the ring's layout
    is a packed one): the same books as FlashAttnFunction, the dropout seed shared by the group."""

    @staticmethod
    def forward(ctx, q, k, v, alibi_slopes, opts: AttentionOptions, group: ring.Ring):
        rng_state = group.shared_rng_state(q.device) if opts.dropout_p > 0 else None
        engine = ring_varlen if isinstance(group.layout, ring_varlen.PackedLayout) else ring
        out, lse = engine.forward(q, k, v, alibi_slopes, rng_state, opts, group)
        ctx.save_for_backward(q, k, v, out, lse, alibi_slopes, rng_state)
        ctx.opts, ctx.group = opts, group
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)  # as in FlashAttnFunction
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse, alibi_slopes, rng_state = ctx.saved_tensors
        engine = ring_varlen if isinstance(ctx.group.layout, ring_varlen.PackedLayout) else ring
        dq, dk, dv = engine.backward(dout, q, k, v, out, lse, alibi_slopes, rng_state, ctx.opts, ctx.group)
        return dq, dk, dv, None, None, None


class HeadParallelFunction(torch.autograd.Function):
    """The all-to-all mode (``head_parallel.py``): the exchanges and the call of the rank's heads in one function;
    the dropout seed shared by the group."""

    @staticmethod
    def forward(ctx, q, k, v, alibi_slopes, opts: AttentionOptions, call: head_parallel.HeadCall):
        rng_state = shared_rng_state(call.exchange.group, q.device) if opts.dropout_p > 0 else None
        out, lse, saved = head_parallel.forward(q, k, v, alibi_slopes, rng_state, opts, call)
        ctx.save_for_backward(*saved, alibi_slopes, rng_state)
        ctx.opts, ctx.call = opts, call
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)  # as in FlashAttnFunction
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        *saved, alibi_slopes, rng_state = ctx.saved_tensors
        dq, dk, dv = head_parallel.backward(dout, saved, alibi_slopes, rng_state, ctx.opts, ctx.call)
        return dq, dk, dv, None, None, None


# ---------------------------------------------------------------------------------------------
# The ops' own gradients: what differentiates a program that torch.export traced through the functions above (it
# keeps their forward's op and drops the autograd.Function around it). Eager calls and torch.compile go through the
# functions, whose forward runs the op with grad mode off.
# ---------------------------------------------------------------------------------------------


def _dense_setup(ctx, inputs, output):
    q, k, v, alibi_slopes, rng_state, *scalars = inputs[:10]
    attn_mask, frame = (*inputs[10:], None, None)[:2]
    ctx.save_for_backward(q, k, v, *output, alibi_slopes, rng_state, attn_mask)
    ctx.scalars, ctx.frame = scalars, frame


def _dense_backward(ctx, dout, _dlse):
    q, k, v, out, lse, alibi_slopes, rng_state, attn_mask = ctx.saved_tensors
    mask_needs_grad = attn_mask is not None and ctx.needs_input_grad[10]
    dq, dk, dv, dmask = ops.attention_backward(dout, q, k, v, out, lse, alibi_slopes, rng_state, *ctx.scalars,
                                               attn_mask, mask_needs_grad, ctx.frame)
    return dq, dk, dv, *(None,) * 7, dmask if mask_needs_grad else None, None


def _varlen_setup(ctx, inputs, output):
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes, rng_state, *scalars = inputs[:14]
    block_table = (*inputs[14:], None)[0]
    ctx.save_for_backward(q, k, v, *output, cu_seqlens_q, cu_seqlens_k, alibi_slopes, rng_state)
    ctx.max_seqlens, ctx.scalars, ctx.paged = (max_seqlen_q, max_seqlen_k), scalars, block_table is not None


def _varlen_backward(ctx, dout, _dlse):
    if ctx.paged:  # forward only, as flash_attn_varlen_func's paged calls
        return ops.paged_backward_refused(dout), *(None,) * 14
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes, rng_state = ctx.saved_tensors
    dq, dk, dv = ops.varlen_attention_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, *ctx.max_seqlens,
                                               alibi_slopes, rng_state, *ctx.scalars)
    return dq, dk, dv, *(None,) * 12


torch.library.register_autograd("flashattn::attention_forward", _dense_backward, setup_context=_dense_setup)
torch.library.register_autograd("flashattn::varlen_attention_forward", _varlen_backward, setup_context=_varlen_setup)
