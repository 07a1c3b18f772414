"""FP8 quantization: the Hadamard rotation, block and per-head descales, and their inverse (``dequantize``).

The public face is :mod:`flashattn.fp8`, which re-exports these; they live here, below the ops and the autograd
layer, so that the trainable FP8 attention (``fp8.flash_attn_func``) can quantize inside its forward and backward
without an import circle. The module docstring of :mod:`flashattn.fp8` describes the rotation.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from .backend import backend_for_cpu_tensors, backend_override
from .configs import padded_head_dim
from .fp8_format import (
    E4M3_MAX,
    FP8_DTYPE,
    SCALE_BLOCK,
    e4m3_descale,
    hadamard_pieces,
    rotation_matrix,
)
from .validation import (
    PACKED,
    check_cu_seqlens,
    check_cu_seqlens_pair,
    check_host_cu_seqlens,
    resolve_packing,
    transposed_hint,
)


class Quantized(NamedTuple):
    """What :func:`quantize` returns: e4m3 q, k, v and their float32 descales (value = x_fp8 * descale)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    q_descale: torch.Tensor
    k_descale: torch.Tensor
    v_descale: torch.Tensor


def random_signs(head_dim: int, seed: int | None, device: torch.device) -> torch.Tensor:
    """+-1 float32 signs of the rotation: from ``seed`` by a hash (:func:`seeded_signs`), the same on any device, or
    with None drawn from torch's default generator (``torch.manual_seed`` repeats them). No ``torch.Generator``, so
    that torch.compile traces the draw with ``fullgraph=True``. The copy to a GPU is from pinned memory, asynchronous:
    from pageable memory the driver may wait for the stream's earlier work, which would drain a quantize call's queue
    (a compiled graph makes its own copy)."""
    if seed is None:
        signs = torch.randint(0, 2, (head_dim,)).to(torch.float32) * 2 - 1
    else:
        # a compiled graph folds the hash's Python arithmetic into constants while tracing: no cache to consult there
        hashed = seeded_signs.__wrapped__ if torch.compiler.is_compiling() else seeded_signs
        signs = torch.tensor(hashed(head_dim, seed), dtype=torch.float32)
    if device.type == "cuda" and not torch.compiler.is_compiling():
        return signs.pin_memory().to(device, non_blocking=True)
    return signs.to(device)


@functools.lru_cache(maxsize=64)
def seeded_signs(head_dim: int, seed: int) -> tuple[float, ...]:
    """The rotation's ``head_dim`` signs of ``seed`` (any int in [-2**63, 2**64)): the top bit of SplitMix64's output
    at position i of the stream that ``seed`` starts, in Python's integers, so that no device or library version
    changes them."""
    mask = 2**64 - 1

    def mix(z: int) -> int:  # SplitMix64's finalizer (Steele, Lea and Flood, 2014)
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        return z ^ (z >> 31)

    start = seed & mask
    return tuple(1.0 - 2.0 * (mix((start + (i + 1) * 0x9E3779B97F4A7C15) & mask) >> 63) for i in range(head_dim))


def rotate(x: torch.Tensor, signs: torch.Tensor) -> torch.Tensor:
    """x (..., head_dim) times the orthogonal matrix diag(signs) H, in float32 at least.

    One matrix product with the explicit matrix rather than the fast transform's log2(n) passes of additions: at head
    dims up to 256 the product is one read and one write of x on the GPU (the n log n transform is 8 elementwise
    passes over x in PyTorch), and its float32 sums differ from the transform's by rounding only."""
    work = x.float() if x.dtype != torch.float64 else x
    return work @ rotation_matrix(signs, work.dtype)


