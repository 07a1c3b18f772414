"""Custom ops: allocate outputs, pick the tile config, launch. The only place that launches kernels.

Each op is a ``torch.library.custom_op`` with a CPU implementation (blocked PyTorch, ``cpu.py``) and a
CUDA implementation (Triton), chosen by the dispatcher from the tensors' device, and a fake
implementation for ``torch.compile``. ``FLASHATTN_BACKEND=torch|triton`` overrides the choice: the
torch path runs on any device, and the Triton kernels run on CPU tensors under ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
from dataclasses import dataclass

import torch

from . import configs, cpu, iomodel, launcher, mask_blocks, masks
from .launcher import launch
from .options import AttentionOptions

LOG2E = math.log2(math.e)

SKIP_HIDDEN_TILES = True
"""Skip the tiles that an SDPA mask hides entirely (``mask_blocks.py``). False computes every tile, as
before: for measuring what skipping saves, and for tests that show the skipping happens."""


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


def backend_for_cpu_tensors() -> str:
    """'torch', or 'triton' where FLASHATTN_BACKEND=triton asks for the kernels on CPU tensors.

    Only Triton's interpreter runs kernels on CPU tensors; compiled for a GPU, a launch would be
    handed host pointers, so that case is refused here with what to change.
    """
    backend = backend_override() or "torch"
    if backend == "triton" and not interpreting():
        raise ValueError("FLASHATTN_BACKEND=triton got CPU tensors: the Triton kernels run on CPU tensors only "
                         "under Triton's interpreter (TRITON_INTERPRET=1, set before triton is imported). "
                         "Move the tensors to the GPU, or unset FLASHATTN_BACKEND for the PyTorch path.")
    return backend


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


def _mask_arguments(attn_mask: torch.Tensor | None, q: torch.Tensor, seqlen_k: int) -> dict:
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


def _block_map_arguments(attn_mask: torch.Tensor | None, q: torch.Tensor, seqlen_k: int,
                         *tiles: tuple[int, int, bool]) -> list[dict]:
    """Per kernel tiled ``(block_m, block_n, rows_are_keys)``: its block map of the mask's hidden tiles
    (``mask_blocks.py``), broadcast to (B, Hq, rows, 2 * columns + 1) by stride-0 views, no copy."""
    if attn_mask is None or not SKIP_HIDDEN_TILES:
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


def _tma_compatible(*tensors: torch.Tensor) -> bool:
    """TMA descriptors need 16-byte aligned base addresses and 16-byte multiples as leading strides."""
    return all(x.data_ptr() % 16 == 0 and all(s * x.element_size() % 16 == 0 for s in x.stride()[:-1])
               for x in tensors)


def _tma_workspace(size: int, alignment: int, stream) -> torch.Tensor:
    # device-side tensor descriptors (tl.make_tensor_descriptor) live in a global-memory workspace
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _tma_loads(wanted: bool, *tensors: torch.Tensor) -> bool:
    """Whether a kernel that asks for TMA loads (``wanted``) of ``tensors`` gets them: the tensors must suit
    descriptors. On a GPU this installs the descriptors' workspace allocator."""
    use = wanted and _tma_compatible(*tensors)
    if use and tensors[0].is_cuda:
        import triton

        triton.set_allocator(_tma_workspace)
    return use


def _paging_arguments(block_table: torch.Tensor | None, k: torch.Tensor, block_n: int) -> dict:
    """The paged-KV arguments of the forward kernel: none without a block table (the kernel's defaults)."""
    if block_table is None:
        return {}
    table = _last_dim_contiguous(block_table)
    num_pages, page_size = k.shape[:2]
    # the kernel cuts every sequence at pages_per_seq * page_size keys: an empty pool has room for none
    pages_per_seq = table.shape[1] if num_pages > 0 else 0
    return dict(BlockTable=table, stride_btb=table.stride(0), page_size=page_size, pages_per_seq=pages_per_seq,
                PAGED_KV=True, ONE_PAGE=page_size % block_n == 0)


def _triton_forward(q, k, v, alibi_slopes, rng_state, opts: AttentionOptions, attn_mask=None,
                    packing: Packing | None = None, block_table: torch.Tensor | None = None):
    """``block_table`` (varlen only): k and v are page pools (num_pages, page_size, Hk, D)."""
    from .kernels.forward import attention_forward_kernel

    q, k, v = (_last_dim_contiguous(x) for x in (q, k, v))
    nheads, head_dim = q.shape[-2:]
    nheads_k = k.shape[-2]
    layout = _Layout.of(q, k, packing)
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(layout.lse_shape, dtype=torch.float32, device=q.device)
    masked = opts.masked or attn_mask is not None
    fits_gluon = _warp_specialized_fits(q, k, v, opts, alibi_slopes, attn_mask, block_table)
    config = configs.tile_config("forward", head_dim, masked, q.dtype, q.device, interpreting(),
                                 attn_mask=attn_mask is not None, seqlen=min(layout.grid_q, layout.grid_k),
                                 warp_specialized=fits_gluon, packed=layout.is_varlen)
    if block_table is not None and config.tma:
        # a TMA descriptor spans one strided block of rows and cannot follow pages: paged K/V take pointer
        # loads, where a tile sized for TMA spills (hdim 128: 128 x 128 needs about 650 bytes of stack per
        # thread, ptxas for sm90; 128 x 64, the causal entry, 24)
        config = dataclasses.replace(config, block_n=min(config.block_n, 64), tma=False)
    if layout.grid_q == 0:
        return out, lse  # only empty sequences: nothing to compute, nothing to store
    if config.warp_specialized and fits_gluon:
        _warp_specialized_forward(q, k, v, out, lse, layout, config, opts)
        return out, lse
    use_tma = _tma_loads(config.tma, q, k, v, out)
    slopes, stride_alibi_b, has_alibi = _alibi_args(alibi_slopes, q)
    grid = (_cdiv(layout.grid_q, config.block_m), layout.batch * nheads)
    launch(
        attention_forward_kernel, grid,
        q, k, v, out, lse, slopes, *layout.cu_seqlens,
        *_strides(q), *_strides(k), *_strides(v), *_strides(out),
        stride_alibi_b,
        *layout.lengths, nheads, nheads // nheads_k,
        HEAD_DIM=head_dim, BLOCK_D=configs.padded_head_dim(head_dim),
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, HAS_ALIBI=has_alibi, IS_VARLEN=layout.is_varlen,
        USE_TMA=use_tma,
        DEFER_SCALE=opts.softcap == 0 and alibi_slopes is None and attn_mask is None and opts.softmax_scale > 0,
        **configs.launch_options(config),
        **_kernel_scalars(opts, rng_state), **_dot_flags(q.dtype), **_mask_arguments(attn_mask, q, layout.lengths[1]),
        **_block_map_arguments(attn_mask, q, layout.lengths[1], (config.block_m, config.block_n, False))[0],
        **_paging_arguments(block_table, k, config.block_n),
    )
    return out, lse


