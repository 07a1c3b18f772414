"""The FP8 forward's custom ops and the calls of the public functions on float8 inputs (forward only).

The PyTorch path computes the attention of the dequantized inputs (value * descale) in float32 and returns
bfloat16: it does *not* round P to e4m3 as the kernel does. It is the definition the kernel approximates, the same
for dense, packed and paged keys and the KV cache; ``testing.fp8_emulated_attention`` adds the kernel's rounding
where a test or the accuracy table needs it. Per-(batch, kv head) descales are exact to fold: k_descale into the
queries' scale and v_descale into the output, so packed, paged and cached keys are upcast as they are.

The trainable FP8 attention (``fp8.flash_attn_func``) quantizes and runs the dense forward op here
(:func:`train_forward`); its backward op runs ``fp8_backward``, the blocked PyTorch reference path, except on sm90 at
head dims 64 and 128 without softcap, where the Gluon kernels compute dQ, dK and dV (``launch/backward_fp8.py``).

The CUDA path is the Triton kernel (``launch/forward_fp8.py``; on sm90 the Gluon kernel for the dense calls it covers)
for dense and packed keys; paged keys and the KV cache have no FP8 kernel, and are refused there unless
``FLASHATTN_BACKEND=torch``.
"""

from __future__ import annotations

import dataclasses

import torch

from . import cpu, fp8_backward, validation
from .backend import backend_for_cpu_tensors, backend_override
from .configs import padded_head_dim
from .fp8_format import FP8_DTYPE, SCALE_BLOCK, dequantize, hadamard_pieces
from .fp8_quantize import Quantized, canonical_descales, kernels_quantize, quantize_dense, random_signs
from .launch import plans
from .launch.backward_fp8 import hopper_fp8_backward_fits, launch_backward_fp8
from .launch.forward_fp8 import launch_forward_fp8
from .launch.quantize_fp8 import hadamard_operands, rotation_operands
from .ops import eager_call
from .options import AttentionOptions, FP8Options


def _options(softmax_scale, window_left, window_right, softcap) -> AttentionOptions:
    return AttentionOptions(softmax_scale, window_left, window_right, softcap)


def _dense_torch(q, k, v, q_descale, k_descale, v_descale, opts):
    q32, k32, v32 = (dequantize(x, d) for x, d in ((q, q_descale), (k, k_descale), (v, v_descale)))
    out, lse = cpu.forward(q32, k32, v32, opts, None, None)
    return out.to(torch.bfloat16), lse


