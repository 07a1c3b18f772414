"""Inference entry points with flash-attn's signatures: attention over a KV cache, and the merge of
attention results computed over disjoint key sets.

``flash_attn_with_kvcache`` appends the new keys/values into the cache in place and attends over the
valid part of the cache. Batch element b sees the cache positions ``[leftpad_b, cache_seqlens_b +
seqlen_new)`` as its keys ``0 .. seqlen_k_b - 1``, and causal/window masks are aligned to the
bottom-right corner of that range, as in ``flash_attn_func``. For seqlen_q = 2 and a cache holding 3
keys before 2 new ones are appended (seqlen_k = 5), causal=True gives::

    keys:  c0 c1 c2 n0 n1
    q0:     1  1  1  1  0
    q1:     1  1  1  1  1

``flash_attn_combine`` merges partial results by their log-sum-exps (split-KV decoding, ring attention).
"""

from __future__ import annotations

import torch

from . import fp8, ops, ops_fp8, validation
from .faults import raise_recorded_faults
from .options import AttentionOptions
from .sinks import apply_sinks, check_sinks

# ---------------------------------------------------------------------------------------------
# flash_attn_with_kvcache
# ---------------------------------------------------------------------------------------------


def flash_attn_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    rotary_cos: torch.Tensor | None = None,
    rotary_sin: torch.Tensor | None = None,
    cache_seqlens: int | torch.Tensor | None = None,
    cache_batch_idx: torch.Tensor | None = None,
    cache_leftpad: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    alibi_slopes: torch.Tensor | None = None,
    num_splits: int = 0,
    return_softmax_lse: bool = False,
    *,
    check_indices: bool | str = "deferred",
    q_descale: torch.Tensor | None = None,
    k_descale: torch.Tensor | None = None,
    v_descale: torch.Tensor | None = None,
    learnable_sink: torch.Tensor | None = None,
):
    """Attention of q over a KV cache, after appending the new keys/values k, v to it in place.

    Forward only (no gradient), as in flash-attn. Batch element b attends to the cache positions
    ``[cache_leftpad[b], cache_seqlens[b] + seqlen_new)``, the new keys included; causal and window masks
    are bottom-right aligned to that range (see the module docstring). Query heads sharing a kv head are
    processed together, so each K/V tile is read once per group.

    Args:
        q: (batch, seqlen_q, nheads, headdim), float16 / bfloat16 / float32, headdim 1..256.
        k_cache, v_cache: (batch_cache, seqlen_cache, nheads_k, headdim), or with a ``block_table``
            (num_blocks, page_size, nheads_k, headdim) with page_size a multiple of 16. Same dtype as q,
            last dimension contiguous. Updated in place when k, v are given.
        k, v: optional (batch, seqlen_new, nheads_k, headdim): written into the cache at positions
            ``cache_seqlens[b] + t`` (k rotated first when rotary tables are given); nothing else in
            the cache changes.
        rotary_cos, rotary_sin: optional (seqlen_ro, rotary_dim / 2) with seqlen_ro >= the cache capacity
            and rotary_dim <= headdim. Rotate the new keys at positions ``cache_seqlens[b] + t``, and q at
            positions ``cache_seqlens[b] + i`` when causal or windowed, else all at ``cache_seqlens[b]``
            (flash-attn's convention). Need k and v.
        cache_seqlens: int or int32 (batch,): keys already in each cache row; None means full.
        cache_batch_idx: optional int32 (batch,): the cache row (or block-table row) of each batch element.
            With duplicate rows and an append, which write lands is unspecified.
        cache_leftpad: optional int32 (batch,): cache positions before it are not keys.
        block_table: optional int32 (batch or batch_cache, max_blocks): the cache blocks of each sequence,
            position p living at ``k_cache[block_table[row, p // page_size], p % page_size]``.
        softmax_scale, causal, window_size, softcap, alibi_slopes: as in :func:`flash_attn_func`, with
            seqlen_k = the number of keys each batch element sees.
        rotary_interleaved: True rotates dims (2j, 2j+1) (GPT-J); False rotates (j, j + rotary_dim / 2)
            (GPT-NeoX).
        num_splits: split each sequence's keys into this many chunks merged by their log-sum-exps
            (flash-decoding); 0 chooses from the GPU's processor count; 1 never splits. The torch path
            ignores it (it computes the unsplit result).
        return_softmax_lse: also return the float32 (batch, nheads, seqlen_q) log-sum-exp (natural log,
            +inf for a row that sees no key).
        check_indices: what becomes of cache_seqlens / cache_batch_idx / cache_leftpad / block_table values that
            reach outside the cache. Whatever the mode, the kernels clamp every index into range before it
            addresses memory (an element with a bad index reads clamped keys and appends nothing), so nothing
            outside the tensors given is ever read or written; the modes differ in how a bad value is reported.

            - ``"deferred"`` (default): the kernels record the fault in a small device buffer, and
              :func:`flashattn.raise_recorded_faults` raises ``ValueError`` naming the argument. The call never
              waits for the GPU and can be captured in a CUDA graph. On CPU tensors (no GPU to wait for) it raises
              before returning; on the GPU the library raises at points that synchronize anyway (a strict call, a
              varlen call that reads cu_seqlens), and a loop that never synchronizes calls
              ``raise_recorded_faults()`` itself, e.g. at the end of each request. The report comes after the
              step: the elements whose indices are in range have attended and appended by then, on the CPU too.
              Inside a function compiled by ``torch.compile`` the CPU, too, leaves the report to such a call.
            - ``True``: strict. Checks the values on the host before any kernel runs and raises ``ValueError``
              naming the first bad entry; costs a device-to-host copy (a synchronization) when any of them is a
              tensor.
            - ``False``: clamped silently, nothing recorded.
        q_descale, k_descale, v_descale: FP8 caches only (q, the caches and k, v all ``torch.float8_e4m3fn``):
            float32 (batch, nheads_k) descales of batch element b's queries, and of the cache row it reads (new
            keys and values must be quantized with their cache's descales); None means 1. Returns bfloat16.
            No rotary tables and no ALiBi then. It runs the PyTorch path on upcast copies of the caches (no FP8
            decode kernel): on the GPU only under ``FLASHATTN_BACKEND=torch``.
        learnable_sink: attention sinks, (nheads,), as in :func:`flashattn.flash_attn_func`: each query's output
            is scaled by sigmoid(lse - sink) after the step, and the log-sum-exp returned counts the sink (a row
            that sees no key keeps its zeros and +inf). Not with FP8 caches.

    Returns:
        out (batch, seqlen_q, nheads, headdim) in q's dtype, or ``(out, softmax_lse)``.
    """
    tensors = (q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, cache_leftpad, block_table, rotary_cos,
               rotary_sin, alibi_slopes)
    options = (softmax_scale, causal, window_size, softcap, rotary_interleaved, num_splits, check_indices)
    descales = {"q_descale": q_descale, "k_descale": k_descale, "v_descale": v_descale}
    if fp8.is_fp8(q) or any(d is not None for d in descales.values()):
        fp8.refuse_options(learnable_sink=learnable_sink)
        out, lse = _fp8_step(tensors, options, descales)
        return (out, lse) if return_softmax_lse else out
    if learnable_sink is not None:
        validation.check_tensor("q", q, 4)
        check_sinks("learnable_sink", learnable_sink, q.shape[2], q.device)
    if check_indices is not True and _plannable_step(tensors, options):
        # the whole step (checks, choices, launches) replayed from the plan of an earlier step of the same signature,
        # which holds everything the checks read: a serving loop's step, whose host time would otherwise be several
        # times its GPU time
        out, lse = ops.planned_step("flash_attn_with_kvcache", tensors, options, lambda: _step(*tensors, *options))
    else:
        out, lse = _step(*tensors, *options)
    out, lse, _ = apply_sinks(out, lse, learnable_sink)  # no kernel sees a sink: its weights scale the step's output
    return (out, lse) if return_softmax_lse else out