# the Gluon kernel's consumer warpgroups and loader warp: registers per thread (setmaxnreg), as FA3 splits them;
# by the number of consumers (the SM's 65,536 registers over 3 or 4 warpgroups)
WS_CONSUMER_REGISTERS = {2: 240, 3: 160}
WS_LOADER_REGISTERS = 24
DECODE_CONSUMER_REGISTERS = 152  # the second consumer warpgroup of a two-consumer Gluon decode program
# the shared memory one program of an sm90 kernel may take (227 KB)
WS_SHARED_BYTES = 227 * 1024
# the K and V bytes that the Gluon forward's programs in flight read together: a section of heads that fits
# well within L2 (50 MB on H100, 60 on H200), which is shared with Q, O and other traffic (FA3 sizes its
# L2 swizzle on 32 MB too)
WS_L2_SECTION_BYTES = 8 << 20


def _warp_specialized_fits(q, k, v, opts: AttentionOptions, alibi_slopes, attn_mask, block_table) -> bool:
    """Whether the warp-specialized Gluon forward (``kernels/forward_hopper.py``) computes this call: a causal
    or unmasked softmax of 16-bit inputs at head dim 64, 128 or 256 on an sm90 GPU, with each tensor readable as
    (tokens, heads * head_dim) rows by TMA. Everything else takes the Triton kernel."""
    head_dim = q.shape[-1]
    return (q.is_cuda and q.dtype in (torch.bfloat16, torch.float16)
            and head_dim in (64, 128, 256) and opts.dropout_p == 0 and opts.softcap == 0
            and opts.softmax_scale > 0  # the running max is taken over unscaled scores
            and opts.window_left < 0 and opts.window_right in (-1, 0)
            and alibi_slopes is None and attn_mask is None and block_table is None
            and k.numel() > 0  # a descriptor needs at least one row
            and configs.gpu_family(q.device) == "hopper" and not interpreting()
            and all(_token_rows(x) is not None for x in (q, k, v)) and _tma_compatible(q, k, v))


def _token_rows(x: torch.Tensor) -> int | None:
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
def _tile_layout(block_rows: int, head_dim: int, dtype: torch.dtype):
    """The shared-memory layout of one (block_rows, head_dim) tile: built once, as it costs about 6 us of host
    time, a third of a short forward call's descriptor work."""
    from triton.experimental.gluon import language as gl

    element = gl.bfloat16 if dtype == torch.bfloat16 else gl.float16
    return gl.NVMMASharedLayout.get_default_for([block_rows, head_dim], element)


