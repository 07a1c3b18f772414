"""Custom ops: the device dispatch between the PyTorch path and the launchers.

Each op is a ``torch.library.custom_op`` with a CPU implementation (blocked PyTorch, ``cpu.py`` and ``cpu_decode.py``),
a CUDA implementation (``launch/``) and a fake implementation for ``torch.compile``. ``FLASHATTN_BACKEND=torch|triton``
overrides the choice (``backend.py``). Options arrive as scalars (custom ops take only tensors and scalars) and become
one ``AttentionOptions`` again here; CUDA calls that can go through a launch plan do (``launch/plans.py``).

Eager calls on plain CUDA tensors go straight to the op's CUDA implementation (``eager_call``): the dispatcher's
custom-op layer (its autograd wrapper, alias checks and dynamo guard) adds host time to every call, and at short
sequences the GPU waits on the host. Under torch.compile or export, for tensor subclasses, and where an input requires
grad with grad mode on (outside an autograd.Function: the forward-only kvcache op must still refuse a backward), the op
is called as registered.
"""

from __future__ import annotations

import torch

from . import cpu, cpu_decode, validation
from .backend import backend_for_cpu_tensors, backend_override
from .launch import backward, decode, forward, plans
from .options import AttentionOptions


def eager_call(op, cuda_impl, *args):
    """``op(*args)``, through ``cuda_impl`` directly when that is the implementation it would reach."""
    first = args[0]
    if (type(first) is torch.Tensor and first.is_cuda
            and (not torch.is_grad_enabled() or not any(isinstance(x, torch.Tensor) and x.requires_grad for x in args))
            and not torch.compiler.is_compiling()):
        return cuda_impl(*args)
    return op(*args)


# ---------------------------------------------------------------------------------------------
# Dense batches: q (B, Sq, Hq, D), k/v (B, Sk, Hk, D)
# ---------------------------------------------------------------------------------------------


@torch.library.custom_op("flashattn::attention_forward", mutates_args=(), device_types="cpu")
def attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    alibi_slopes: torch.Tensor | None,
    rng_state: torch.Tensor | None,
    softmax_scale: float,
    window_left: int,
    window_right: int,
    softcap: float,
    dropout_p: float,
    attn_mask: torch.Tensor | None = None,
    frame: list[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) for q (B, Sq, Hq, D), k/v (B, Sk, Hk, D); lse is float32 (B, Hq, Sq), natural log.

    ``attn_mask``: an SDPA mask (bool: True = take part; float: added to the scores) of 4 dims
    broadcastable to (B, Hq, Sq, Sk). ``frame``: a position frame (``options.PositionFrame``: query_start,
    key_start, seqlen_q, seqlen_k) placing the call in a larger problem (ring attention's steps).
    """
    opts = AttentionOptions(softmax_scale, window_left, window_right, softcap, dropout_p).with_frame(frame)
    if backend_for_cpu_tensors() == "triton":
        return forward.launch_forward(q, k, v, alibi_slopes, rng_state, opts, attn_mask)
    return cpu.forward(q, k, v, opts, alibi_slopes, rng_state, attn_mask)


@attention_forward.register_kernel("cuda")
def attention_forward_cuda(q, k, v, alibi_slopes, rng_state, softmax_scale, window_left, window_right,
                           softcap, dropout_p, attn_mask=None, frame=None):
    opts = AttentionOptions(softmax_scale, window_left, window_right, softcap, dropout_p).with_frame(frame)
    if backend_override() == "torch":
        return cpu.forward(q, k, v, opts, alibi_slopes, rng_state, attn_mask)
    if plans.plannable((q, k, v), alibi_slopes, rng_state, attn_mask):
        return plans.planned("forward", (q, k, v), opts, lambda: forward.launch_forward(q, k, v, None, None, opts))
    return forward.launch_forward(q, k, v, alibi_slopes, rng_state, opts, attn_mask)


@attention_forward.register_fake
def _attention_forward_fake(q, k, v, alibi_slopes, rng_state, softmax_scale, window_left, window_right,
                            softcap, dropout_p, attn_mask=None, frame=None):
    batch, seqlen_q, nheads, _ = q.shape
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    return out, q.new_empty((batch, nheads, seqlen_q), dtype=torch.float32)


@torch.library.custom_op("flashattn::attention_backward", mutates_args=(), device_types="cpu")
def attention_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    alibi_slopes: torch.Tensor | None,
    rng_state: torch.Tensor | None,
    softmax_scale: float,
    window_left: int,
    window_right: int,
    softcap: float,
    dropout_p: float,
    attn_mask: torch.Tensor | None = None,
    mask_needs_grad: bool = False,
    frame: list[int] | None = None,
    deterministic: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, dmask), recomputed from the saved log-sum-exp; dk/dv are summed over each GQA group.

    dmask is the gradient of a float ``attn_mask`` (its shape and dtype) when ``mask_needs_grad``,
    else an empty tensor. ``frame``: as in :func:`attention_forward`. ``deterministic``: bitwise repeatable
    gradients (on sm90 the fused dK/dV/dQ kernel adds dQ in no fixed order, and is then not taken).
    """
    opts = AttentionOptions(softmax_scale, window_left, window_right, softcap, dropout_p,
                            deterministic).with_frame(frame)
    if backend_for_cpu_tensors() == "triton":
        return backward.launch_backward(dout, q, k, v, out, lse, alibi_slopes, rng_state, opts, attn_mask,
                                        mask_needs_grad)
    return cpu.backward(dout, q, k, v, out, lse, opts, alibi_slopes, rng_state, attn_mask, mask_needs_grad)


@attention_backward.register_kernel("cuda")
def attention_backward_cuda(dout, q, k, v, out, lse, alibi_slopes, rng_state, softmax_scale, window_left,
                            window_right, softcap, dropout_p, attn_mask=None, mask_needs_grad=False, frame=None,
                            deterministic=False):
    opts = AttentionOptions(softmax_scale, window_left, window_right, softcap, dropout_p,
                            deterministic).with_frame(frame)
    if backend_override() == "torch":
        return cpu.backward(dout, q, k, v, out, lse, opts, alibi_slopes, rng_state, attn_mask, mask_needs_grad)
    if plans.plannable((dout, q, k, v, out, lse), alibi_slopes, rng_state, attn_mask):
        return plans.planned("backward", (dout, q, k, v, out, lse), opts,
                       lambda: backward.launch_backward(dout, q, k, v, out, lse, None, None, opts))
    return backward.launch_backward(dout, q, k, v, out, lse, alibi_slopes, rng_state, opts, attn_mask, mask_needs_grad)


@attention_backward.register_fake
def _attention_backward_fake(dout, q, k, v, out, lse, alibi_slopes, rng_state, softmax_scale, window_left,
                             window_right, softcap, dropout_p, attn_mask=None, mask_needs_grad=False, frame=None,
                             deterministic=False):
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            torch.empty_like(k, memory_format=torch.contiguous_format),
            torch.empty_like(v, memory_format=torch.contiguous_format),
            attn_mask.new_empty(attn_mask.shape) if mask_needs_grad else q.new_empty(0))


