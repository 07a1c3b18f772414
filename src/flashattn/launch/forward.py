"""The forward's launches: the Triton kernel for every call, the Hopper kernel for the calls it covers on sm90."""

from __future__ import annotations

import torch

from .. import configs
from ..backend import interpreting
from ..options import AttentionOptions
from ..validation import Packing
from . import launcher
from .common import (
    LOG2E,
    Layout,
    alibi_arguments,
    block_map_arguments,
    cdiv,
    dot_flags,
    frame_scalars,
    kernel_scalars,
    last_dim_contiguous,
    mask_arguments,
    rows_descriptors,
    rows_readable,
    sm_count,
    strides,
    tma_compatible,
    token_count,
    token_rows,
)
from .launcher import launch


def _paging_arguments(block_table: torch.Tensor | None, k: torch.Tensor, block_n: int) -> dict:
    """The paged-KV arguments of the forward kernel: none without a block table (the kernel's defaults)."""
    if block_table is None:
        return {}
    table = last_dim_contiguous(block_table)
    num_pages, page_size = k.shape[:2]
    # the kernel cuts every sequence at pages_per_seq * page_size keys: an empty pool has room for none
    pages_per_seq = table.shape[1] if num_pages > 0 else 0
    return dict(BlockTable=table, stride_btb=table.stride(0), page_size=page_size, pages_per_seq=pages_per_seq,
                PAGED_KV=True, ONE_PAGE=page_size % block_n == 0)


def launch_forward(q, k, v, alibi_slopes, rng_state, opts: AttentionOptions, attn_mask=None,
                    packing: Packing | None = None, block_table: torch.Tensor | None = None):
    """``block_table`` (varlen only): k and v are page pools (num_pages, page_size, Hk, D)."""
    from ..kernels.forward import attention_forward_kernel

    q, k, v = (last_dim_contiguous(x) for x in (q, k, v))
    nheads, head_dim = q.shape[-2:]
    nheads_k = k.shape[-2]
    layout = Layout.of(q, k, packing)
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(layout.lse_shape, dtype=torch.float32, device=q.device)
    masked = opts.masked or attn_mask is not None
    fits_hopper = hopper_forward_fits(q, k, v, opts, alibi_slopes, attn_mask, block_table)
    config = configs.tile_config("forward", head_dim, masked, q.dtype, q.device, interpreting(),
                                 attn_mask=attn_mask is not None, seqlen=min(layout.grid_q, layout.grid_k),
                                 hopper=fits_hopper, packed=layout.is_varlen)
    if block_table is not None:
        config = configs.paged_forward(config)
    if layout.grid_q == 0:
        return out, lse  # only empty sequences: nothing to compute, nothing to store
    if config.hopper and fits_hopper:
        _hopper_forward(q, k, v, out, lse, layout, config, opts)
        return out, lse
    # descriptors over the sequences or the tokens (_qkv_descriptors): no pages
    use_tma = (config.tma and block_table is None and tma_compatible(q, k, v)
               and all(_descriptor_readable(x) for x in (q, k, v)))
    slopes, stride_alibi_b, has_alibi = alibi_arguments(alibi_slopes, q)
    grid = (cdiv(layout.grid_q, config.block_m), layout.batch * nheads)
    launch(
        attention_forward_kernel, grid,
        q, k, v, out, lse, slopes, *layout.cu_seqlens,
        *strides(q), *strides(k), *strides(v), *strides(out),
        stride_alibi_b,
        *layout.lengths, nheads, nheads // nheads_k,
        HEAD_DIM=head_dim, BLOCK_D=configs.padded_head_dim(head_dim),
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, HAS_ALIBI=has_alibi, IS_VARLEN=layout.is_varlen,
        USE_TMA=use_tma,
        DEFER_SCALE=opts.softcap == 0 and alibi_slopes is None and attn_mask is None and opts.softmax_scale > 0,
        **configs.launch_options(config),
        **kernel_scalars(opts, rng_state), **frame_scalars(opts, layout), **dot_flags(q.dtype),
        **mask_arguments(attn_mask, q, layout.lengths[1]),
        **block_map_arguments(attn_mask, q, layout.lengths[1], (config.block_m, config.block_n, False))[0],
        **_paging_arguments(block_table, k, config.block_n),
        **(_qkv_descriptors(q, k, v, config) if use_tma else {}),
    )
    return out, lse