def _token_descriptor(x: torch.Tensor, block_rows: int):
    """A host-side TMA descriptor of ``x`` as (tokens, heads * head_dim), one head's columns per block. The token
    stride is ``_token_rows(x)``, which ``_warp_specialized_fits`` checked before the call took the Gluon kernel."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    head_dim = x.shape[-1]
    tokens = x.shape[0] * x.shape[1] if x.dim() == 4 else x.shape[0]
    return TensorDescriptor(x, [tokens, x.shape[-2] * head_dim], [x.stride(-3), 1], [block_rows, head_dim],
                            _tile_layout(block_rows, head_dim, x.dtype))


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _warp_specialized_forward(q, k, v, out, lse, layout: _Layout, config: configs.TileConfig,
                              opts: AttentionOptions) -> None:
    from .kernels.forward_hopper import attention_forward_hopper_kernel

    head_dim = q.shape[-1]
    # a consumer warpgroup's 64 rows each
    tiles, plan = _tile_plan_arguments(q, k, lse, layout, 64 * _consumer_warpgroups(config))
    # persistent: one program per SM walks the tiles, its loader fetching the next tile's Q, K and V while the
    # consumers finish the last one
    programs = min(tiles, _sm_count(q.device.index)) if config.persistent else tiles
    constexprs = warp_specialized_constexprs(config, head_dim, opts.window_right == 0, layout.is_varlen)
    # the tiles taken beyond each program's first (forward_hopper._next_tile): a fresh zero for every call, so that
    # calls on different streams never share it
    tile_counter = launcher.zeros(1, torch.int32, q.device) if constexprs["DYNAMIC_TILES"] else None
    _, stride_om, stride_oh = _strides(out)
    launch(
        attention_forward_hopper_kernel, (programs,),
        _token_descriptor(q, 64), _token_descriptor(k, config.block_n),
        _token_descriptor(v, config.block_n), out, lse, *layout.cu_seqlens, tile_counter,
        stride_om, stride_oh, *plan, opts.softmax_scale * LOG2E, **constexprs, num_warps=4,
    )


def _tile_plan_arguments(q, k, lse, layout: _Layout, rows_per_tile: int) -> tuple[int, tuple]:
    """The tiles of the Gluon forward or dQ (``rows_per_tile`` query rows each) and the arguments from which both
    kernels' ``forward_hopper._tile_plan`` derives each tile: the LSE's (batch, head) strides ((batch, nheads,
    seqlen_q) dense, (nheads, total_q) varlen with no batch stride), the lengths, nheads, the GQA group size, the
    row tiles per (sequence, head), the (sequence, head) pairs and the pairs per L2 section."""
    nheads, head_dim = q.shape[-2:]
    row_tiles = _cdiv(layout.grid_q, rows_per_tile)
    batch_heads = layout.batch * nheads
    group_size = nheads // k.shape[-2]
    lse_strides = (lse.stride(0), lse.stride(1)) if lse.dim() == 3 else (0, lse.stride(0))
    sections = _heads_per_section(batch_heads, group_size, layout.grid_k * head_dim * k.element_size())
    return row_tiles * batch_heads, (*lse_strides, *layout.lengths, nheads, group_size, row_tiles, batch_heads,
                                     sections)


def _heads_per_section(batch_heads: int, group_size: int, kv_head_bytes: int) -> int:
    """How many (sequence, head) pairs the Gluon forward walks together (``_tile_plan``): as many as have K and V
    within ``WS_L2_SECTION_BYTES``, where ``kv_head_bytes`` is one K (or V) head of the longest sequence. The
    query heads of a GQA group are consecutive and share one K/V head."""
    kv_bytes_per_query_head = 2 * kv_head_bytes / group_size
    return max(1, min(batch_heads, int(WS_L2_SECTION_BYTES // max(kv_bytes_per_query_head, 1))))


def warp_specialized_constexprs(config: configs.TileConfig, head_dim: int, causal: bool, is_varlen: bool) -> dict:
    """The Gluon forward's compile-time arguments for ``config`` (also what benchmarks/sass_report.py compiles)."""
    consumers = _consumer_warpgroups(config)
    q_buffers = _forward_q_buffers(config, head_dim)
    return dict(HEAD_DIM=head_dim, BLOCK_N=config.block_n, NUM_STAGES=config.num_stages, CAUSAL=causal,
                IS_VARLEN=is_varlen, PINGPONG=config.pingpong, NUM_CONSUMERS=consumers,
                CONSUMER_REGISTERS=WS_CONSUMER_REGISTERS[consumers], LOADER_REGISTERS=WS_LOADER_REGISTERS,
                # a persistent grid hands out its tiles as programs free up (causal and packed tiles are unequal
                # work; equal ones gained 0-3.5% too, docs/perf-notes.md version 23)
                DYNAMIC_TILES=config.persistent,
                WIDE_STORES=_room_for_wide_stores(config, head_dim, q_buffers),
                Q_BUFFERS=q_buffers)


def _forward_q_buffers(config: configs.TileConfig, head_dim: int) -> int:
    """The Gluon forward's Q tiles a program holds: two on a persistent grid where shared memory has room for them
    beside the K/V ring (the next tile's Q is copied while this one is computed: +2-15% at 512-4k tokens, H200,
    docs/perf-notes.md version 23), else one. hdim 256 has no room for a second.

    Packed calls and keys shorter than one block took one from session 22 to version 29 for a fault found in version
    30: ptxas's, in the kernel's two key-block runs (forward_hopper._tile_key_blocks says which); with two Q tiles it
    read another tile's Q."""
    return 2 if config.persistent and _fits_shared_memory(config, head_dim, 2) else 1


def _room_for_wide_stores(config: configs.TileConfig, head_dim: int, row_tiles_held: int) -> bool:
    """Whether a Gluon forward or dQ program's shared memory leaves room to stage its result for 16-byte stores (at
    most a 64-row tile of each consumer) beside the K/V ring and the consumers' ``row_tiles_held`` 64-row tiles (the
    forward's Q buffers; the dQ's Q and dO). The forward's 3-stage 128-key tile at hdim 128 (224 KB) and its hdim-256
    tile (192 KB) leave none; they store from the wgmma layout."""
    return _fits_shared_memory(config, head_dim, row_tiles_held + 1)


def _fits_shared_memory(config: configs.TileConfig, head_dim: int, row_tiles: int) -> bool:
    """Whether ``row_tiles`` 64-row, 16-bit tiles of each consumer fit in a program's shared memory beside the K/V
    ring."""
    tile_bytes = 64 * head_dim * 2
    ring_bytes = config.num_stages * 2 * config.block_n * head_dim * 2
    return row_tiles * _consumer_warpgroups(config) * tile_bytes + ring_bytes <= WS_SHARED_BYTES


def _consumer_warpgroups(config: configs.TileConfig) -> int:
    return 3 if config.three_consumers else 2


def _warp_specialized_dkdv(q, k, v, dout, lse, delta, dk, dv, opts: AttentionOptions,
                           config: configs.TileConfig) -> None:
    """dK and dV (contiguous, k's shape) by a Gluon kernel (``config.key_slices``: the key-slice one); ``delta`` =
    rowsum(dO * O), lse's layout."""
    kernel, keys = warp_specialized_dkdv_kernel(config)
    batch, seqlen_q, nheads, head_dim = q.shape
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    key_blocks = _cdiv(seqlen_k, keys)
    launch(
        kernel, (key_blocks * batch * nheads_k,),
        _token_descriptor(q, config.block_m), _token_descriptor(k, keys), _token_descriptor(v, keys),
        _token_descriptor(dout, config.block_m),
        lse, delta, dk, dv, dk.stride(0), dk.stride(1), dk.stride(2),
        seqlen_q, seqlen_k, nheads, nheads_k, key_blocks, opts.softmax_scale, opts.softmax_scale * LOG2E,
        **warp_specialized_dkdv_constexprs(config, head_dim, opts.window_right == 0), num_warps=4,
    )