# ---------------------------------------------------------------------------------------------
# Packed (varlen) batches: q (total_q, Hq, D), k/v (total_k, Hk, D), cu_seqlens int32 (batch + 1,)
# ---------------------------------------------------------------------------------------------


def _varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes, rng_state,
                    opts: AttentionOptions, backend: str, block_table: torch.Tensor | None = None):
    paged = block_table is not None
    total_k = None if paged else k.shape[0]
    packing, host_q, host_k = validation.resolve_packing(cu_seqlens_q, cu_seqlens_k, q.shape[0], total_k, max_seqlen_q,
                                                         max_seqlen_k, need_host=backend == "torch")
    if paged and host_k is not None:
        read_entries = block_table.device.type == "cpu" or backend == "torch"
        validation.check_block_table(block_table, host_k, k.shape[0], k.shape[1], read_entries)
    if backend == "torch":
        return cpu.varlen_forward(q, k, v, host_q, host_k, opts, alibi_slopes, rng_state, block_table)
    return forward.launch_forward(q, k, v, alibi_slopes, rng_state, opts, packing=packing, block_table=block_table)


def _varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes,
                     rng_state, opts: AttentionOptions, backend: str):
    packing, host_q, host_k = validation.resolve_packing(cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0],
                                                         max_seqlen_q, max_seqlen_k, need_host=backend == "torch")
    if backend == "torch":
        return cpu.varlen_backward(dout, q, k, v, out, lse, host_q, host_k, opts, alibi_slopes, rng_state)
    dq, dk, dv, _ = backward.launch_backward(dout, q, k, v, out, lse, alibi_slopes, rng_state, opts, packing=packing)
    return dq, dk, dv