def quantize_tensor(x: torch.Tensor, nheads_k: int, granularity: str = "block") -> tuple[torch.Tensor, torch.Tensor]:
    """x (batch, seqlen, nheads, head_dim) -> (e4m3 x, float32 descale), scale = amax / E4M3_MAX.

    ``granularity`` "block": amax over each SCALE_BLOCK rows of a kv head's group of heads, descale (batch, nheads_k,
    ceil(seqlen / SCALE_BLOCK)); "head": over the whole sequence, descale (batch, nheads_k). An all-zero block takes
    descale 1.
    """
    check_quantize_options(True, None, granularity)
    check_quantize_input("x", x, packed=False)
    check_kv_heads(x, nheads_k)
    batch, seqlen, nheads, head_dim = x.shape
    group = nheads // nheads_k
    grouped = x.float().reshape(batch, seqlen, nheads_k, group * head_dim)
    if granularity == "head":
        amax = grouped.abs().amax(dim=(1, 3)) if seqlen else grouped.new_zeros(batch, nheads_k)  # (b, nheads_k)
        per_row = amax[:, None, :, None]
    else:
        blocks = -(-seqlen // SCALE_BLOCK)
        padded = torch.nn.functional.pad(grouped, (0, 0, 0, 0, 0, blocks * SCALE_BLOCK - seqlen))
        amax = padded.abs().unflatten(1, (blocks, SCALE_BLOCK)).amax(dim=(2, 4))  # (b, blocks, hk)
        per_row = amax.repeat_interleave(SCALE_BLOCK, dim=1)[:, :seqlen, :, None]
        amax = amax.transpose(1, 2)
    descale = e4m3_descale(amax).contiguous()
    scale = e4m3_descale(per_row)
    quantized = (grouped / scale).clamp(-E4M3_MAX, E4M3_MAX).to(FP8_DTYPE)
    return quantized.reshape(x.shape), descale


def quantize_packed(x: torch.Tensor, cu_seqlens: torch.Tensor, nheads_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x (total, nheads, head_dim), sequence b its rows cu_seqlens[b]:cu_seqlens[b + 1] -> (e4m3 x, float32 descale
    (batch, nheads_k)): amax over each sequence's rows of a kv head's group of heads, read on the device (no copy of
    the lengths to the host). An empty or all-zero sequence takes descale 1. cu_seqlens' values are checked where
    that costs no synchronization (a CPU tensor); on a GPU they are trusted, as ``flash_attn_varlen_func`` trusts
    them."""
    check_quantize_input("x", x, packed=True)
    check_kv_heads(x, nheads_k)
    check_cu_seqlens("cu_seqlens", cu_seqlens, x.device)
    if cu_seqlens.device.type == "cpu":
        check_host_cu_seqlens("cu_seqlens", cu_seqlens.tolist(), x.shape[0], "x.shape[0]")
    total, nheads, head_dim = x.shape
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    batch = lengths.numel()
    sequence = torch.repeat_interleave(torch.arange(batch, device=x.device), lengths, output_size=total)
    grouped = x.float().reshape(total, nheads_k, nheads // nheads_k * head_dim)
    row_amax = grouped.abs().amax(dim=2)  # (total, nheads_k)
    amax = row_amax.new_zeros(batch, nheads_k).scatter_reduce_(0, sequence[:, None].expand_as(row_amax), row_amax,
                                                               "amax")
    descale = e4m3_descale(amax)
    quantized = (grouped / descale[sequence][:, :, None]).clamp(-E4M3_MAX, E4M3_MAX).to(FP8_DTYPE)
    return quantized.reshape(x.shape), descale


def quantize(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hadamard: bool = True, seed: int | None = None,
             granularity: str = "block", cu_seqlens_q: torch.Tensor | None = None,
             cu_seqlens_k: torch.Tensor | None = None) -> Quantized:
    """FP8 inputs for :func:`flashattn.flash_attn_func` from q (batch, seqlen_q, nheads, head_dim) and k, v
    (batch, seqlen_k, nheads_k, head_dim) of any float dtype; or, with ``cu_seqlens_q`` and ``cu_seqlens_k``, for
    :func:`flashattn.flash_attn_varlen_func` from packed q (total_q, nheads, head_dim) and k, v (total_k, nheads_k,
    head_dim), one descale per sequence and kv head.

    ``hadamard``: rotate q and k first by the same random orthogonal matrix (random signs from ``seed``, then the
    Walsh-Hadamard transform; see the module docstring), which leaves q k^T unchanged and spreads outliers.
    ``granularity``: "block" (one descale per SCALE_BLOCK rows, the default for dense inputs) or "head" (one per
    batch and kv head; what :func:`flashattn.flash_attn_with_kvcache` takes, and packed inputs always get).
    """
    packed = cu_seqlens_q is not None or cu_seqlens_k is not None
    check_quantize_inputs(q, k, v, packed)
    check_quantize_options(hadamard, seed, granularity)
    if packed:
        check_cu_seqlens_pair(cu_seqlens_q, cu_seqlens_k, q.device)
        # their values as flash_attn_varlen_func checks them: where reading them costs no synchronization (CPU
        # tensors); the totals stand for max_seqlen (a bound of any valid cu_seqlens)
        resolve_packing(cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0], q.shape[0], k.shape[0])
    signs = random_signs(q.shape[-1], seed, q.device) if hadamard else None
    if not packed:
        return quantize_dense(q, k, v, signs, granularity)
    if hadamard:
        q, k = rotate(q, signs), rotate(k, signs)
    (q8, q_descale), (k8, k_descale), (v8, v_descale) = (
        quantize_packed(x, cu, k.shape[-2]) for x, cu in ((q, cu_seqlens_q), (k, cu_seqlens_k), (v, cu_seqlens_k)))
    return Quantized(q8, k8, v8, q_descale, k_descale, v_descale)


def check_quantize_inputs(q, k, v, packed: bool) -> None:
    """q, k, v as :func:`quantize` takes them: float tensors on q's device, q (batch, seqlen_q, nheads, head_dim) and
    k, v (batch, seqlen_k, nheads_k, head_dim) with nheads a multiple of nheads_k; packed, (total, heads, head_dim)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_quantize_input(name, x, packed)
        if x.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}, got {x.device}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if not packed and k.shape[0] != q.shape[0]:
        raise ValueError(f"k must have q's batch size {q.shape[0]}, got {k.shape[0]}")
    head_dim, nheads, nheads_k = q.shape[-1], q.shape[-2], k.shape[-2]
    if head_dim == 0:
        raise ValueError(f"q must have a head dim >= 1, got shape {tuple(q.shape)}")
    if k.shape[-1] != head_dim:
        raise ValueError(f"k and v must have q's head dim {head_dim}, got {k.shape[-1]}")
    if nheads == 0 or nheads_k == 0 or nheads % nheads_k != 0:
        raise ValueError(f"the number of query heads in q ({nheads}) must be a positive multiple of the number of "
                         f"key/value heads in k ({nheads_k}){transposed_hint(q, k)}")


def check_quantize_input(name: str, x, packed: bool) -> None:
    """One input of the quantizer: a float tensor (batch, seqlen, nheads, head_dim), or packed (total, nheads,
    head_dim)."""
    rank, layout = (3, PACKED) if packed else (4, "(batch, seqlen, nheads, headdim)")
    if not isinstance(x, torch.Tensor) or x.dim() != rank or not x.dtype.is_floating_point:
        got = f"{x.dtype} of shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{name} must be a {rank}-dim float tensor {layout}, got {got}")