def _warp_specialized_dq_fits(q, k, v, dout, lse, opts: AttentionOptions, alibi_slopes, attn_mask) -> bool:
    """Whether the warp-specialized Gluon dQ kernel (``kernels/dq_hopper.py``) computes this backward's dQ: the
    forward's conditions (``_warp_specialized_fits``, dense or varlen), with dO in the same (tokens, heads *
    head_dim) rows and a contiguous LSE (delta takes its layout). The Gluon dK/dV kernel takes the same calls when
    they are dense batches."""
    return (q.numel() > 0 and lse.is_contiguous()
            and _warp_specialized_fits(q, k, v, opts, alibi_slopes, attn_mask, None)
            and _token_rows(dout) is not None and _tma_compatible(dout))


def _warp_specialized_dq(q, k, v, dout, lse, delta, dq, layout: _Layout, config: configs.TileConfig,
                         opts: AttentionOptions) -> None:
    """dQ (contiguous, q's shape) by the Gluon kernel: the forward's tiles (64 query rows on each of two or three
    consumer warpgroups) and its L2 sections; ``delta`` = rowsum(dO * O), lse's layout."""
    from .kernels.dq_hopper import dq_hopper_kernel

    head_dim = q.shape[-1]
    tiles, plan = _tile_plan_arguments(q, k, lse, layout, 64 * _consumer_warpgroups(config))
    _, stride_dqm, stride_dqh = _strides(dq)
    launch(
        dq_hopper_kernel, (tiles,),
        _token_descriptor(q, 64), _token_descriptor(k, config.block_n), _token_descriptor(v, config.block_n),
        _token_descriptor(dout, 64), dq, lse, delta, *layout.cu_seqlens,
        stride_dqm, stride_dqh, *plan, opts.softmax_scale, opts.softmax_scale * LOG2E,
        **warp_specialized_dq_constexprs(config, head_dim, opts.window_right == 0, layout.is_varlen), num_warps=4,
    )


def warp_specialized_dq_constexprs(config: configs.TileConfig, head_dim: int, causal: bool, is_varlen: bool) -> dict:
    """The Gluon dQ kernel's compile-time arguments for ``config`` (also what benchmarks/sass_report.py compiles)."""
    consumers = _consumer_warpgroups(config)
    return dict(HEAD_DIM=head_dim, BLOCK_N=config.block_n, NUM_STAGES=config.num_stages, CAUSAL=causal,
                IS_VARLEN=is_varlen, NUM_CONSUMERS=consumers, CONSUMER_REGISTERS=WS_CONSUMER_REGISTERS[consumers],
                LOADER_REGISTERS=WS_LOADER_REGISTERS, WIDE_STORES=_room_for_wide_stores(config, head_dim, 2))


def warp_specialized_dkdv_kernel(config: configs.TileConfig):
    """The Gluon dK/dV kernel of ``config`` and its keys a program: the key-slice kernel (128 keys, 64 on each
    warpgroup) or the gradient-split one (``config.block_n``)."""
    from .kernels.backward_hopper import KEY_SLICE_PROGRAM_KEYS, dkdv_hopper_kernel, dkdv_key_slices_kernel

    if config.key_slices:
        return dkdv_key_slices_kernel, KEY_SLICE_PROGRAM_KEYS.value
    return dkdv_hopper_kernel, config.block_n


def warp_specialized_dkdv_constexprs(config: configs.TileConfig, head_dim: int, causal: bool) -> dict:
    """The Gluon dK/dV kernel's compile-time arguments for ``config`` (also what benchmarks/sass_report.py
    compiles): its two consumer warpgroups take the forward consumers' registers."""
    constexprs = dict(HEAD_DIM=head_dim, BLOCK_M=config.block_m, NUM_STAGES=config.num_stages, CAUSAL=causal,
                      CONSUMER_REGISTERS=WS_CONSUMER_REGISTERS[2], LOADER_REGISTERS=WS_LOADER_REGISTERS)
    if not config.key_slices:  # the key-slice kernel's keys a program are fixed
        constexprs["BLOCK_N"] = config.block_n
    return constexprs


def dkdv_compilable(config: configs.TileConfig, seqlen_q: int) -> configs.TileConfig:
    """``config``, or its one-loop form where ptxas cannot compile the peeled one. Triton specializes an integer
    argument equal to 1 as a constant, and ptxas (CUDA 12.8, Triton 3.6's) dies with SIGSEGV on the peeled
    causal dK/dV kernel with seqlen_q = 1 (the hdim-64 table entry; tests/test_sm90_compile.py checks it)."""
    if config.peel_diagonal and seqlen_q == 1:
        return dataclasses.replace(config, peel_diagonal=False)
    return config


def _dkdv_passes(config: configs.TileConfig) -> tuple[dict, ...]:
    """The dK/dV kernel's launches: one for both gradients, or (``split_dkdv``) a dV pass, then a dK pass,
    each with one accumulator and the keys along its tile's rows."""
    loop = dict(MASK_EVERY_BLOCK=config.mask_every_block, PEEL_DIAGONAL=config.peel_diagonal)
    if not config.split_dkdv:
        return (dict(**loop, KEY_ROWS=config.key_rows),)
    loop["KEY_ROWS"] = True
    return (dict(COMPUTE_DK=False, **loop), dict(COMPUTE_DV=False, **loop))


