"""What the launchers share: kernel scalars, strides, the dense or packed layout, TMA descriptors, the GPU's size."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from ..backend import interpreting
from ..options import AttentionOptions
from ..validation import Packing
from . import mask_blocks

LOG2E = math.log2(math.e)


def kernel_scalars(opts: AttentionOptions, rng_state: torch.Tensor | None) -> dict:
    """Runtime scalars and constexpr flags shared by every kernel of one call."""
    if opts.softcap > 0:
        qk_scale, softcap_log2 = opts.softmax_scale / opts.softcap, opts.softcap * LOG2E
    else:
        qk_scale, softcap_log2 = opts.softmax_scale * LOG2E, 0.0
    seed, offset = (int(x) for x in rng_state.tolist()) if rng_state is not None else (0, 0)
    if opts.frame is not None:
        offset += opts.frame.dropout_offset()
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


def frame_scalars(opts: AttentionOptions, layout: Layout) -> dict:
    """The forward's and backward's position-frame scalars: the diagonal's shift and the dropout stream's lengths
    (``options.PositionFrame``; without a frame, the call's own lengths and no shift). Packed calls have no frame."""
    if opts.frame is None:
        return dict(diagonal_shift=0, dropout_seqlen_q=layout.lengths[0], dropout_seqlen_k=layout.lengths[1])
    assert not layout.is_varlen, "a position frame places a dense call"
    return dict(diagonal_shift=opts.frame.diagonal_shift(*layout.lengths), dropout_seqlen_q=opts.frame.seqlen_q,
                dropout_seqlen_k=opts.frame.seqlen_k)


def dot_flags(dtype: torch.dtype) -> dict:
    # fp32 inputs get exact fp32 products (not tf32) and compensated accumulators, to stay within
    # 2x of PyTorch's fp32 error. The interpreter's bf16 dot is wrong: there tiles are upcast first.
    return dict(
        UPCAST_DOT=interpreting() and dtype == torch.bfloat16,
        DOT_PRECISION="ieee" if dtype == torch.float32 else "tf32",
        COMPENSATED=dtype == torch.float32,
    )


def alibi_arguments(alibi_slopes: torch.Tensor | None, q: torch.Tensor) -> tuple[torch.Tensor, int, bool]:
    if alibi_slopes is None:
        return q, 0, False  # any pointer will do: the kernel never reads it
    return alibi_slopes, (alibi_slopes.stride(0) if alibi_slopes.dim() == 2 else 0), True


def mask_arguments(attn_mask: torch.Tensor | None, q: torch.Tensor, seqlen_k: int) -> dict:
    """The SDPA mask as the kernels read it: broadcast to (B, Hq, Sq, Sk) by stride-0 views, no copy."""
    if attn_mask is None:
        return dict(Mask=q, stride_mask_b=0, stride_mask_h=0, stride_mask_m=0, stride_mask_n=0,
                    HAS_MASK=False, MASK_IS_BOOL=False)
    batch, seqlen_q, nheads, _ = q.shape
    mask = attn_mask.expand(batch, nheads, seqlen_q, seqlen_k)
    is_bool = mask.dtype == torch.bool
    if is_bool:
        mask = mask.view(torch.uint8)  # same bytes; Triton loads it as integers
    return dict(Mask=mask, stride_mask_b=mask.stride(0), stride_mask_h=mask.stride(1),
                stride_mask_m=mask.stride(2), stride_mask_n=mask.stride(3), HAS_MASK=True, MASK_IS_BOOL=is_bool)


def block_map_arguments(attn_mask: torch.Tensor | None, q: torch.Tensor, seqlen_k: int,
                         *tiles: tuple[int, int, bool]) -> list[dict]:
    """Per kernel tiled ``(block_m, block_n, rows_are_keys)``: its block map of the mask's hidden tiles
    (``mask_blocks.py``), broadcast to (B, Hq, rows, 2 * columns + 1) by stride-0 views, no copy."""
    if attn_mask is None:
        return [dict(BlockMap=q, stride_map_b=0, stride_map_h=0, stride_map_row=0, HAS_BLOCK_MAP=False)
                for _ in tiles]
    batch, seqlen_q, nheads, _ = q.shape
    arguments = []
    for block_map in mask_blocks.block_maps(attn_mask, seqlen_q, seqlen_k, *tiles):
        block_map = block_map.expand(batch, nheads, *block_map.shape[2:])
        arguments.append(dict(BlockMap=block_map, stride_map_b=block_map.stride(0),
                              stride_map_h=block_map.stride(1), stride_map_row=block_map.stride(2),
                              HAS_BLOCK_MAP=True))
    return arguments


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def strides(x: torch.Tensor) -> tuple[int, int, int]:
    """(batch, token, head) strides; a packed (total, heads, dim) tensor has no batch stride (0)."""
    return (x.stride(0), x.stride(1), x.stride(2)) if x.dim() == 4 else (0, x.stride(0), x.stride(1))


@dataclass(frozen=True)
class Layout:
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
    def of(cls, q: torch.Tensor, k: torch.Tensor, packing: Packing | None) -> Layout:
        if packing is None:
            batch, seqlen_q = q.shape[:2]
            seqlen_k = k.shape[1]
            return cls(batch, (seqlen_q, seqlen_k), seqlen_q, seqlen_k, (q, q), (batch, q.shape[2], seqlen_q), False)
        total_q, total_k = q.shape[0], k.shape[0]
        return cls(packing.batch, (total_q, total_k), packing.max_seqlen_q, packing.max_seqlen_k,
                   (packing.cu_seqlens_q, packing.cu_seqlens_k), (q.shape[1], total_q), True)


def tma_compatible(*tensors: torch.Tensor) -> bool:
    """TMA descriptors need 16-byte aligned base addresses and 16-byte multiples as leading strides."""
    return all(x.data_ptr() % 16 == 0 and all(s * x.element_size() % 16 == 0 for s in x.stride()[:-1])
               for x in tensors)


def tma_workspace(size: int, alignment: int, stream) -> torch.Tensor:
    # device-side tensor descriptors (tl.make_tensor_descriptor) live in a global-memory workspace
    return torch.empty(size, dtype=torch.int8, device="cuda")


def tma_loads(wanted: bool, *tensors: torch.Tensor) -> bool:
    """Whether a kernel that asks for TMA loads (``wanted``) of ``tensors`` gets them: the tensors must suit
    descriptors. On a GPU this installs the descriptors' workspace allocator."""
    use = wanted and tma_compatible(*tensors)
    if use and tensors[0].is_cuda:
        import triton

        triton.set_allocator(tma_workspace)
    return use


def token_rows(x: torch.Tensor) -> int | None:
    """The stride between consecutive tokens when ``x`` (dense (B, S, H, D) or packed (total, H, D)) reads as
    one (tokens, H * D) matrix, heads side by side in each row; None when it does not."""
    head_dim = x.shape[-1]
    token_stride = x.stride(-3)
    if x.stride(-2) != head_dim and x.shape[-2] > 1:
        return None
    if token_stride < x.shape[-2] * head_dim and x.shape[-3] > 1:
        return None  # tokens overlap (a broadcast view): not rows of one matrix
    if x.dim() == 4 and x.stride(0) != x.shape[1] * token_stride and x.shape[0] > 1:
        return None
    return token_stride


@functools.cache
def tile_layout(block_rows: int, head_dim: int, dtype: torch.dtype, sequences: bool = False):
    """The shared-memory layout of one (block_rows, head_dim) tile (head_dim: its contiguous columns), or with
    ``sequences`` of the (1, block_rows, head_dim) box of a sequence descriptor: built once, as it costs about 6 us
    of host time, a third of a short forward call's descriptor work."""
    from triton.experimental.gluon import language as gl

    element = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float8_e4m3fn: gl.float8e4nv,
               torch.float32: gl.float32}[dtype]
    return gl.NVMMASharedLayout.get_default_for([1, block_rows, head_dim] if sequences else [block_rows, head_dim],
                                                element)