def check_kv_heads(x: torch.Tensor, nheads_k) -> None:
    """``nheads_k`` of :func:`quantize_tensor` and :func:`quantize_packed`: a positive int dividing x's heads."""
    if isinstance(nheads_k, bool) or not isinstance(nheads_k, int) or nheads_k < 1 or x.shape[-2] % nheads_k:
        raise ValueError(f"nheads_k must be a positive int that divides x's {x.shape[-2]} heads, got {nheads_k!r}")
    if x.shape[-2] == 0 or x.shape[-1] == 0:
        raise ValueError(f"x must have heads and a head dim >= 1, got shape {tuple(x.shape)}")


def check_quantize_options(hadamard, seed, granularity) -> None:
    """The options of :func:`quantize` and of the trainable ``fp8.flash_attn_func``."""
    if granularity not in ("block", "head"):
        raise ValueError(f"granularity must be 'block' or 'head', got {granularity!r}")
    if not isinstance(hadamard, bool):
        raise TypeError(f"hadamard must be a bool, got {type(hadamard).__name__}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise TypeError(f"seed must be an int or None, got {type(seed).__name__}")
    if seed is not None and not -2**63 <= seed < 2**64:  # a 64-bit seed, signed or not (torch.manual_seed's range)
        raise ValueError(f"seed must be in [-2**63, 2**64), got {seed}")


def quantize_dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, signs: torch.Tensor | None,
                   granularity: str) -> Quantized:
    """:func:`quantize` of dense q, k, v, rotated by ``signs`` (None: not rotated): by the quantizer's kernels where
    :func:`kernels_quantize` (every step a launch, so that a launch plan can replay it), else in PyTorch."""
    if not kernels_quantize(q, k, v):
        if signs is not None:
            q, k = rotate(q, signs), rotate(k, signs)
        (q8, q_descale), (k8, k_descale), (v8, v_descale) = (
            quantize_tensor(x, k.shape[-2], granularity) for x in (q, k, v))
        return Quantized(q8, k8, v8, q_descale, k_descale, v_descale)
    from .launch.quantize_fp8 import quantize_rows, rotation_operands

    rotation = None
    if signs is not None:
        rotation = rotation_operands(signs, hadamard_pieces(q.shape[-1]), q.dtype, padded_head_dim(q.shape[-1]))
    (q8, q_descale), (k8, k_descale), (v8, v_descale) = (
        quantize_rows(x, r, k.shape[-2], SCALE_BLOCK, E4M3_MAX, granularity == "head", FP8_DTYPE)
        for x, r in ((q, rotation), (k, rotation), (v, None)))
    return Quantized(q8, k8, v8, q_descale, k_descale, v_descale)


def kernels_quantize(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether dense 16-bit q, k, v take the quantizer's kernels (``kernels/quantize_fp8.py``): on a GPU unless
    FLASHATTN_BACKEND=torch, on CPU tensors under the Triton interpreter; non-empty sequences."""
    if not all(x.dtype in (torch.bfloat16, torch.float16) and x.dtype == q.dtype for x in (q, k, v)):
        return False
    if q.shape[1] == 0 or k.shape[1] == 0 or q.shape[-1] > 256 or q.shape[2] % k.shape[2]:
        return False
    if q.is_cuda:
        return backend_override() != "torch"
    return backend_for_cpu_tensors() == "triton"


def round_to_e4m3(x: torch.Tensor) -> torch.Tensor:
    """x rounded to the nearest e4m3 value (saturating at E4M3_MAX), in x's dtype: what the kernel does to P."""
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(FP8_DTYPE).to(x.dtype)


def canonical_descales(descales: tuple, batch: int, nheads_k: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """(q, k, v) descales as (batch, nheads_k, blocks) float32 views: None becomes ones, a (batch, nheads_k) one
    gains a blocks dim of 1 (which the kernel reads with stride 0, at any block)."""
    ones = torch.ones(1, 1, 1, device=device).expand(batch, nheads_k, 1)
    views = [ones if d is None else d if d.dim() == 3 else d[:, :, None] for d in descales]
    return tuple(views)