CONCURRENT_GRADIENTS = os.environ.get("FLASHATTN_CONCURRENT_GRADIENTS", "1") != "0"
"""Run the backward's dK/dV and dQ kernels side by side on two CUDA streams (``_GradientStreams``) when the call is
long enough (``CONCURRENT_GRADIENTS_MIN_FLOPS``). False runs them one after the other on the current stream: for
measuring what the overlap gains."""
CONCURRENT_GRADIENTS_MIN_FLOPS = 2e11
"""The backward's FLOPs (the FlashAttention count) from which the two streams are used: about 0.4 ms of kernels on
an H100/H200. The fork and join add host time to every call (hdim 128 causal 512 on an H200: 321 against 387 us a
backward called directly), and shorter calls, whose kernels take about as long as the host takes to issue them,
have little to gain (docs/perf-notes.md, version 16)."""


def _gradient_streams_pay(q: torch.Tensor, layout: _Layout, nheads_k: int, opts: AttentionOptions) -> bool:
    """Whether this backward takes the two gradient streams: its FLOPs by the convention (``iomodel``), over the
    longest sequences for packed ones (an upper bound, as for windows)."""
    if not (CONCURRENT_GRADIENTS and q.is_cuda):
        return False
    nheads, head_dim = q.shape[-2:]
    problem = iomodel.AttentionProblem(layout.batch, layout.grid_q, layout.grid_k, nheads, nheads_k, head_dim,
                                       q.element_size(), opts.window_right == 0)
    return iomodel.backward_flops(problem) >= CONCURRENT_GRADIENTS_MIN_FLOPS


@functools.cache
def _side_stream(device_index: int) -> torch.cuda.Stream:
    """One second stream per device, made once: creating a stream costs host time on every call."""
    return torch.cuda.Stream(device_index)


class _GradientStreams:
    """Made after the delta kernel's launch: ``first()`` sends the dK/dV launches to a second stream that starts
    after the delta kernel, the dQ kernel follows on the current stream, and ``join()`` makes the current stream
    wait for both. The GPU then fills the last, partial wave of the dK/dV kernel's grid with the dQ kernel's
    programs instead of idling until it ends (docs/perf-notes.md, version 16). Both streams have the same
    priority: a more urgent dK/dV stream lost 1.7% at hdim 64 causal 16k, where equal ones were level.

    Every tensor here was allocated on the current stream and is used on the second one only before the join;
    work the caller queues afterwards is ordered after it, so the caching allocator needs no ``record_stream``.
    CUDA graph capture takes the fork and join as they are."""

    def __init__(self, device: torch.device):
        self.main = torch.cuda.current_stream(device)
        self.side = _side_stream(self.main.device_index)
        self.side.wait_stream(self.main)

    def first(self):
        return torch.cuda.stream(self.side)

    def join(self):
        self.main.wait_stream(self.side)


