"""Custom ops: allocate outputs, pick the tile config, launch. The only place that launches kernels.

Each op is a ``torch.library.custom_op`` with a CPU implementation (blocked PyTorch, ``cpu.py``) and a
CUDA implementation (Triton), chosen by the dispatcher from the tensors' device, and a fake
implementation for ``torch.compile``. ``FLASHATTN_BACKEND=torch|triton`` overrides the choice: the
torch path runs on any device, and the Triton kernels run on CPU tensors under ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

from . import configs, cpu
from .options import AttentionOptions

LOG2E = math.log2(math.e)


def backend_override() -> str | None:
    """The value of FLASHATTN_BACKEND ('torch' or 'triton'), or None to dispatch by device."""
    value = os.environ.get("FLASHATTN_BACKEND", "").strip().lower()
    if value in ("", "auto"):
        return None
    if value not in ("torch", "triton"):
        raise ValueError(f"FLASHATTN_BACKEND must be 'torch', 'triton' or unset, got {value!r}")
    return value


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _options(softmax_scale, window_left, window_right, softcap, dropout_p) -> AttentionOptions:
    return AttentionOptions(softmax_scale, window_left, window_right, softcap, dropout_p)


def _kernel_scalars(opts: AttentionOptions, rng_state: torch.Tensor | None) -> dict:
    """Runtime scalars and constexpr flags shared by every kernel of one call."""
    if opts.softcap > 0:
        qk_scale, softcap_log2 = opts.softmax_scale / opts.softcap, opts.softcap * LOG2E
    else:
        qk_scale, softcap_log2 = opts.softmax_scale * LOG2E, 0.0
    seed, offset = (int(x) for x in rng_state.tolist()) if rng_state is not None else (0, 0)
    return dict(
        qk_scale=qk_scale,
        softcap_log2=softcap_log2,
        window_left=opts.window_left,
        window_right=opts.window_right,
        dropout_p=opts.dropout_p,
        rng_seed=seed,
        rng_offset=offset,
        WINDOW_LEFT=opts.window_left >= 0,
        WINDOW_RIGHT=opts.window_right >= 0,
        HAS_SOFTCAP=opts.softcap > 0,
        HAS_DROPOUT=opts.dropout_p > 0,
    )


def _dot_flags(dtype: torch.dtype) -> dict:
    # fp32 inputs get exact fp32 products (not tf32) and compensated accumulators, to stay within
    # 2x of PyTorch's fp32 error. The interpreter's bf16 dot is wrong: there tiles are upcast first.
    return dict(
        UPCAST_DOT=interpreting() and dtype == torch.bfloat16,
        DOT_PRECISION="ieee" if dtype == torch.float32 else "tf32",
        COMPENSATED=dtype == torch.float32,
    )


def _alibi_args(alibi_slopes: torch.Tensor | None, q: torch.Tensor) -> tuple[torch.Tensor, int, bool]:
    if alibi_slopes is None:
        return q, 0, False  # any pointer will do: the kernel never reads it
    return alibi_slopes, (alibi_slopes.stride(0) if alibi_slopes.dim() == 2 else 0), True


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _strides(x: torch.Tensor) -> tuple[int, int, int]:
    """(batch, token, head) strides; a packed (total, heads, dim) tensor has no batch stride (0)."""
    return (x.stride(0), x.stride(1), x.stride(2)) if x.dim() == 4 else (0, x.stride(0), x.stride(1))


@dataclass(frozen=True)
class Packing:
    """A varlen batch as the kernels see it: device cu_seqlens, and the max lengths that size the grid."""

    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int

    @property
    def batch(self) -> int:
        return self.cu_seqlens_q.shape[0] - 1


@dataclass(frozen=True)
class _Layout:
    """What the launchers need to know of dense (B, S, H, D) or packed (total, H, D) inputs.

    ``lengths`` go to the kernels' seqlen_q/seqlen_k arguments (the packed totals for varlen); ``grid_q``
    and ``grid_k`` are the longest sequences, which size the grids; ``cu_seqlens`` are the kernels'
    CuSeqlensQ/CuSeqlensK (any pointer when dense: never read).
    """

    batch: int
    lengths: tuple[int, int]
    grid_q: int
    grid_k: int
    cu_seqlens: tuple[torch.Tensor, torch.Tensor]
    lse_shape: tuple[int, ...]
    is_varlen: bool

    @classmethod
    def of(cls, q: torch.Tensor, k: torch.Tensor, packing: Packing | None) -> _Layout:
        if packing is None:
            batch, seqlen_q = q.shape[:2]
            seqlen_k = k.shape[1]
            return cls(batch, (seqlen_q, seqlen_k), seqlen_q, seqlen_k, (q, q), (batch, q.shape[2], seqlen_q), False)
        total_q, total_k = q.shape[0], k.shape[0]
        return cls(packing.batch, (total_q, total_k), packing.max_seqlen_q, packing.max_seqlen_k,
                   (packing.cu_seqlens_q, packing.cu_seqlens_k), (q.shape[1], total_q), True)


def _triton_forward(q, k, v, alibi_slopes, rng_state, opts: AttentionOptions, packing: Packing | None = None):
    from .kernels.forward import attention_forward_kernel

    q, k, v = (_last_dim_contiguous(x) for x in (q, k, v))
    nheads, head_dim = q.shape[-2:]
    nheads_k = k.shape[-2]
    layout = _Layout.of(q, k, packing)
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(layout.lse_shape, dtype=torch.float32, device=q.device)
    config = configs.tile_config("forward", head_dim, opts.masked, q.dtype, q.device, interpreting())
    slopes, stride_alibi_b, has_alibi = _alibi_args(alibi_slopes, q)
    grid = (_cdiv(layout.grid_q, config.block_m), layout.batch * nheads)
    if grid[0] == 0:
        return out, lse  # only empty sequences: nothing to compute, nothing to store
    attention_forward_kernel[grid](
        q, k, v, out, lse, slopes, *layout.cu_seqlens,
        *_strides(q), *_strides(k), *_strides(v), *_strides(out),
        stride_alibi_b,
        *layout.lengths, nheads, nheads // nheads_k,
        HEAD_DIM=head_dim, BLOCK_D=configs.padded_head_dim(head_dim),
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, HAS_ALIBI=has_alibi, IS_VARLEN=layout.is_varlen,
        num_warps=config.num_warps, num_stages=config.num_stages,
        **_kernel_scalars(opts, rng_state), **_dot_flags(q.dtype),
    )
    return out, lse


def _triton_backward(dout, q, k, v, out, lse, alibi_slopes, rng_state, opts: AttentionOptions,
                     packing: Packing | None = None):
    from .kernels.backward import delta_kernel, dkdv_kernel, dq_kernel

    dout, q, k, v, out = (_last_dim_contiguous(x) for x in (dout, q, k, v, out))
    nheads, head_dim = q.shape[-2:]
    nheads_k = k.shape[-2]
    layout = _Layout.of(q, k, packing)
    batch = layout.batch
    block_d = configs.padded_head_dim(head_dim)
    interpret = interpreting()
    dq = torch.empty_like(q, memory_format=torch.contiguous_format)
    dk = torch.empty_like(k, memory_format=torch.contiguous_format)
    dv = torch.empty_like(v, memory_format=torch.contiguous_format)
    if layout.grid_q == 0 or layout.grid_k == 0:
        # no sequence has both queries and keys: every gradient is 0 (and may have no rows at all)
        return dq.zero_(), dk.zero_(), dv.zero_()

    # delta = rowsum(dO * O) is per query row: packed tokens are one batch of total_q rows to it
    delta = torch.empty_like(lse)
    delta_block = 16 if interpret else 64
    delta_rows, delta_batch = (layout.lengths[0], 1) if packing is not None else (layout.grid_q, batch)
    delta_kernel[(_cdiv(delta_rows, delta_block), delta_batch * nheads)](
        out, dout, delta, *_strides(out), *_strides(dout),
        delta_rows, nheads, HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_M=delta_block,
    )

    slopes, stride_alibi_b, has_alibi = _alibi_args(alibi_slopes, q)
    shared = dict(
        softmax_scale=opts.softmax_scale, HEAD_DIM=head_dim, BLOCK_D=block_d, HAS_ALIBI=has_alibi,
        IS_VARLEN=layout.is_varlen, **_kernel_scalars(opts, rng_state), **_dot_flags(q.dtype),
    )
    inputs = (q, k, v, dout, lse, delta)
    input_strides = (*_strides(q), *_strides(k), *_strides(v), *_strides(dout))
    config = configs.tile_config("dkdv", head_dim, opts.masked, q.dtype, q.device, interpret)
    dkdv_kernel[(_cdiv(layout.grid_k, config.block_n), batch * nheads_k)](
        *inputs, dk, dv, slopes, *layout.cu_seqlens, *input_strides, *_strides(dk), *_strides(dv),
        stride_alibi_b, *layout.lengths, nheads, nheads_k, nheads // nheads_k,
        BLOCK_M=config.block_m, BLOCK_N=config.block_n,
        num_warps=config.num_warps, num_stages=config.num_stages, **shared,
    )
    config = configs.tile_config("dq", head_dim, opts.masked, q.dtype, q.device, interpret)
    dq_kernel[(_cdiv(layout.grid_q, config.block_m), batch * nheads)](
        *inputs, dq, slopes, *layout.cu_seqlens, *input_strides, *_strides(dq),
        stride_alibi_b, *layout.lengths, nheads, nheads // nheads_k,
        BLOCK_M=config.block_m, BLOCK_N=config.block_n,
        num_warps=config.num_warps, num_stages=config.num_stages, **shared,
    )
    return dq, dk, dv


# ---------------------------------------------------------------------------------------------
# The custom ops. Options arrive unpacked (custom ops take only tensors and scalars).
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
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) for q (B, Sq, Hq, D), k/v (B, Sk, Hk, D); lse is float32 (B, Hq, Sq), natural log."""
    opts = _options(softmax_scale, window_left, window_right, softcap, dropout_p)
    if backend_override() == "triton":
        return _triton_forward(q, k, v, alibi_slopes, rng_state, opts)
    return cpu.forward(q, k, v, opts, alibi_slopes, rng_state)