def _fp8_step(tensors: tuple, options: tuple, descales: dict):
    """A step on float8 tensors: their checks, then :func:`_step` through ``ops_fp8.kvcache`` (queries with the
    descales folded in, over the e4m3 caches)."""
    q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, cache_leftpad, block_table = tensors[:9]
    rotary_cos, rotary_sin, alibi_slopes = tensors[9:]
    if not fp8.is_fp8(q):
        raise TypeError(f"q_descale, k_descale and v_descale apply to float8_e4m3fn inputs, but q is {q.dtype}")
    fp8.check_inputs({"q": q, "k_cache": k_cache, "v_cache": v_cache, "k": k, "v": v})
    fp8.refuse_options(rotary_cos=rotary_cos, rotary_sin=rotary_sin, alibi_slopes=alibi_slopes)
    if q.dim() != 4 or k_cache.dim() != 4:
        raise ValueError(f"q and k_cache must have 4 dimensions, got shapes {tuple(q.shape)} and "
                         f"{tuple(k_cache.shape)}")
    fp8.check_descales(q, k_cache, descales, q.shape[0], None)

    def attend(queries, k_cache_, v_cache_, k_, v_):
        return _step(queries, k_cache_, v_cache_, k_, v_, cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
                     None, None, None, *options, cache_dtype=k_cache_.dtype)

    return ops_fp8.kvcache(q, k_cache, v_cache, k, v, *descales.values(), attend)