def _triton_backward(dout, q, k, v, out, lse, alibi_slopes, rng_state, opts: AttentionOptions, attn_mask=None,
                     mask_needs_grad=False, packing: Packing | None = None):
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
        return dq.zero_(), dk.zero_(), dv.zero_(), q.new_empty(0)

    # delta = rowsum(dO * O) is per query row: packed tokens are one batch of total_q rows to it
    delta = torch.empty_like(lse)
    delta_block = 16 if interpret else 64
    delta_rows, delta_batch = (layout.lengths[0], 1) if packing is not None else (layout.grid_q, batch)
    launch(
        delta_kernel, (_cdiv(delta_rows, delta_block), delta_batch * nheads),
        out, dout, delta, *_strides(out), *_strides(dout),
        delta_rows, nheads, HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_M=delta_block,
    )

    slopes, stride_alibi_b, has_alibi = _alibi_args(alibi_slopes, q)
    shared = dict(
        softmax_scale=opts.softmax_scale, HEAD_DIM=head_dim, BLOCK_D=block_d, HAS_ALIBI=has_alibi,
        IS_VARLEN=layout.is_varlen, **_kernel_scalars(opts, rng_state), **_dot_flags(q.dtype),
        **_mask_arguments(attn_mask, q, layout.lengths[1]),
    )
    has_mask = attn_mask is not None
    masked = opts.masked or has_mask
    # The mask's gradient is dS, (B, Hq, Sq, Sk) in float32: O(N^2) memory, only when it is asked for.
    dmask = (torch.zeros(batch, nheads, *layout.lengths, dtype=torch.float32, device=q.device)
             if mask_needs_grad else None)
    inputs = (q, k, v, dout, lse, delta)
    input_strides = (*_strides(q), *_strides(k), *_strides(v), *_strides(dout))
    shorter = min(layout.grid_q, layout.grid_k)
    fits_gluon_dq = _warp_specialized_dq_fits(q, k, v, dout, lse, opts, alibi_slopes, attn_mask)
    fits_gluon = packing is None and fits_gluon_dq  # the Gluon dK/dV takes dense batches only
    dkdv_config = dkdv_compilable(
        configs.tile_config("dkdv", head_dim, masked, q.dtype, q.device, interpret, attn_mask=has_mask,
                            seqlen=shorter, warp_specialized=fits_gluon), layout.lengths[0])
    dq_config = configs.tile_config("dq", head_dim, masked, q.dtype, q.device, interpret, attn_mask=has_mask,
                                    seqlen=shorter, warp_specialized=fits_gluon_dq)
    dkdv_map, dq_map = _block_map_arguments(attn_mask, q, layout.lengths[1],
                                            (dkdv_config.block_m, dkdv_config.block_n, True),
                                            (dq_config.block_m, dq_config.block_n, False))
    # the backward's fp32 keeps pointer loads: with TMA the hdim-256 key-row tile asked for 256 KB of shared
    # memory (H200)
    half = q.dtype != torch.float32
    dq_tma = _tma_loads(dq_config.tma and half, k, v)
    # dK/dV and dQ both read only the inputs and delta, so they may run side by side
    gradient_streams = _GradientStreams(q.device) if _gradient_streams_pay(q, layout, nheads_k, opts) else None
    with gradient_streams.first() if gradient_streams else contextlib.nullcontext():
        if dkdv_config.warp_specialized and fits_gluon:
            _warp_specialized_dkdv(q, k, v, dout, lse, delta, dk, dv, opts, dkdv_config)
        else:
            dkdv_tma = _tma_loads(dkdv_config.tma and half, q, dout)
            for gradients in _dkdv_passes(dkdv_config):
                launch(
                    dkdv_kernel, (_cdiv(layout.grid_k, dkdv_config.block_n), batch * nheads_k),
                    *inputs, dk, dv, slopes, *layout.cu_seqlens, *input_strides, *_strides(dk), *_strides(dv),
                    stride_alibi_b, *layout.lengths, nheads, nheads_k, nheads // nheads_k,
                    BLOCK_M=dkdv_config.block_m, BLOCK_N=dkdv_config.block_n, USE_TMA=dkdv_tma,
                    **configs.launch_options(dkdv_config), **shared, **dkdv_map, **gradients,
                )
    if dq_config.warp_specialized and fits_gluon_dq:
        _warp_specialized_dq(q, k, v, dout, lse, delta, dq, layout, dq_config, opts)
    else:
        launch(
            dq_kernel, (_cdiv(layout.grid_q, dq_config.block_m), batch * nheads),
            *inputs, dq, slopes, *layout.cu_seqlens, *input_strides, *_strides(dq),
            stride_alibi_b, *layout.lengths, nheads, nheads // nheads_k,
            BLOCK_M=dq_config.block_m, BLOCK_N=dq_config.block_n,
            **configs.launch_options(dq_config),
            DMask=dmask if mask_needs_grad else q, MASK_GRAD=mask_needs_grad, USE_TMA=dq_tma, **shared, **dq_map,
        )
    if gradient_streams:
        gradient_streams.join()
    # no SDPA mask on the Gluon path (its kernels take none), so no mask gradient, which only the Triton dQ writes
    if dmask is None:
        return dq, dk, dv, q.new_empty(0)
    return dq, dk, dv, masks.sum_to_shape(dmask, attn_mask.shape).to(attn_mask.dtype)


LAUNCH_PLANS = os.environ.get("FLASHATTN_LAUNCH_PLANS", "1") != "0"
"""Replay a dense call's launches from its recorded plan (``launcher.planned``) when a call of the same signature
came before: the choice of kernels, tiles and streams, the descriptors and the launch arguments are then not worked
out again. A short call spends most of its host time there: an H200 host took 110-150 us to issue a 512-token
forward whose kernel ran for about 150 (docs/perf-notes.md, version 17). False: every call takes its own path.
The key holds the switches above and the forced tiles, not the tables or other module constants: after patching one,
call ``launcher.clear_plans()``."""


def _plannable(inputs: tuple, alibi_slopes, rng_state, attn_mask=None) -> bool:
    """Whether a CUDA call may take a launch plan: no ALiBi, dropout or SDPA mask (their values or random state
    are not in the key), and inputs the kernels read in place (a last dimension of stride 1: otherwise the call
    copies them, which a replay would not). None stands for an absent optional input."""
    return (LAUNCH_PLANS and alibi_slopes is None and rng_state is None and attn_mask is None
            and all(x is None or x.stride(-1) == 1 for x in inputs))


def planned(phase: str, inputs: tuple, options, call, switches: tuple = ()):
    """``call()`` (the ``phase`` op's own path on ``inputs``) through its launch plan. The key is what decides every
    launch of the call: the options (the op's scalars), the inputs' shapes, strides, dtypes, devices and 16-byte
    alignment (None for an absent one), the current device, and the switches and forced tiles the call reads
    (``switches``: the caller's own, beside this module's)."""
    from triton import knobs

    key = (phase, options, *(None if x is None else (x.shape, x.stride(), x.dtype, x.get_device(),
                                                     x.data_ptr() % 16 == 0) for x in inputs),
           torch.cuda.current_device(), CONCURRENT_GRADIENTS, CONCURRENT_GRADIENTS_MIN_FLOPS,
           configs.forced_configs(), knobs.runtime.debug, knobs.compilation.instrumentation_mode, switches)
    return launcher.planned(key, inputs, call, _GradientStreams, _tma_workspace)


# ---------------------------------------------------------------------------------------------
# The custom ops. Options arrive unpacked (custom ops take only tensors and scalars).
# ---------------------------------------------------------------------------------------------

# Eager calls on plain CUDA tensors go straight to the op's CUDA implementation: the dispatcher's
# custom-op layer (its autograd wrapper, alias checks and dynamo guard) adds host time to every call,
# and at short sequences the GPU waits on the host (docs/perf-notes.md, version 7). Under torch.compile
# or export, for tensor subclasses (fake, functional, DTensor), and where an input requires grad with grad
# mode on (outside an autograd.Function's forward and backward: the forward-only kvcache op must still refuse
# a backward), the op is called as registered. A decode step called with grad mode on and no input that
# requires grad took 36 us more host time through the registered op (H200, docs/perf-notes.md, version 18).
DIRECT_EAGER_CALLS = os.environ.get("FLASHATTN_DIRECT_EAGER_CALLS", "1") != "0"