def rows_readable(x: torch.Tensor) -> bool:
    """Whether ``rows_descriptors`` can read ``x``: packed (total, H, D) as (tokens, H * D) rows (``token_rows``);
    dense (B, S, H, D) as (batch, seqlen, H * D), heads side by side in each token, the tokens of a sequence and the
    sequences apart, at any batch stride (a slice of longer sequences, such as a cache's first keys)."""
    if x.dim() != 4:
        return token_rows(x) is not None
    batch, seqlen, heads, head_dim = x.shape
    return ((x.stride(2) == head_dim or heads == 1) and (x.stride(1) >= heads * head_dim or seqlen == 1)
            and (x.stride(0) >= seqlen * x.stride(1) or batch == 1))


def token_count(x: torch.Tensor) -> int:
    """The tokens of dense (B, S, H, D) or packed (total, H, D) ``x``: the rows of its (tokens, H * D) reading."""
    return x.shape[0] * x.shape[1] if x.dim() == 4 else x.shape[0]


def token_descriptor(x: torch.Tensor, block_rows: int):
    """A host-side TMA descriptor of ``x`` as (tokens, heads * head_dim), one head's columns per block. The token
    stride is ``x.stride(-3)``: the callers checked ``token_rows(x)`` (``rows_readable`` for a packed ``x``)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    head_dim = x.shape[-1]
    return TensorDescriptor(x, [token_count(x), x.shape[-2] * head_dim], [x.stride(-3), 1], [block_rows, head_dim],
                            tile_layout(block_rows, head_dim, x.dtype))


def sequence_descriptor(x: torch.Tensor, block_rows: int):
    """A host-side TMA descriptor of dense (B, S, H, D) ``x`` as (batch, seqlen, heads * head_dim), one head's
    columns of one sequence per block. A box that runs past a sequence's last token (or starts before its first)
    reads zeros there, not the neighbouring sequence's rows, whose NaN or inf would reach a product as 0 x NaN
    however the scores are masked. The head stride is ``head_dim`` (``rows_readable(x)``)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    batch, seqlen, heads, head_dim = x.shape
    return TensorDescriptor(x, [batch, seqlen, heads * head_dim], [x.stride(0), x.stride(1), 1],
                            [1, block_rows, head_dim], tile_layout(block_rows, head_dim, x.dtype, sequences=True))