def _plannable_step(tensors: tuple, options: tuple) -> bool:
    """Whether a step may take a launch plan as a whole: CUDA tensors (cache_seqlens among them) read in place, none
    requiring grad (the op must then refuse a backward), plain Python scalars and a window tuple of ints, so that the
    plan's key holds everything that the checks and choices of :func:`_step` read."""
    q, cache_seqlens = tensors[0], tensors[5]
    window_size = options[2]
    if not (type(q) is torch.Tensor and q.is_cuda and type(cache_seqlens) is torch.Tensor
            and type(window_size) is tuple and len(window_size) == 2 and all(type(w) is int for w in window_size)):
        return False
    for x in tensors:  # one pass: this runs on every step of a serving loop
        if x is not None and (type(x) is not torch.Tensor or x.requires_grad):
            return False
    for x in options:
        if x is not None and x is not window_size and type(x) not in (bool, int, float, str):
            return False
    return ops.plannable_step(tensors) and not torch.compiler.is_compiling()


def _step(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, cache_leftpad, block_table, rotary_cos, rotary_sin,
          alibi_slopes, softmax_scale, causal, window_size, softcap, rotary_interleaved, num_splits, check_indices,
          cache_dtype=None):
    """:func:`flash_attn_with_kvcache`'s checks, then its op: (out, lse). ``cache_dtype``: caches (and k, v) of
    another dtype than q's, which the kernels convert to q's as they read them (the FP8 step's)."""
    capacity = validation.check_cache(q, k_cache, v_cache, k, v, block_table, cache_batch_idx, cache_dtype)
    batch = q.shape[0]
    seqlen_new = 0 if k is None else k.shape[1]
    validation.check_rotary(rotary_cos, rotary_sin, q, k, capacity)
    validation.check_decode_options(q, window_size, softcap, alibi_slopes, softmax_scale)
    for name, index in (("cache_batch_idx", cache_batch_idx), ("cache_leftpad", cache_leftpad)):
        if index is not None:
            validation.check_index(name, index, (batch,), q.device)
    validation.check_num_splits(num_splits)
    validation.check_indices_mode(check_indices)
    seqlens = validation.cache_seqlens_tensor(cache_seqlens, batch, capacity, seqlen_new, q.device)
    index_tensors = (cache_seqlens if isinstance(cache_seqlens, torch.Tensor) else None, cache_batch_idx,
                     cache_leftpad, block_table)
    indexed = any(x is not None for x in index_tensors)  # an int cache_seqlens is checked already
    if check_indices is True and indexed:
        validation.check_cache_indices(seqlens, cache_batch_idx, cache_leftpad, block_table, k_cache, capacity,
                                       seqlen_new)
        raise_recorded_faults(q.device)  # this call waited for the GPU already: report what earlier calls recorded

    opts = AttentionOptions.build(q.shape[-1], softmax_scale, causal, window_size, softcap, 0.0, False)
    record = check_indices == "deferred" and indexed
    scalars = (opts.softmax_scale, opts.window_left, opts.window_right, opts.softcap, bool(rotary_interleaved),
               num_splits, record)
    if k is not None:  # one op: on the GPU a short append shares the attention's launch
        out, lse = ops.eager_call(
            ops.kvcache_append_attention, ops.kvcache_append_attention_cuda, q, k_cache, v_cache, k, v, seqlens,
            cache_batch_idx, cache_leftpad, block_table, rotary_cos, rotary_sin, alibi_slopes, *scalars,
        )
    else:
        out, lse = ops.eager_call(
            ops.kvcache_attention, ops.kvcache_attention_cuda, q, k_cache, v_cache, seqlens, cache_batch_idx,
            cache_leftpad, block_table, rotary_cos, rotary_sin, alibi_slopes, 0, *scalars,
        )
    # nothing to wait for on the CPU: report now, but not from a graph torch.compile traces (the buffer is host
    # state it would guard on, and its read a data-dependent branch): there the report waits, as on the GPU
    if record and q.device.type == "cpu" and not torch.compiler.is_compiling():
        raise_recorded_faults(q.device)
    return out, lse