def eager_call(op, cuda_impl, *args):
    """``op(*args)``, through ``cuda_impl`` directly when that is the implementation it would reach."""
    first = args[0]
    if (DIRECT_EAGER_CALLS and type(first) is torch.Tensor and first.is_cuda
            and (not torch.is_grad_enabled() or not any(isinstance(x, torch.Tensor) and x.requires_grad for x in args))
            and not torch.compiler.is_compiling()):
        return cuda_impl(*args)
    return op(*args)


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
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) for q (B, Sq, Hq, D), k/v (B, Sk, Hk, D); lse is float32 (B, Hq, Sq), natural log.

    ``attn_mask``: an SDPA mask (bool: True = take part; float: added to the scores) of 4 dims
    broadcastable to (B, Hq, Sq, Sk).
    """
    opts = _options(softmax_scale, window_left, window_right, softcap, dropout_p)
    if backend_for_cpu_tensors() == "triton":
        return _triton_forward(q, k, v, alibi_slopes, rng_state, opts, attn_mask)
    return cpu.forward(q, k, v, opts, alibi_slopes, rng_state, attn_mask)


@attention_forward.register_kernel("cuda")
def attention_forward_cuda(q, k, v, alibi_slopes, rng_state, softmax_scale, window_left, window_right,
                           softcap, dropout_p, attn_mask=None):
    opts = _options(softmax_scale, window_left, window_right, softcap, dropout_p)
    if backend_override() == "torch":
        return cpu.forward(q, k, v, opts, alibi_slopes, rng_state, attn_mask)
    if _plannable((q, k, v), alibi_slopes, rng_state, attn_mask):
        return planned("forward", (q, k, v), opts, lambda: _triton_forward(q, k, v, None, None, opts))
    return _triton_forward(q, k, v, alibi_slopes, rng_state, opts, attn_mask)


@attention_forward.register_fake
def _attention_forward_fake(q, k, v, alibi_slopes, rng_state, softmax_scale, window_left, window_right,
                            softcap, dropout_p, attn_mask=None):
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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, dmask), recomputed from the saved log-sum-exp; dk/dv are summed over each GQA group.

    dmask is the gradient of a float ``attn_mask`` (its shape and dtype) when ``mask_needs_grad``,
    else an empty tensor.
    """
    opts = _options(softmax_scale, window_left, window_right, softcap, dropout_p)
    if backend_for_cpu_tensors() == "triton":
        return _triton_backward(dout, q, k, v, out, lse, alibi_slopes, rng_state, opts, attn_mask, mask_needs_grad)
    return cpu.backward(dout, q, k, v, out, lse, opts, alibi_slopes, rng_state, attn_mask, mask_needs_grad)


@attention_backward.register_kernel("cuda")
def attention_backward_cuda(dout, q, k, v, out, lse, alibi_slopes, rng_state, softmax_scale, window_left,
                            window_right, softcap, dropout_p, attn_mask=None, mask_needs_grad=False):
    opts = _options(softmax_scale, window_left, window_right, softcap, dropout_p)
    if backend_override() == "torch":
        return cpu.backward(dout, q, k, v, out, lse, opts, alibi_slopes, rng_state, attn_mask, mask_needs_grad)
    if _plannable((dout, q, k, v, out, lse), alibi_slopes, rng_state, attn_mask):
        return planned("backward", (dout, q, k, v, out, lse), opts,
                       lambda: _triton_backward(dout, q, k, v, out, lse, None, None, opts))
    return _triton_backward(dout, q, k, v, out, lse, alibi_slopes, rng_state, opts, attn_mask, mask_needs_grad)


@attention_backward.register_fake
def _attention_backward_fake(dout, q, k, v, out, lse, alibi_slopes, rng_state, softmax_scale, window_left,
                             window_right, softcap, dropout_p, attn_mask=None, mask_needs_grad=False):
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            torch.empty_like(k, memory_format=torch.contiguous_format),
            torch.empty_like(v, memory_format=torch.contiguous_format),
            attn_mask.new_empty(attn_mask.shape) if mask_needs_grad else q.new_empty(0))


def op_arguments(opts: AttentionOptions) -> tuple[float, int, int, float, float]:
    """The scalar tail of both ops' argument lists, in their order."""
    return opts.softmax_scale, opts.window_left, opts.window_right, opts.softcap, opts.dropout_p



# ---------------------------------------------------------------------------------------------
# Varlen (packed sequences): q (total_q, Hq, D), k/v (total_k, Hk, D), cu_seqlens int32 (batch + 1,).
# ---------------------------------------------------------------------------------------------

DERIVE_MAX_SEQLEN = -1
"""A max_seqlen the caller gave as a tensor: the launcher takes the exact maximum from cu_seqlens."""


def _varlen_plannable(inputs: tuple, max_seqlen_q: int, max_seqlen_k: int, alibi_slopes, rng_state) -> bool:
    """Whether a packed call may take a launch plan (``_plannable``): only with both max lengths given as ints and
    cu_seqlens on the GPU. A length to derive, like cu_seqlens on the CPU, is read on the host (and checked), and it
    sizes the grid, so it cannot be keyed."""
    return (DERIVE_MAX_SEQLEN not in (max_seqlen_q, max_seqlen_k) and all(x is None or x.is_cuda for x in inputs)
            and _plannable(inputs, alibi_slopes, rng_state))