@torch.library.custom_op("flashattn::varlen_attention_forward", mutates_args=(), device_types="cpu")
def varlen_attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    alibi_slopes: torch.Tensor | None,
    rng_state: torch.Tensor | None,
    softmax_scale: float,
    window_left: int,
    window_right: int,
    softcap: float,
    dropout_p: float,
    block_table: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of a packed batch; lse is float32 (Hq, total_q). max_seqlen -1: derive it.

    ``block_table``: int32 (batch, max_pages); k and v are then page pools (num_pages, page_size, Hk, D)
    and sequence b's key j is ``k[block_table[b, j // page_size], j % page_size]``.
    """
    opts = AttentionOptions(softmax_scale, window_left, window_right, softcap, dropout_p)
    return _varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes,
                           rng_state, opts, backend_for_cpu_tensors(), block_table)


@varlen_attention_forward.register_kernel("cuda")
def varlen_attention_forward_cuda(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes,
                                  rng_state, softmax_scale, window_left, window_right, softcap, dropout_p,
                                  block_table=None):
    opts = AttentionOptions(softmax_scale, window_left, window_right, softcap, dropout_p)
    backend = backend_override() or "triton"
    inputs = (q, k, v, cu_seqlens_q, cu_seqlens_k, block_table)
    if backend == "triton" and plans.varlen_plannable(inputs, max_seqlen_q, max_seqlen_k, alibi_slopes, rng_state):
        return plans.planned("varlen_forward", inputs, (opts, max_seqlen_q, max_seqlen_k), lambda: _varlen_forward(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, None, None, opts, backend, block_table))
    return _varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes,
                           rng_state, opts, backend, block_table)


@varlen_attention_forward.register_fake
def _varlen_attention_forward_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes,
                                   rng_state, softmax_scale, window_left, window_right, softcap, dropout_p,
                                   block_table=None):
    total_q, nheads, _ = q.shape
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    return out, q.new_empty((nheads, total_q), dtype=torch.float32)


@torch.library.custom_op("flashattn::varlen_attention_backward", mutates_args=(), device_types="cpu")
def varlen_attention_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    alibi_slopes: torch.Tensor | None,
    rng_state: torch.Tensor | None,
    softmax_scale: float,
    window_left: int,
    window_right: int,
    softcap: float,
    dropout_p: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of a packed batch; tokens of sequences that see nothing get 0."""
    opts = AttentionOptions(softmax_scale, window_left, window_right, softcap, dropout_p)
    return _varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                            alibi_slopes, rng_state, opts, backend_for_cpu_tensors())


@varlen_attention_backward.register_kernel("cuda")
def varlen_attention_backward_cuda(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                   alibi_slopes, rng_state, softmax_scale, window_left, window_right, softcap,
                                   dropout_p):
    opts = AttentionOptions(softmax_scale, window_left, window_right, softcap, dropout_p)
    backend = backend_override() or "triton"
    inputs = (dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k)
    if backend == "triton" and plans.varlen_plannable(inputs, max_seqlen_q, max_seqlen_k, alibi_slopes, rng_state):
        return plans.planned("varlen_backward", inputs, (opts, max_seqlen_q, max_seqlen_k), lambda: _varlen_backward(
            dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, None, None, opts,
            backend))
    return _varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                            alibi_slopes, rng_state, opts, backend)


@varlen_attention_backward.register_fake
def _varlen_attention_backward_fake(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                    alibi_slopes, rng_state, softmax_scale, window_left, window_right, softcap,
                                    dropout_p):
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            torch.empty_like(k, memory_format=torch.contiguous_format),
            torch.empty_like(v, memory_format=torch.contiguous_format))


PAGED_BACKWARD_ERROR = ("flash_attn_varlen_func with a block_table (paged KV) is forward only, as in flash-attn: for "
                        "gradients, gather the pages into packed k and v and call it without block_table")


@torch.library.custom_op("flashattn::paged_backward_refused", mutates_args=())
def paged_backward_refused(dout: torch.Tensor) -> torch.Tensor:
    """A paged call's backward: an error when it runs, an op of the graph until then (a raise in the
    autograd.Function's backward would stop torch.compile from tracing the forward that needs grad)."""
    raise RuntimeError(PAGED_BACKWARD_ERROR)


@paged_backward_refused.register_fake
def _paged_backward_refused_fake(dout):
    return torch.empty_like(dout)



# ---------------------------------------------------------------------------------------------
# KV cache: append + attention over the cache, and the merge of partial results
# ---------------------------------------------------------------------------------------------


def plannable_step(inputs: tuple) -> bool:
    """Whether a whole public call on these CUDA inputs may take a launch plan (``launch/plans.py``)."""
    return plans.plannable(inputs)


def planned_step(phase: str, inputs: tuple, options: tuple, call):
    """``call()``, a whole public call (its checks, its op), through its launch plan: for callers whose ``options``
    and inputs' signatures fix everything the checks read, so that a replay needs no checking."""
    return plans.planned(phase, inputs, options, call)