@attention_forward.register_kernel("cuda")
def _attention_forward_cuda(q, k, v, alibi_slopes, rng_state, softmax_scale, window_left, window_right,
                            softcap, dropout_p):
    opts = _options(softmax_scale, window_left, window_right, softcap, dropout_p)
    if backend_override() == "torch":
        return cpu.forward(q, k, v, opts, alibi_slopes, rng_state)
    return _triton_forward(q, k, v, alibi_slopes, rng_state, opts)


@attention_forward.register_fake
def _attention_forward_fake(q, k, v, alibi_slopes, rng_state, softmax_scale, window_left, window_right,
                            softcap, dropout_p):
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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv), recomputed from the saved log-sum-exp; dk/dv are summed over each GQA group."""
    opts = _options(softmax_scale, window_left, window_right, softcap, dropout_p)
    if backend_override() == "triton":
        return _triton_backward(dout, q, k, v, out, lse, alibi_slopes, rng_state, opts)
    return cpu.backward(dout, q, k, v, out, lse, opts, alibi_slopes, rng_state)


@attention_backward.register_kernel("cuda")
def _attention_backward_cuda(dout, q, k, v, out, lse, alibi_slopes, rng_state, softmax_scale, window_left,
                             window_right, softcap, dropout_p):
    opts = _options(softmax_scale, window_left, window_right, softcap, dropout_p)
    if backend_override() == "torch":
        return cpu.backward(dout, q, k, v, out, lse, opts, alibi_slopes, rng_state)
    return _triton_backward(dout, q, k, v, out, lse, alibi_slopes, rng_state, opts)


@attention_backward.register_fake
def _attention_backward_fake(dout, q, k, v, out, lse, alibi_slopes, rng_state, softmax_scale, window_left,
                             window_right, softcap, dropout_p):
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            torch.empty_like(k, memory_format=torch.contiguous_format),
            torch.empty_like(v, memory_format=torch.contiguous_format))


def op_arguments(opts: AttentionOptions) -> tuple[float, int, int, float, float]:
    """The scalar tail of both ops' argument lists, in their order."""
    return opts.softmax_scale, opts.window_left, opts.window_right, opts.softcap, opts.dropout_p