def rows_descriptors(*tiles: tuple[torch.Tensor, int]) -> list:
    """A descriptor for each (tensor, block rows) in ``tiles``: sequence descriptors for dense tensors, token
    descriptors for packed ones, where the kernels bound a sequence's rows themselves."""
    return [sequence_descriptor(x, rows) if x.dim() == 4 else token_descriptor(x, rows) for x, rows in tiles]


@functools.cache
def sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count



def cuda_index(device: torch.device) -> int:
    """The CUDA device's index (the current device for a bare "cuda")."""
    return device.index if device.index is not None else torch.cuda.current_device()


def processor_count(device: torch.device) -> int:
    """Streaming multiprocessors of the GPU; under the interpreter a small stand-in, so that the
    default heuristic splits there too and the tests exercise it."""
    if device.type != "cuda":
        return 4
    return sm_count(cuda_index(device))


def peak_memory_bandwidth(device: torch.device) -> float | None:
    """The GPU's peak memory bandwidth in bytes/s (double data rate: 2 x memory clock x bus width), or None where torch
    does not report the two (and off the GPU)."""
    if device.type != "cuda":
        return None
    return _peak_memory_bandwidth(cuda_index(device))


@functools.cache
def _peak_memory_bandwidth(index: int) -> float | None:
    properties = torch.cuda.get_device_properties(index)
    clock_khz, bus_bits = getattr(properties, "memory_clock_rate", 0), getattr(properties, "memory_bus_width", 0)
    return 2 * clock_khz * 1e3 * bus_bits / 8 if clock_khz and bus_bits else None