def _planned_decode(phase: str, inputs: tuple, scalars: tuple, call):
    """``call()`` through its launch plan when every input is read in place."""
    if not plans.plannable(inputs):
        return call()
    return plans.planned(phase, inputs, scalars, call)


def _cpu_append_attention(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
                          rotary_cos, rotary_sin, alibi_slopes, opts: AttentionOptions, rotary_interleaved: bool,
                          record_faults: bool):
    indices = cpu_decode.CacheIndices.of(k_cache, cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
                                         k.shape[1], record_faults)
    cpu_decode.append(k_cache, v_cache, k, v, indices, rotary_cos, rotary_sin, rotary_interleaved)
    return cpu_decode.attention(q, k_cache, v_cache, indices, rotary_cos, rotary_sin, alibi_slopes, opts,
                                rotary_interleaved)


def _cpu_attention(q, k_cache, v_cache, cache_seqlens, cache_batch_idx, cache_leftpad, block_table, rotary_cos,
                   rotary_sin, alibi_slopes, seqlen_new: int, opts: AttentionOptions, rotary_interleaved: bool,
                   record_faults: bool):
    indices = cpu_decode.CacheIndices.of(k_cache, cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
                                         seqlen_new, record_faults)
    return cpu_decode.attention(q, k_cache, v_cache, indices, rotary_cos, rotary_sin, alibi_slopes, opts,
                                rotary_interleaved)


@torch.library.custom_op("flashattn::kvcache_append_attention", mutates_args=("k_cache", "v_cache"),
                         device_types="cpu")
def kvcache_append_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cache_seqlens: torch.Tensor,
    cache_batch_idx: torch.Tensor | None,
    cache_leftpad: torch.Tensor | None,
    block_table: torch.Tensor | None,
    rotary_cos: torch.Tensor | None,
    rotary_sin: torch.Tensor | None,
    alibi_slopes: torch.Tensor | None,
    softmax_scale: float,
    window_left: int,
    window_right: int,
    softcap: float,
    rotary_interleaved: bool,
    num_splits: int,
    record_faults: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A decode step: write k (rotated at positions cache_seqlens[b] + t) and v into the caches, then
    (out, lse) of q over the keys [cache_leftpad, cache_seqlens + k.shape[1]), as :func:`kvcache_attention`."""
    opts = AttentionOptions(softmax_scale, window_left, window_right, softcap)
    if backend_for_cpu_tensors() == "triton":
        return decode.launch_decode(q, k_cache, v_cache, cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
                                 rotary_cos, rotary_sin, alibi_slopes, k.shape[1], opts, rotary_interleaved,
                                 num_splits, record_faults, k_new=k, v_new=v)
    return _cpu_append_attention(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, cache_leftpad,
                                 block_table, rotary_cos, rotary_sin, alibi_slopes, opts, rotary_interleaved,
                                 record_faults)


@kvcache_append_attention.register_kernel("cuda")
def kvcache_append_attention_cuda(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, cache_leftpad,
                                  block_table, rotary_cos, rotary_sin, alibi_slopes, softmax_scale, window_left,
                                  window_right, softcap, rotary_interleaved, num_splits, record_faults):
    opts = AttentionOptions(softmax_scale, window_left, window_right, softcap)
    if backend_override() == "torch":
        return _cpu_append_attention(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, cache_leftpad,
                                     block_table, rotary_cos, rotary_sin, alibi_slopes, opts, rotary_interleaved,
                                     record_faults)
    return _planned_decode(
        "kvcache_append_attention", (q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, cache_leftpad,
                                     block_table, rotary_cos, rotary_sin, alibi_slopes),
        (opts, rotary_interleaved, num_splits, record_faults),
        lambda: decode.launch_decode(q, k_cache, v_cache, cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
                                  rotary_cos, rotary_sin, alibi_slopes, k.shape[1], opts, rotary_interleaved,
                                  num_splits, record_faults, k_new=k, v_new=v))


@kvcache_append_attention.register_fake
def _kvcache_append_attention_fake(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, cache_leftpad,
                                   block_table, rotary_cos, rotary_sin, alibi_slopes, softmax_scale, window_left,
                                   window_right, softcap, rotary_interleaved, num_splits, record_faults):
    return decode.decode_outputs_like(q)


@torch.library.custom_op("flashattn::kvcache_attention", mutates_args=(), device_types="cpu")
def kvcache_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    cache_batch_idx: torch.Tensor | None,
    cache_leftpad: torch.Tensor | None,
    block_table: torch.Tensor | None,
    rotary_cos: torch.Tensor | None,
    rotary_sin: torch.Tensor | None,
    alibi_slopes: torch.Tensor | None,
    seqlen_new: int,
    softmax_scale: float,
    window_left: int,
    window_right: int,
    softcap: float,
    rotary_interleaved: bool,
    num_splits: int,
    record_faults: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of q (B, Sq, H, D) over the keys [cache_leftpad, cache_seqlens + seqlen_new) of each
    batch element's cache; lse is float32 (B, H, Sq), natural log, +inf for a row that sees no key."""
    opts = AttentionOptions(softmax_scale, window_left, window_right, softcap)
    if backend_for_cpu_tensors() == "triton":
        return decode.launch_decode(q, k_cache, v_cache, cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
                                 rotary_cos, rotary_sin, alibi_slopes, seqlen_new, opts, rotary_interleaved,
                                 num_splits, record_faults)
    return _cpu_attention(q, k_cache, v_cache, cache_seqlens, cache_batch_idx, cache_leftpad, block_table, rotary_cos,
                          rotary_sin, alibi_slopes, seqlen_new, opts, rotary_interleaved, record_faults)