# ---------------------------------------------------------------------------------------------
# Varlen (packed sequences): q (total_q, Hq, D), k/v (total_k, Hk, D), cu_seqlens int32 (batch + 1,).
# ---------------------------------------------------------------------------------------------

DERIVE_MAX_SEQLEN = -1
"""A max_seqlen the caller gave as a tensor: the launcher takes the exact maximum from cu_seqlens."""


def _check_cu_seqlens(name: str, cu_seqlens: list[int], total: int, total_name: str) -> int:
    """Check one host copy of cu_seqlens; return its longest sequence."""
    if cu_seqlens[0] != 0:
        raise ValueError(f"{name} must start at 0, got {cu_seqlens[0]}")
    lengths = [end - start for start, end in zip(cu_seqlens, cu_seqlens[1:], strict=False)]
    for b, length in enumerate(lengths):
        if length < 0:
            raise ValueError(f"{name} must be non-decreasing (sequence lengths >= 0), but sequence {b} goes "
                             f"from {cu_seqlens[b]} to {cu_seqlens[b + 1]}")
    if cu_seqlens[-1] != total:
        raise ValueError(f"{name} must end at the number of tokens, {total_name} = {total}, "
                         f"got {cu_seqlens[-1]}")
    return max(lengths)


def resolve_packing(cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, total_q: int, total_k: int,
                    max_seqlen_q: int, max_seqlen_k: int, need_host: bool = False,
                    ) -> tuple[Packing, list[int] | None, list[int] | None]:
    """Packing for the kernels, plus host copies of cu_seqlens where they were read.

    cu_seqlens are read on the host, and checked, when that costs no GPU synchronization (CPU tensors),
    when a max_seqlen came as a tensor (the grid needs a host value: one small copy gives both), or
    when ``need_host`` (the CPU path loops over them). Otherwise, on the GPU with integer max lengths,
    they are trusted, as flash-attn does: checking them would stall every call on the device.
    """
    cu_seqlens_q, cu_seqlens_k = cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous()
    derive = DERIVE_MAX_SEQLEN in (max_seqlen_q, max_seqlen_k)
    host_q = host_k = None
    if need_host or derive or cu_seqlens_q.device.type == "cpu":
        host = torch.cat([cu_seqlens_q, cu_seqlens_k]).tolist()
        host_q, host_k = host[: len(host) // 2], host[len(host) // 2 :]
        longest_q = _check_cu_seqlens("cu_seqlens_q", host_q, total_q, "q.shape[0]")
        longest_k = _check_cu_seqlens("cu_seqlens_k", host_k, total_k, "k.shape[0]")
        for name, given, longest in (("max_seqlen_q", max_seqlen_q, longest_q), ("max_seqlen_k", max_seqlen_k,
                                                                               longest_k)):
            if given != DERIVE_MAX_SEQLEN and given < longest:
                raise ValueError(f"{name} must be at least the longest sequence's length {longest}, got {given}")
        max_seqlen_q = longest_q if max_seqlen_q == DERIVE_MAX_SEQLEN else max_seqlen_q
        max_seqlen_k = longest_k if max_seqlen_k == DERIVE_MAX_SEQLEN else max_seqlen_k
    return Packing(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k), host_q, host_k


def _varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes, rng_state,
                    opts: AttentionOptions, backend: str):
    packing, host_q, host_k = resolve_packing(cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0], max_seqlen_q,
                                              max_seqlen_k, need_host=backend == "torch")
    if backend == "torch":
        return cpu.varlen_forward(q, k, v, host_q, host_k, opts, alibi_slopes, rng_state)
    return _triton_forward(q, k, v, alibi_slopes, rng_state, opts, packing)