def _reads_sequences(x: torch.Tensor) -> bool:
    """Whether the Triton tile reads ``x`` through (batch, seqlen, heads * head dim) descriptors: dense calls whose
    head dim needs no padding (``_qkv_descriptors``)."""
    return x.dim() == 4 and configs.padded_head_dim(x.shape[-1]) == x.shape[-1]


def _descriptor_readable(x: torch.Tensor) -> bool:
    return rows_readable(x) if _reads_sequences(x) else token_rows(x) is not None


def _qkv_descriptors(q, k, v, config: configs.TileConfig) -> dict:
    """Host-side TMA descriptors of q, k and v, a block of one head's rows each: encoded once a launch, where
    descriptors that the kernel built would cost every program their encoding. Dense calls whose head dim needs no
    padding: over (batch, seqlen, heads * head dim) (``SEQUENCES``); packed ones: over (tokens, heads * head dim);
    padded head dims: over (tokens, heads, head dim), so that the padding columns read zeros, not the next head's."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    head_dim = q.shape[-1]
    block_d = configs.padded_head_dim(head_dim)
    # the copies of a sequence descriptor read zeros past the sequence, so that a masked block need not zero its
    # values (in registers, which sends V back through shared memory)
    sequences = _reads_sequences(q)
    descriptors = {"SEQUENCES": sequences}
    for name, x, rows in (("QDesc", q, config.block_m), ("KDesc", k, config.block_n), ("VDesc", v, config.block_n)):
        tokens, heads = token_count(x), x.shape[-2]
        if sequences:
            descriptors[name] = TensorDescriptor(x, [x.shape[0], x.shape[1], heads * head_dim],
                                                 [x.stride(0), x.stride(1), 1], [1, rows, head_dim])
        elif block_d == head_dim:
            descriptors[name] = TensorDescriptor(x, [tokens, heads * head_dim], [token_rows(x), 1], [rows, head_dim])
        else:
            descriptors[name] = TensorDescriptor(x, [tokens, heads, head_dim], [token_rows(x), x.stride(-2), 1],
                                                 [rows, 1, block_d])
    return descriptors


def hopper_forward_fits(q, k, v, opts: AttentionOptions, alibi_slopes, attn_mask, block_table) -> bool:
    """Whether the Hopper forward (``kernels/forward_hopper.py``) computes this call: a causal
    or unmasked softmax of 16-bit inputs at head dim 64, 128 or 256 on an sm90 GPU, with each tensor readable by TMA
    (``rows_readable``), and no position frame (ring attention's framed steps). Everything else takes the Triton
    kernel."""
    head_dim = q.shape[-1]
    return (q.is_cuda and q.dtype in (torch.bfloat16, torch.float16)
            and head_dim in (64, 128, 256) and opts.dropout_p == 0 and opts.softcap == 0
            and opts.softmax_scale > 0  # the running max is taken over unscaled scores
            and opts.window_left < 0 and opts.window_right in (-1, 0)
            and alibi_slopes is None and attn_mask is None and block_table is None and opts.frame is None
            and k.numel() > 0  # a descriptor needs at least one row
            and configs.gpu_family(q.device) == "hopper" and not interpreting()
            and all(rows_readable(x) for x in (q, k, v)) and tma_compatible(q, k, v))


def _hopper_forward(q, k, v, out, lse, layout: Layout, config: configs.TileConfig, opts: AttentionOptions) -> None:
    from ..kernels.forward_hopper import attention_forward_hopper_kernel

    head_dim = q.shape[-1]
    # a consumer warpgroup's 64 rows each
    tiles, plan = tile_plan_arguments(q, k, lse, layout, 64 * consumer_warpgroups(config), opts.window_right == 0)
    # persistent: one program per SM walks the tiles (two with one consumer), its loader fetching the next tile's Q,
    # K and V while the consumers finish the last one
    per_sm = programs_per_sm(config)
    programs = min(tiles, per_sm * sm_count(q.device.index)) if config.persistent else tiles
    constexprs = hopper_forward_constexprs(config, head_dim, opts.window_right == 0, layout.is_varlen)
    # the tiles taken beyond each program's first (forward_hopper._next_tile): a fresh zero for every call, so that
    # calls on different streams never share it
    tile_counter = launcher.zeros(1, torch.int32, q.device) if constexprs["DYNAMIC_TILES"] else None
    _, stride_om, stride_oh = strides(out)
    launch(
        attention_forward_hopper_kernel, (programs,),
        *rows_descriptors((q, 64), (k, config.block_n), (v, config.block_n)), out, lse, *layout.cu_seqlens,
        tile_counter,
        stride_om, stride_oh, *plan, opts.softmax_scale * LOG2E, **constexprs, num_warps=4,
        **({"maxnreg": configs.HOPPER_TWO_PROGRAMS_REGISTERS} if per_sm == 2 else {}),
    )


def tile_plan_arguments(q, k, lse, layout: Layout, rows_per_tile: int, causal: bool) -> tuple[int, tuple]:
    """The tiles of the Hopper forward or dQ (``rows_per_tile`` query rows each) and the arguments from which both
    kernels' ``forward_hopper._tile_plan`` derives each tile: the LSE's (batch, head) strides ((batch, nheads,
    seqlen_q) dense, (nheads, total_q) varlen with no batch stride), the lengths, nheads, the GQA group size, the
    row tiles per (sequence, head), the (sequence, head) pairs and the pairs per L2 section (``causal``: the
    sections of unequal tiles)."""
    nheads, head_dim = q.shape[-2:]
    row_tiles = cdiv(layout.grid_q, rows_per_tile)
    batch_heads = layout.batch * nheads
    group_size = nheads // k.shape[-2]
    lse_strides = (lse.stride(0), lse.stride(1)) if lse.dim() == 3 else (0, lse.stride(0))
    sections = _heads_per_section(batch_heads, group_size, layout.grid_k * head_dim * k.element_size(), causal)
    return row_tiles * batch_heads, (*lse_strides, *layout.lengths, nheads, group_size, row_tiles, batch_heads,
                                     sections)


def _heads_per_section(batch_heads: int, group_size: int, kv_head_bytes: int, causal: bool) -> int:
    """How many (sequence, head) pairs the Hopper forward walks together (``_tile_plan``): as many as have K and V
    within ``configs.HOPPER_L2_SECTION_BYTES`` (``HOPPER_CAUSAL_L2_SECTION_BYTES`` under a causal mask), where
    ``kv_head_bytes`` is one K (or V) head of the longest sequence. The query heads of a GQA group are consecutive
    and share one K/V head."""
    budget = configs.HOPPER_CAUSAL_L2_SECTION_BYTES if causal else configs.HOPPER_L2_SECTION_BYTES
    return l2_section_units(batch_heads, 2 * kv_head_bytes / group_size, budget)


def l2_section_units(units: int, unit_bytes: float, budget: int) -> int:
    """How many of a grid's ``units`` it walks together, each with ``unit_bytes`` that all its tiles read again: at
    most as many as fit ``budget`` bytes (at least one), and the sections as equal as that count allows, so that the
    last one is not a short remnant whose long causal tiles start when the others' are done (100 units by at most 32:
    25 a section, not 32, 32, 32 and 4)."""
    most = max(1, min(units, int(budget // max(unit_bytes, 1))))
    return cdiv(units, cdiv(units, most))


def hopper_forward_constexprs(config: configs.TileConfig, head_dim: int, causal: bool, is_varlen: bool) -> dict:
    """The Hopper forward's compile-time arguments for ``config`` (also what benchmarks/sass_report.py compiles)."""
    consumers = consumer_warpgroups(config)
    q_buffers = _forward_q_buffers(config, head_dim)
    return dict(HEAD_DIM=head_dim, BLOCK_N=config.block_n, NUM_STAGES=config.num_stages, CAUSAL=causal,
                IS_VARLEN=is_varlen, NUM_CONSUMERS=consumers,
                CONSUMER_REGISTERS=configs.HOPPER_CONSUMER_REGISTERS[consumers],
                LOADER_REGISTERS=configs.HOPPER_LOADER_REGISTERS,
                # a persistent grid hands out its tiles as programs free up (causal and packed tiles are unequal work)
                DYNAMIC_TILES=config.persistent,
                # without room to stage O for 16-byte stores beside the ring, it is staged in the consumer's Q tile
                STORE_THROUGH_Q=not room_for_wide_stores(config, head_dim, q_buffers), Q_BUFFERS=q_buffers,
                RESCALE_THRESHOLD=config.rescale_threshold)