# ---------------------------------------------------------------------------------------------
# flash_attn_combine
# ---------------------------------------------------------------------------------------------


class CombineFunction(torch.autograd.Function):
    """Bookkeeping only: the backward recomputes the weights from the saved partial log-sum-exps."""

    @staticmethod
    def forward(ctx, out_partial, lse_partial):
        out, lse = ops.attention_combine(out_partial, lse_partial)
        ctx.save_for_backward(out_partial, lse_partial)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        out_partial, lse_partial = ctx.saved_tensors
        return ops.attention_combine_backward(dout, dlse, out_partial, lse_partial)


def flash_attn_combine(out_partial: torch.Tensor, lse_partial: torch.Tensor, out_dtype: torch.dtype | None = None):
    """Merge attention results computed over disjoint key sets, by their log-sum-exps. Differentiable.

    Split s attended to keys K_s and gave the normalized output o_s with log-sum-exp l_s (what
    ``flash_attn_func(..., return_attn_probs=True)`` or ``flash_attn_with_kvcache(...,
    return_softmax_lse=True)`` return). Over the union of the K_s: ``lse = log sum_s exp(l_s)`` and
    ``out = sum_s exp(l_s - lse) o_s``. A split whose l_s is +inf (flashattn's empty row) or -inf saw no
    key: its weight is 0 and its o_s is never read. A row whose splits are all empty gives out = 0 and
    lse = +inf.

    Args:
        out_partial: (num_splits, batch, seqlen, nheads, headdim), float16 / bfloat16 / float32 / float64.
        lse_partial: (num_splits, batch, nheads, seqlen), float32 (or float64), natural log. This is
            flashattn's (and flash-attn 2's) lse layout stacked over splits; flash-attn 3's combine takes
            (num_splits, batch, seqlen, nheads): pass ``lse.transpose(-1, -2)`` (any strides work).
        out_dtype: dtype of ``out``; default out_partial's.

    Returns:
        ``(out, lse)``: out (batch, seqlen, nheads, headdim), lse (batch, nheads, seqlen) in lse_partial's
        dtype. Both carry gradients to out_partial and lse_partial.
    """
    validation.check_combine(out_partial, lse_partial)
    if out_dtype is not None and out_dtype not in validation.COMBINE_DTYPES:
        raise TypeError(f"out_dtype must be None or float16, bfloat16, float32 or float64, got {out_dtype!r}")
    out, lse = CombineFunction.apply(out_partial, lse_partial)
    if out_dtype is not None and out_dtype != out.dtype:
        out = out.to(out_dtype)
    return out, lse