@kvcache_attention.register_kernel("cuda")
def kvcache_attention_cuda(q, k_cache, v_cache, cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
                           rotary_cos, rotary_sin, alibi_slopes, seqlen_new, softmax_scale, window_left,
                           window_right, softcap, rotary_interleaved, num_splits, record_faults):
    opts = AttentionOptions(softmax_scale, window_left, window_right, softcap)
    if backend_override() == "torch":
        return _cpu_attention(q, k_cache, v_cache, cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
                              rotary_cos, rotary_sin, alibi_slopes, seqlen_new, opts, rotary_interleaved,
                              record_faults)
    return _planned_decode(
        "kvcache_attention", (q, k_cache, v_cache, cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
                              rotary_cos, rotary_sin, alibi_slopes),
        (opts, seqlen_new, rotary_interleaved, num_splits, record_faults),
        lambda: decode.launch_decode(q, k_cache, v_cache, cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
                                  rotary_cos, rotary_sin, alibi_slopes, seqlen_new, opts, rotary_interleaved,
                                  num_splits, record_faults))


@kvcache_attention.register_fake
def _kvcache_attention_fake(q, k_cache, v_cache, cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
                            rotary_cos, rotary_sin, alibi_slopes, seqlen_new, softmax_scale, window_left,
                            window_right, softcap, rotary_interleaved, num_splits, record_faults):
    return decode.decode_outputs_like(q)


@torch.library.custom_op("flashattn::attention_combine", mutates_args=(), device_types="cpu")
def attention_combine(out_partial: torch.Tensor, lse_partial: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """out_partial (S, B, Sq, H, D), lse_partial (S, B, H, Sq) -> out (B, Sq, H, D), lse (B, H, Sq)."""
    if backend_for_cpu_tensors() == "triton":
        return decode.launch_combine(out_partial, lse_partial)
    return cpu_decode.combine(out_partial, lse_partial)


@attention_combine.register_kernel("cuda")
def _attention_combine_cuda(out_partial, lse_partial):
    if backend_override() == "torch":
        return cpu_decode.combine(out_partial, lse_partial)
    return decode.launch_combine(out_partial, lse_partial)


@attention_combine.register_fake
def _attention_combine_fake(out_partial, lse_partial):
    _, batch, seqlen, nheads, _ = out_partial.shape
    return out_partial.new_empty(out_partial.shape[1:]), lse_partial.new_empty((batch, nheads, seqlen))


@torch.library.custom_op("flashattn::attention_combine_backward", mutates_args=(), device_types="cpu")
def attention_combine_backward(
    dout: torch.Tensor, dlse: torch.Tensor, out_partial: torch.Tensor, lse_partial: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(d out_partial, d lse_partial) of :func:`attention_combine`."""
    if backend_for_cpu_tensors() == "triton":
        return decode.launch_combine_backward(dout, dlse, out_partial, lse_partial)
    return cpu_decode.combine_backward(dout, dlse, out_partial, lse_partial)


@attention_combine_backward.register_kernel("cuda")
def _attention_combine_backward_cuda(dout, dlse, out_partial, lse_partial):
    if backend_override() == "torch":
        return cpu_decode.combine_backward(dout, dlse, out_partial, lse_partial)
    return decode.launch_combine_backward(dout, dlse, out_partial, lse_partial)


@attention_combine_backward.register_fake
def _attention_combine_backward_fake(dout, dlse, out_partial, lse_partial):
    return (torch.empty_like(out_partial, memory_format=torch.contiguous_format),
            torch.empty_like(lse_partial, memory_format=torch.contiguous_format))