def _forward_q_buffers(config: configs.TileConfig, head_dim: int) -> int:
    """The Hopper forward's Q tiles a program holds: two on a persistent grid where shared memory has room for them
    beside the K/V ring (the next tile's Q is copied while this one is computed), else one. hdim 256 has no room for
    a second."""
    return 2 if config.persistent and _fits_shared_memory(config, head_dim, 2) else 1


def room_for_wide_stores(config: configs.TileConfig, head_dim: int, row_tiles_held: int) -> bool:
    """Whether a Hopper forward or dQ program's shared memory leaves room to stage its result for 16-byte stores (at
    most a 64-row tile of each consumer) beside the K/V ring and the consumers' ``row_tiles_held`` 64-row tiles (the
    forward's Q buffers; the dQ's Q and dO). The forward's 3-stage 128-key tile at hdim 128 (224 KB) and its hdim-256
    tile (192 KB) leave none, as does the dQ's at hdim 256: these stage their result in each consumer's Q tile
    instead (``STORE_THROUGH_Q``)."""
    return _fits_shared_memory(config, head_dim, row_tiles_held + 1)


def _fits_shared_memory(config: configs.TileConfig, head_dim: int, row_tiles: int) -> bool:
    """Whether ``row_tiles`` 64-row, 16-bit tiles of each consumer fit in a program's shared memory beside the K/V
    ring."""
    tile_bytes = 64 * head_dim * 2
    ring_bytes = config.num_stages * 2 * config.block_n * head_dim * 2
    budget = configs.HOPPER_SHARED_BYTES // programs_per_sm(config)
    return row_tiles * consumer_warpgroups(config) * tile_bytes + ring_bytes <= budget


def consumer_warpgroups(config: configs.TileConfig) -> int:
    """The Hopper forward's and dQ's consumer warpgroups, 64 query rows each: three with ``three_consumers``, one for
    a 64-row tile (the forward's), else two."""
    if config.three_consumers:
        return 3
    return 1 if config.block_m == 64 else 2


def shared_consumer_warpgroups(config: configs.TileConfig, kernel: str) -> int:
    """``consumer_warpgroups`` for the kernels built on the forward's tiles with two or three consumers (the dQ, the
    FP8 forward): a 64-row tile of one consumer is the 16-bit forward's alone."""
    consumers = consumer_warpgroups(config)
    if consumers == 1:
        raise ValueError(f"config: the Hopper {kernel} takes 128-row tiles (192 with three_consumers), got {config}")
    return consumers


def programs_per_sm(config: configs.TileConfig) -> int:
    """Programs of the Hopper forward an SM holds: two of one consumer warpgroup each (registers capped at launch,
    ``configs.HOPPER_TWO_PROGRAMS_REGISTERS``; shared memory halved), else one."""
    return 1 if consumer_warpgroups(config) > 1 else 2