def _check_cu_seqlens(name: str, cu_seqlens: list[int], total: int | None, total_name: str) -> int:
    """Check one host copy of cu_seqlens; return its longest sequence. ``total`` None: any end (paged keys)."""
    if cu_seqlens[0] != 0:
        raise ValueError(f"{name} must start at 0, got {cu_seqlens[0]}")
    lengths = [end - start for start, end in zip(cu_seqlens, cu_seqlens[1:], strict=False)]
    for b, length in enumerate(lengths):
        if length < 0:
            raise ValueError(f"{name} must be non-decreasing (sequence lengths >= 0), but sequence {b} goes "
                             f"from {cu_seqlens[b]} to {cu_seqlens[b + 1]}")
    if total is not None and cu_seqlens[-1] != total:
        raise ValueError(f"{name} must end at the number of tokens, {total_name} = {total}, "
                         f"got {cu_seqlens[-1]}")
    return max(lengths)


def resolve_packing(cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, total_q: int, total_k: int | None,
                    max_seqlen_q: int, max_seqlen_k: int, need_host: bool = False,
                    ) -> tuple[Packing, list[int] | None, list[int] | None]:
    """Packing for the kernels, plus host copies of cu_seqlens where they were read.

    ``total_k`` None: the keys are paged, not packed, and cu_seqlens_k may end anywhere.

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


def check_block_table(block_table: torch.Tensor, cu_seqlens_k: list[int], num_pages: int, page_size: int,
                      read_entries: bool) -> None:
    """Refuse key lengths that the block table cannot hold, and (``read_entries``) page indices outside the
    pool among the pages the sequences use: the rest of a row is padding and may hold anything.

    ``cu_seqlens_k`` is the host copy. Reading the entries of a GPU table synchronizes: the caller asks for
    it where that costs nothing (a CPU table) or happens anyway (the torch path gathers through the table).
    """
    lengths = torch.tensor(cu_seqlens_k).diff()
    capacity = block_table.shape[1] * page_size
    longest = int(lengths.max())
    if longest > capacity:
        b = int(lengths.argmax())
        raise ValueError(f"cu_seqlens_k gives sequence {b} {longest} keys, more than block_table can hold: "
                         f"block_table.shape[1] * page_size = {block_table.shape[1]} * {page_size} = {capacity}")
    if not read_entries:
        return
    pages_used = (lengths + page_size - 1) // page_size
    used = torch.arange(block_table.shape[1]) < pages_used.view(-1, 1)
    block_table = block_table.cpu()
    bad = used & ((block_table < 0) | (block_table >= num_pages))
    if bad.any():
        b, column = (int(i) for i in bad.nonzero()[0])
        raise ValueError(f"block_table[{b}, {column}] = {int(block_table[b, column])} is not a page of k and v: "
                         f"the pages a sequence uses must lie in [0, {num_pages}) (k.shape[0])")


def _varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes, rng_state,
                    opts: AttentionOptions, backend: str, block_table: torch.Tensor | None = None):
    paged = block_table is not None
    packing, host_q, host_k = resolve_packing(cu_seqlens_q, cu_seqlens_k, q.shape[0], None if paged else k.shape[0],
                                              max_seqlen_q, max_seqlen_k, need_host=backend == "torch")
    if paged and host_k is not None:
        read_entries = block_table.device.type == "cpu" or backend == "torch"
        check_block_table(block_table, host_k, k.shape[0], k.shape[1], read_entries)
    if backend == "torch":
        return cpu.varlen_forward(q, k, v, host_q, host_k, opts, alibi_slopes, rng_state, block_table)
    return _triton_forward(q, k, v, alibi_slopes, rng_state, opts, packing=packing, block_table=block_table)


def _varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes,
                     rng_state, opts: AttentionOptions, backend: str):
    packing, host_q, host_k = resolve_packing(cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0], max_seqlen_q,
                                              max_seqlen_k, need_host=backend == "torch")
    if backend == "torch":
        return cpu.varlen_backward(dout, q, k, v, out, lse, host_q, host_k, opts, alibi_slopes, rng_state)
    dq, dk, dv, _ = _triton_backward(dout, q, k, v, out, lse, alibi_slopes, rng_state, opts, packing=packing)
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
    opts = _options(softmax_scale, window_left, window_right, softcap, dropout_p)
    return _varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes,
                           rng_state, opts, backend_for_cpu_tensors(), block_table)


@varlen_attention_forward.register_kernel("cuda")
def varlen_attention_forward_cuda(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes,
                                  rng_state, softmax_scale, window_left, window_right, softcap, dropout_p,
                                  block_table=None):
    opts = _options(softmax_scale, window_left, window_right, softcap, dropout_p)
    backend = backend_override() or "triton"
    inputs = (q, k, v, cu_seqlens_q, cu_seqlens_k, block_table)
    if backend == "triton" and _varlen_plannable(inputs, max_seqlen_q, max_seqlen_k, alibi_slopes, rng_state):
        return planned("varlen_forward", inputs, (opts, max_seqlen_q, max_seqlen_k), lambda: _varlen_forward(
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
    opts = _options(softmax_scale, window_left, window_right, softcap, dropout_p)
    return _varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                            alibi_slopes, rng_state, opts, backend_for_cpu_tensors())


@varlen_attention_backward.register_kernel("cuda")
def varlen_attention_backward_cuda(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                   alibi_slopes, rng_state, softmax_scale, window_left, window_right, softcap,
                                   dropout_p):
    opts = _options(softmax_scale, window_left, window_right, softcap, dropout_p)
    backend = backend_override() or "triton"
    inputs = (dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k)
    if backend == "triton" and _varlen_plannable(inputs, max_seqlen_q, max_seqlen_k, alibi_slopes, rng_state):
        return planned("varlen_backward", inputs, (opts, max_seqlen_q, max_seqlen_k), lambda: _varlen_backward(
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