@torch.library.custom_op("flashattn::fp8_attention_forward", mutates_args=(), device_types="cpu")
def fp8_attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_descale: torch.Tensor,
    k_descale: torch.Tensor,
    v_descale: torch.Tensor,
    softmax_scale: float,
    window_left: int,
    window_right: int,
    softcap: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(bfloat16 out, float32 lse (B, Hq, Sq)) of e4m3 q (B, Sq, Hq, D), k/v (B, Sk, Hk, D); the descales are
    (B, Hk, blocks) float32, a single block meaning one descale per (batch, kv head)."""
    opts = _options(softmax_scale, window_left, window_right, softcap)
    if backend_for_cpu_tensors() == "triton":
        return launch_forward_fp8(q, k, v, (q_descale, k_descale, v_descale), opts)
    return _dense_torch(q, k, v, q_descale, k_descale, v_descale, opts)


@fp8_attention_forward.register_kernel("cuda")
def _fp8_attention_forward_cuda(q, k, v, q_descale, k_descale, v_descale, softmax_scale, window_left, window_right,
                                softcap):
    opts = _options(softmax_scale, window_left, window_right, softcap)
    if backend_override() == "torch":
        return _dense_torch(q, k, v, q_descale, k_descale, v_descale, opts)
    inputs = (q, k, v, q_descale, k_descale, v_descale)

    def call():
        return launch_forward_fp8(q, k, v, inputs[3:], opts)

    # a launch plan skips the tile choice, the descriptors and the arguments' binding: most of a short call's time
    return plans.planned("fp8_forward", inputs, opts, call) if plans.plannable(inputs) else call()


@fp8_attention_forward.register_fake
def _fp8_attention_forward_fake(q, k, v, q_descale, k_descale, v_descale, softmax_scale, window_left, window_right,
                                softcap):
    batch, seqlen_q, nheads, _ = q.shape
    return q.new_empty(q.shape, dtype=torch.bfloat16), q.new_empty((batch, nheads, seqlen_q), dtype=torch.float32)


def _token_batch(cu_seqlens: list[int], device: torch.device) -> torch.Tensor:
    """The sequence of each packed token, from a host cu_seqlens."""
    lengths = torch.tensor(cu_seqlens).diff()
    return torch.repeat_interleave(torch.arange(len(lengths)), lengths).to(device)


def folded_queries(q: torch.Tensor, scale: torch.Tensor, rows: torch.Tensor | slice) -> torch.Tensor:
    """float32 q (..., nheads, D) times scale[rows] (..., nheads_k), a kv head's scale on each of its query heads."""
    nheads, nheads_k = q.shape[-2], scale.shape[-1]
    per_head = scale[rows].repeat_interleave(nheads // nheads_k, dim=-1)
    return q.float() * per_head[..., None]


def _varlen_torch(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, q_descale, k_descale, v_descale,
                  opts, block_table):
    from . import ops

    packing, host_q, _ = validation.resolve_packing(cu_seqlens_q, cu_seqlens_k, q.shape[0],
                                                    None if block_table is not None else k.shape[0], max_seqlen_q,
                                                    max_seqlen_k, need_host=True)
    tokens = _token_batch(host_q, q.device)
    q32 = folded_queries(q, q_descale * k_descale, tokens)
    out, lse = ops._varlen_forward(q32, k.float(), v.float(), cu_seqlens_q, cu_seqlens_k, packing.max_seqlen_q,
                                   packing.max_seqlen_k, None, None, opts, "torch", block_table)
    return folded_queries(out, v_descale, tokens).to(torch.bfloat16), lse


@torch.library.custom_op("flashattn::fp8_varlen_attention_forward", mutates_args=(), device_types="cpu")
def fp8_varlen_attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    q_descale: torch.Tensor,
    k_descale: torch.Tensor,
    v_descale: torch.Tensor,
    softmax_scale: float,
    window_left: int,
    window_right: int,
    softcap: float,
    block_table: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(bfloat16 out, float32 lse (Hq, total_q)) of packed e4m3 q (total_q, Hq, D), k/v (total_k, Hk, D) or page
    pools with ``block_table``; the descales are (batch, Hk) float32."""
    opts = _options(softmax_scale, window_left, window_right, softcap)
    if backend_for_cpu_tensors() == "triton":
        return _varlen_triton(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, q_descale, k_descale,
                              v_descale, opts, block_table)
    return _varlen_torch(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, q_descale, k_descale,
                         v_descale, opts, block_table)


def _varlen_triton(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, q_descale, k_descale, v_descale,
                   opts, block_table):
    if block_table is not None:
        raise NotImplementedError("flash_attn_varlen_func with float8 inputs and a block_table has no GPU kernel: "
                                  "gather the pages into packed k and v, or set FLASHATTN_BACKEND=torch")
    packing, _, _ = validation.resolve_packing(cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0], max_seqlen_q,
                                               max_seqlen_k)
    descales = tuple(d[:, :, None] for d in (q_descale, k_descale, v_descale))
    return launch_forward_fp8(q, k, v, descales, opts, packing)


@fp8_varlen_attention_forward.register_kernel("cuda")
def _fp8_varlen_attention_forward_cuda(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, q_descale,
                                       k_descale, v_descale, softmax_scale, window_left, window_right, softcap,
                                       block_table=None):
    opts = _options(softmax_scale, window_left, window_right, softcap)
    run = _varlen_torch if backend_override() == "torch" else _varlen_triton
    return run(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, q_descale, k_descale, v_descale,
               opts, block_table)


@fp8_varlen_attention_forward.register_fake
def _fp8_varlen_attention_forward_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, q_descale,
                                       k_descale, v_descale, softmax_scale, window_left, window_right, softcap,
                                       block_table=None):
    total_q, nheads, _ = q.shape
    return q.new_empty(q.shape, dtype=torch.bfloat16), q.new_empty((nheads, total_q), dtype=torch.float32)


# ---------------------------------------------------------------------------------------------
# The public functions' FP8 calls: their descales made whole (None is 1), then the op
# ---------------------------------------------------------------------------------------------


def dense(q, k, v, q_descale, k_descale, v_descale, opts: AttentionOptions):
    batch, nheads_k = q.shape[0], k.shape[2]
    descales = canonical_descales((q_descale, k_descale, v_descale), batch, nheads_k, q.device)
    # eager CUDA calls skip the op's dispatch (tens of microseconds of a short call's host time)
    return eager_call(fp8_attention_forward, _fp8_attention_forward_cuda, q, k, v, *descales, opts.softmax_scale,
                      opts.window_left, opts.window_right, opts.softcap)


def _per_head(descale, batch: int, nheads_k: int, device: torch.device) -> torch.Tensor:
    return torch.ones(batch, nheads_k, device=device) if descale is None else descale


def varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int, q_descale, k_descale,
           v_descale, opts: AttentionOptions, block_table=None):
    batch, nheads_k = cu_seqlens_q.shape[0] - 1, k.shape[-2]
    descales = (_per_head(d, batch, nheads_k, q.device) for d in (q_descale, k_descale, v_descale))
    return eager_call(fp8_varlen_attention_forward, _fp8_varlen_attention_forward_cuda, q, k, v, cu_seqlens_q,
                      cu_seqlens_k, max_seqlen_q, max_seqlen_k, *descales, opts.softmax_scale, opts.window_left,
                      opts.window_right, opts.softcap, block_table)


def kvcache(q, k_cache, v_cache, k, v, q_descale, k_descale, v_descale, attend):
    """A KV-cache step on e4m3 tensors: ``attend(queries, k_cache, v_cache, k, v)`` is the public step with q's and
    k's descales folded into the queries, over the e4m3 caches and new keys themselves, which the step appends as
    they are and widens to the queries' dtype as it reads them (exact): float32 queries on PyTorch's path (the
    definition), bfloat16 on the kernels' (the decode kernel's products are 16-bit; P is not rounded to e4m3: a step
    reads the cache once, and its bytes, not its products, set its time). The output takes v_descale and becomes
    bfloat16."""
    batch, nheads, nheads_k = q.shape[0], q.shape[2], k_cache.shape[2]
    if nheads_k == 0 or nheads % nheads_k != 0:  # the step's own check (validation.check_cache) comes after folding
        raise ValueError(f"the number of query heads ({nheads}) must be a multiple of the number of key/value heads "
                         f"in k_cache ({nheads_k})")
    q_descale, k_descale, v_descale = (_per_head(d, batch, nheads_k, q.device) for d in (q_descale, k_descale,
                                                                                        v_descale))
    rows = torch.arange(batch, device=q.device)[:, None]  # (batch, 1): each token takes its batch element's scale
    queries = folded_queries(q, q_descale * k_descale, rows)
    out, lse = attend(queries.to(torch.bfloat16) if _kernels(q) else queries, k_cache, v_cache, k, v)
    return folded_queries(out, v_descale, rows).to(torch.bfloat16), lse


def _kernels(q: torch.Tensor) -> bool:
    """Whether a step on q runs the Triton kernels (a GPU's, or the interpreter's on CPU tensors)."""
    if q.is_cuda:
        return backend_override() != "torch"
    return backend_for_cpu_tensors() == "triton"


# ---------------------------------------------------------------------------------------------
# The trainable FP8 attention: quantize, the dense forward op; the backward's op
# ---------------------------------------------------------------------------------------------


def train_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, options: FP8Options):
    """(quantized, out in q's dtype, lse, signs) of 16-bit q, k, v: quantized as ``fp8.quantize`` does (the rotation's
    signs drawn from ``options.seed``; None without a rotation), then the FP8 forward: :func:`fp8_train_forward`."""
    signs = random_signs(q.shape[-1], options.seed, q.device) if options.hadamard else None
    opts = options.attention
    # eager CUDA calls skip the op's dispatch, as the forward op's do
    *quantized, out, lse = eager_call(fp8_train_forward, _fp8_train_forward_cuda, q, k, v, signs, opts.softmax_scale,
                                      opts.window_left, opts.window_right, opts.softcap, options.granularity)
    # no .to() when out is already q's dtype: its alias of the op's output, returned by the autograd.Function, left
    # torch.compile (torch 2.11) giving zero gradients
    return Quantized(*quantized), out if out.dtype == q.dtype else out.to(q.dtype), lse, signs


@torch.library.custom_op("flashattn::fp8_train_forward", mutates_args=(), device_types="cpu")
def fp8_train_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    signs: torch.Tensor | None,
    softmax_scale: float,
    window_left: int,
    window_right: int,
    softcap: float,
    granularity: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
           torch.Tensor]:
    """The trainable FP8 forward as one op, so that torch.compile sees a call whole (the quantizer's kernels and the
    launch plan are no graph's ops): e4m3 q, k, v and their descales (``quantize_dense``, rotated by ``signs`` unless
    None), then bfloat16 out and float32 lse (B, Hq, Sq) of the FP8 forward on them."""
    return _quantize_and_attend(q, k, v, signs, granularity, _options(softmax_scale, window_left, window_right,
                                                                       softcap))


def _quantize_and_attend(q, k, v, signs, granularity: str, opts: AttentionOptions) -> tuple:
    quantized = quantize_dense(q, k, v, signs, granularity)
    return (*quantized, *dense(*quantized, opts))


@fp8_train_forward.register_kernel("cuda")
def _fp8_train_forward_cuda(q, k, v, signs, softmax_scale, window_left, window_right, softcap, granularity):
    """The quantizer's kernels and the forward's replay from one launch plan, keyed without the signs: a call's signs
    are one of its inputs."""
    opts = _options(softmax_scale, window_left, window_right, softcap)
    inputs = (q, k, v, signs, *_rotation_constants(signs, q.shape[-1]))

    def call():
        return _quantize_and_attend(q, k, v, signs, granularity, opts)

    # a plan only where the quantizer's kernels run (its PyTorch path's tensors are no kernel's outputs)
    if kernels_quantize(q, k, v) and _plannable(inputs, granularity):
        return tuple(plans.planned("fp8_train_forward", inputs, (opts, signs is not None, granularity), call))
    return call()


@fp8_train_forward.register_fake
def _fp8_train_forward_fake(q, k, v, signs, softmax_scale, window_left, window_right, softcap, granularity):
    (batch, seqlen_q, nheads, _), (seqlen_k, nheads_k) = q.shape, k.shape[1:3]

    def descale(seqlen):
        blocks = () if granularity == "head" else (-(-seqlen // SCALE_BLOCK),)
        return q.new_empty((batch, nheads_k, *blocks), dtype=torch.float32)

    return (*(x.new_empty(x.shape, dtype=FP8_DTYPE) for x in (q, k, v)), descale(seqlen_q), descale(seqlen_k),
            descale(seqlen_k), q.new_empty(q.shape, dtype=torch.bfloat16),
            q.new_empty((batch, nheads, seqlen_q), dtype=torch.float32))


def _rotation_constants(signs: torch.Tensor | None, head_dim: int) -> tuple:
    """The cached H and col_scale that a call's rotation operands are built from (``quantize_fp8.hadamard_operands``),
    or none without a rotation: a launch plan's inputs, since its kernels read them."""
    if signs is None:
        return ()
    return hadamard_operands(tuple(hadamard_pieces(head_dim)), padded_head_dim(head_dim), signs.device)