def _varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes,
                     rng_state, opts: AttentionOptions, backend: str):
    packing, host_q, host_k = resolve_packing(cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0], max_seqlen_q,
                                              max_seqlen_k, need_host=backend == "torch")
    if backend == "torch":
        return cpu.varlen_backward(dout, q, k, v, out, lse, host_q, host_k, opts, alibi_slopes, rng_state)
    return _triton_backward(dout, q, k, v, out, lse, alibi_slopes, rng_state, opts, packing)


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
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of a packed batch; lse is float32 (Hq, total_q). max_seqlen -1: derive it."""
    opts = _options(softmax_scale, window_left, window_right, softcap, dropout_p)
    return _varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes,
                           rng_state, opts, backend_override() or "torch")


@varlen_attention_forward.register_kernel("cuda")
def _varlen_attention_forward_cuda(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes,
                                   rng_state, softmax_scale, window_left, window_right, softcap, dropout_p):
    opts = _options(softmax_scale, window_left, window_right, softcap, dropout_p)
    return _varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes,
                           rng_state, opts, backend_override() or "triton")


@varlen_attention_forward.register_fake
def _varlen_attention_forward_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes,
                                   rng_state, softmax_scale, window_left, window_right, softcap, dropout_p):
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
    opts = _options(softmax_scale, window_left, window_right, softcap, dropout_p)
    return _varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                            alibi_slopes, rng_state, opts, backend_override() or "torch")


@varlen_attention_backward.register_kernel("cuda")
def _varlen_attention_backward_cuda(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                    alibi_slopes, rng_state, softmax_scale, window_left, window_right, softcap,
                                    dropout_p):
    opts = _options(softmax_scale, window_left, window_right, softcap, dropout_p)
    return _varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                            alibi_slopes, rng_state, opts, backend_override() or "triton")


@varlen_attention_backward.register_fake
def _varlen_attention_backward_fake(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                    alibi_slopes, rng_state, softmax_scale, window_left, window_right, softcap,
                                    dropout_p):
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            torch.empty_like(k, memory_format=torch.contiguous_format),
            torch.empty_like(v, memory_format=torch.contiguous_format))