def _plannable(inputs: tuple, granularity: str) -> bool:
    """Whether a trainable FP8 call's forward or backward may replay a launch plan: block descales (per-head ones
    reduce the blocks' amaxes with a torch op between the quantizer's kernels) and CUDA inputs read in place."""
    return granularity == "block" and inputs[0].is_cuda and plans.plannable(inputs)


@torch.library.custom_op("flashattn::fp8_attention_backward", mutates_args=())
def fp8_attention_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_descale: torch.Tensor,
    k_descale: torch.Tensor,
    v_descale: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    signs: torch.Tensor | None,
    softmax_scale: float,
    window_left: int,
    window_right: int,
    softcap: float,
    granularity: str,
    deterministic: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) in dout's dtype of the FP8 forward's saved e4m3 q, k, v (q and k rotated by diag(signs) H when
    ``signs`` is given) and descales: the PyTorch path (``fp8_backward``, deterministic either way); on CUDA see
    the kernel below."""
    opts = _options(softmax_scale, window_left, window_right, softcap)
    return fp8_backward.backward(dout, q, k, v, (q_descale, k_descale, v_descale), out, lse, signs, opts,
                                 granularity)


@fp8_attention_backward.register_kernel("cuda")
def _fp8_attention_backward_cuda(dout, q, k, v, q_descale, k_descale, v_descale, out, lse, signs, softmax_scale,
                                 window_left, window_right, softcap, granularity, deterministic=False):
    """dQ, dK and dV by the Gluon kernels where they cover the call (``hopper_fp8_backward_fits``; ``deterministic``
    keeps their bitwise-repeatable form); the reference path elsewhere and under ``FLASHATTN_BACKEND=torch``."""
    opts = dataclasses.replace(_options(softmax_scale, window_left, window_right, softcap),
                               deterministic=deterministic)
    descales = (q_descale, k_descale, v_descale)
    if backend_override() == "torch" or not hopper_fp8_backward_fits(dout, q, k, v, opts):
        return fp8_backward.backward(dout, q, k, v, descales, out, lse, signs, opts, granularity)
    head_dim = q.shape[-1]
    inputs = (dout, q, k, v, *descales, out, lse, signs, *_rotation_constants(signs, head_dim))

    def call():
        rotation = None
        if signs is not None:  # in bfloat16, the rotation back's operand (exact: +-1)
            rotation = rotation_operands(signs, hadamard_pieces(head_dim), torch.bfloat16, padded_head_dim(head_dim))
        return launch_backward_fp8(dout, q, k, v, descales, out, lse, rotation, opts, granularity)

    # a launch plan: without one the launches' host time (2-4 ms a call) exceeded the kernels' up to 4k tokens
    return plans.planned("fp8_backward", inputs, (opts, granularity), call) if _plannable(inputs, granularity) \
        else call()


@fp8_attention_backward.register_fake
def _fp8_attention_backward_fake(dout, q, k, v, q_descale, k_descale, v_descale, out, lse, signs, softmax_scale,
                                 window_left, window_right, softcap, granularity, deterministic=False):
    return (dout.new_empty(q.shape), dout.new_empty(k.shape), dout.new_empty(v.shape))


def train_backward(dout: torch.Tensor, quantized: Quantized, out: torch.Tensor, lse: torch.Tensor,
                   signs: torch.Tensor | None, options: FP8Options):
    """The gradients of :func:`train_forward`'s q, k, v; ``signs``: its rotation's (None without one)."""
    opts = options.attention
    # eager CUDA calls skip the op's dispatch (several hundred microseconds of host time here)
    return eager_call(fp8_attention_backward, _fp8_attention_backward_cuda, dout, *quantized, out, lse, signs,
                      opts.softmax_scale, opts.window_left, opts.window_right, opts.softcap, options.granularity,
                      opts.deterministic)

