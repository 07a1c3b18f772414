"""The backward's launches: delta = rowsum(dO * O), then the dK/dV and dQ kernels (Triton, or the Hopper kernels
for the calls they cover on sm90), on two streams when the call is long enough."""

from __future__ import annotations

import contextlib
import dataclasses
import functools

import torch

from .. import configs, flops, masks
from ..backend import interpreting
from ..options import AttentionOptions
from ..validation import Packing
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
    tma_loads,
)
from .forward import (
    hopper_forward_fits,
    l2_section_units,
    room_for_wide_stores,
    shared_consumer_warpgroups,
    tile_plan_arguments,
)
from .launcher import launch, zeros

# the fused dK/dV/dQ kernel's dQ^T tile: FUSED_DQ_ROWS head dims (one wgmma row block) by FUSED_DQ_QUERIES (a query
# block at head dim 128, half of one at 64), kept as FUSED_DQ_TILE (rows, columns) in its registers' order
# (kernels/backward_fused_dq.py: DQ_ROWS, DQ_QUERIES, DQ_BLOCK_PAIR, DQ_TILE_*)
FUSED_DQ_ROWS = 64
FUSED_DQ_QUERIES = 64
FUSED_DQ_BLOCK_PAIR = 2  # the accumulator's query blocks a head come in whole pairs (a 128-row block's halves)
FUSED_DQ_TILE = (16, 256)


def _hopper_dkdv(q, k, v, dout, lse, delta, dk, dv, opts: AttentionOptions, config: configs.TileConfig,
                 dq_acc: torch.Tensor | None = None) -> None:
    """dK and dV (contiguous, k's shape) by a Hopper kernel (``config.key_slices``: the key-slice one); ``delta`` =
    rowsum(dO * O), lse's layout. ``dq_acc``: the key-slice kernel also adds dQ^T / softmax_scale into it
    (``dq_accumulator``)."""
    kernel, keys = hopper_dkdv_kernel(config, fused=dq_acc is not None)
    batch, seqlen_q, nheads, head_dim = q.shape
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    key_blocks = cdiv(seqlen_k, keys)
    tiles = key_blocks * batch * nheads_k
    programs, dq_arguments = tiles, ()
    if dq_acc is not None:
        dq_arguments = (dq_accumulator_descriptor(dq_acc),)
        if fused_persistent(config):
            # one program an SM walks the tiles (kernels/backward_fused_dq_persistent.py), taking each after its first
            # from a counter: a fresh zero for every call, which a plan's replay zeroes too
            programs = min(tiles, sm_count(q.device.index))
            dq_arguments += (zeros(1, torch.int32, q.device),)
    # L2 sections of (batch, kv head) pairs (backward_hopper.sectioned_key_tile): the GQA group's Q and dO are what
    # every key tile of a pair reads
    group_bytes = 2 * (nheads // nheads_k) * seqlen_q * head_dim * q.element_size()
    plan = (batch * nheads_k, l2_section_units(batch * nheads_k, group_bytes, configs.HOPPER_L2_SECTION_BYTES))
    launch(
        kernel, (programs,),
        *rows_descriptors((q, config.block_m), (k, keys), (v, keys), (dout, config.block_m)),
        lse, delta, dk, dv, *dq_arguments, dk.stride(0), dk.stride(1), dk.stride(2),
        seqlen_q, seqlen_k, nheads, nheads_k, key_blocks, *plan, opts.softmax_scale, opts.softmax_scale * LOG2E,
        **hopper_dkdv_constexprs(config, head_dim, opts.window_right == 0), num_warps=4,
    )


def fused_persistent(config: configs.TileConfig) -> bool:
    """Whether the fused dK/dV/dQ tile ``config`` runs on a persistent grid (its ``persistent`` field; the two
    passes' dK/dV kernels have no persistent form)."""
    return config.key_slices and config.persistent


def hopper_dq_fits(q, k, v, dout, lse, opts: AttentionOptions, alibi_slopes, attn_mask) -> bool:
    """Whether the Hopper dQ kernel (``kernels/dq_hopper.py``) computes this backward's dQ: the
    forward's conditions (``hopper_forward_fits``, dense or varlen), with dO readable as q is
    (``rows_readable``) and a contiguous LSE (delta takes its layout). The Hopper dK/dV kernel takes the same calls when
    they are dense batches."""
    return (q.numel() > 0 and lse.is_contiguous()
            and hopper_forward_fits(q, k, v, opts, alibi_slopes, attn_mask, None)
            and rows_readable(dout) and tma_compatible(dout))


def _hopper_dq(q, k, v, dout, lse, delta, dq, layout: Layout, config: configs.TileConfig,
               opts: AttentionOptions) -> None:
    """dQ (contiguous, q's shape) by the Hopper kernel: the forward's tiles (64 query rows on each of two or three
    consumer warpgroups) and its L2 sections; ``delta`` = rowsum(dO * O), lse's layout."""
    from ..kernels.dq_hopper import dq_hopper_kernel

    head_dim = q.shape[-1]
    rows = 64 * shared_consumer_warpgroups(config, "dQ")
    tiles, plan = tile_plan_arguments(q, k, lse, layout, rows, opts.window_right == 0)
    _, stride_dqm, stride_dqh = strides(dq)
    launch(
        dq_hopper_kernel, (tiles,),
        *rows_descriptors((q, 64), (k, config.block_n), (v, config.block_n), (dout, 64)), dq, lse, delta,
        *layout.cu_seqlens, stride_dqm, stride_dqh, *plan, opts.softmax_scale, opts.softmax_scale * LOG2E,
        **hopper_dq_constexprs(config, head_dim, opts.window_right == 0, layout.is_varlen), num_warps=4,
    )


def hopper_dq_constexprs(config: configs.TileConfig, head_dim: int, causal: bool, is_varlen: bool) -> dict:
    """The Hopper dQ kernel's compile-time arguments for ``config`` (also what benchmarks/sass_report.py compiles)."""
    consumers = shared_consumer_warpgroups(config, "dQ")
    return dict(HEAD_DIM=head_dim, BLOCK_N=config.block_n, NUM_STAGES=config.num_stages, CAUSAL=causal,
                IS_VARLEN=is_varlen, NUM_CONSUMERS=consumers,
                CONSUMER_REGISTERS=configs.HOPPER_CONSUMER_REGISTERS[consumers],
                LOADER_REGISTERS=configs.HOPPER_LOADER_REGISTERS,
                STORE_THROUGH_Q=not room_for_wide_stores(config, head_dim, 2))


def hopper_dkdv_kernel(config: configs.TileConfig, fused: bool = False):
    """The Hopper dK/dV kernel of ``config`` and its keys a program: the key-slice kernel (128 keys, 64 on each
    warpgroup; ``fused``: its form that adds dQ into float32 too, on a persistent grid with ``config.persistent``) or
    the gradient-split one (``config.block_n``)."""
    from ..kernels.backward_fused_dq import dkdv_dq_key_slices_kernel
    from ..kernels.backward_fused_dq_persistent import dkdv_dq_persistent_kernel
    from ..kernels.backward_hopper import KEY_SLICE_PROGRAM_KEYS, dkdv_hopper_kernel, dkdv_key_slices_kernel

    if config.key_slices:
        if fused:
            kernel = dkdv_dq_persistent_kernel if fused_persistent(config) else dkdv_dq_key_slices_kernel
            return kernel, KEY_SLICE_PROGRAM_KEYS.value
        return dkdv_key_slices_kernel, KEY_SLICE_PROGRAM_KEYS.value
    return dkdv_hopper_kernel, config.block_n


def hopper_dkdv_constexprs(config: configs.TileConfig, head_dim: int, causal: bool) -> dict:
    """The Hopper dK/dV kernel's compile-time arguments for ``config`` (also what benchmarks/sass_report.py
    compiles): its two consumer warpgroups take the forward consumers' registers."""
    constexprs = dict(HEAD_DIM=head_dim, BLOCK_M=config.block_m, NUM_STAGES=config.num_stages, CAUSAL=causal,
                      CONSUMER_REGISTERS=configs.HOPPER_CONSUMER_REGISTERS[2],
                      LOADER_REGISTERS=configs.HOPPER_LOADER_REGISTERS)
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


def fused_dq_config(q: torch.Tensor, fits_hopper: bool, opts: AttentionOptions,
                    seqlen: int) -> configs.TileConfig | None:
    """The tile of the dK/dV kernel that computes dQ too (five products; ``configs`` phase "dkdv_dq"), or None for
    the two passes: the key-slice kernel at head dim 64 or 128 (dQ^T's rows in wgmma row blocks of 64: a consumer's
    head-dim half at 128, the consumers' turns at 64), where the table has an entry, unless the call is
    to be repeatable (``AttentionOptions.repeatable``: its reductions add in no fixed order; the two passes are
    bitwise repeatable)."""
    head_dim = q.shape[-1]
    if not fits_hopper or opts.repeatable or head_dim not in (64, 128):
        return None
    forced = dict(configs.forced_configs())
    if "dkdv" in forced and "dkdv_dq" not in forced:
        return None  # a forced dK/dV tile (a sweep's, a test's) is one of the two passes'
    return configs.tile_config("dkdv_dq", head_dim, opts.masked, q.dtype, q.device, False, seqlen=seqlen, hopper=True)


def dq_accumulator(q: torch.Tensor) -> torch.Tensor:
    """The fused kernel's float32 dQ^T, zeroed: for each (batch, head, block of FUSED_DQ_QUERIES queries (whole
    pairs of them a head), FUSED_DQ_ROWS head dims) a tile in the order of the kernel's registers
    (``kernels/backward_fused_dq.py``: ``_register_order``), as rows of FUSED_DQ_TILE[1]."""
    batch, seqlen_q, nheads, head_dim = q.shape
    q_blocks = FUSED_DQ_BLOCK_PAIR * cdiv(seqlen_q, FUSED_DQ_BLOCK_PAIR * FUSED_DQ_QUERIES)
    tiles = batch * nheads * q_blocks * (head_dim // FUSED_DQ_ROWS)
    return zeros((tiles * FUSED_DQ_TILE[0], FUSED_DQ_TILE[1]), torch.float32, q.device)


def dq_accumulator_descriptor(dq_acc: torch.Tensor):
    """A host-side TMA descriptor of ``dq_accumulator`` in blocks of one tile, not swizzled: the tile's order is
    the registers' already."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    return TensorDescriptor(dq_acc, list(dq_acc.shape), [dq_acc.stride(0), 1], list(FUSED_DQ_TILE),
                            dq_tile_layout())


@functools.cache
def dq_tile_layout():
    """The shared-memory layout of a ``dq_accumulator`` tile: rows as they are, no swizzle (built once)."""
    from triton.experimental.gluon import language as gl

    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)


def _dq_from_accumulator(dq_acc: torch.Tensor, dq: torch.Tensor, opts: AttentionOptions) -> None:
    """dQ (contiguous, q's shape, its type) = softmax_scale * the fused kernel's ``dq_accumulator``."""
    from ..kernels.backward_fused_dq import dq_from_accumulator

    batch, seqlen_q, nheads, head_dim = dq.shape
    block = configs.DQ_CONVERSION_ROWS
    launch(dq_from_accumulator, (cdiv(seqlen_q, block), batch * nheads), dq_acc, dq, opts.softmax_scale, seqlen_q,
           nheads, HEAD_DIM=head_dim, BLOCK_M=block, num_warps=4)


def _gradient_streams_pay(q: torch.Tensor, layout: Layout, nheads_k: int, opts: AttentionOptions) -> bool:
    """Whether this backward takes the two gradient streams: its FLOPs by the convention, over the longest sequences
    for packed ones (an upper bound, as for windows)."""
    if not q.is_cuda:
        return False
    nheads, head_dim = q.shape[-2:]
    work = flops.backward_flops(layout.batch, layout.grid_q, layout.grid_k, nheads, head_dim, opts.window_right == 0)
    return work >= configs.CONCURRENT_GRADIENTS_MIN_FLOPS


@functools.cache
def _side_stream(device_index: int) -> torch.cuda.Stream:
    """One second stream per device, made once: creating a stream costs host time on every call."""
    return torch.cuda.Stream(device_index)


class GradientStreams:
    """Made after the delta kernel's launch: ``first()`` sends the dK/dV launches to a second stream that starts
    after the delta kernel, the dQ kernel follows on the current stream, and ``join()`` makes the current stream
    wait for both. The GPU then fills the last, partial wave of the dK/dV kernel's grid with the dQ kernel's
    programs instead of idling until it ends. Both streams have the same priority (a more urgent dK/dV stream
    gained nothing).

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


def launch_backward(dout, q, k, v, out, lse, alibi_slopes, rng_state, opts: AttentionOptions, attn_mask=None,
                    mask_needs_grad=False, packing: Packing | None = None):
    """(dq, dk, dv, dmask): the delta kernel, then dK/dV and dQ (side by side on two streams for long calls)."""
    from ..kernels.backward import delta_kernel, dkdv_kernel, dq_kernel

    dout, q, k, v, out = (last_dim_contiguous(x) for x in (dout, q, k, v, out))
    nheads, head_dim = q.shape[-2:]
    nheads_k = k.shape[-2]
    layout = Layout.of(q, k, packing)
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
    delta_block = configs.delta_rows(interpret)
    delta_rows, delta_batch = (layout.lengths[0], 1) if packing is not None else (layout.grid_q, batch)
    launch(
        delta_kernel, (cdiv(delta_rows, delta_block), delta_batch * nheads),
        out, dout, delta, *strides(out), *strides(dout),
        delta_rows, nheads, HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_M=delta_block,
    )

    slopes, stride_alibi_b, has_alibi = alibi_arguments(alibi_slopes, q)
    shared = dict(
        softmax_scale=opts.softmax_scale, HEAD_DIM=head_dim, BLOCK_D=block_d, HAS_ALIBI=has_alibi,
        IS_VARLEN=layout.is_varlen, **kernel_scalars(opts, rng_state), **frame_scalars(opts, layout),
        **dot_flags(q.dtype),
        **mask_arguments(attn_mask, q, layout.lengths[1]),
    )
    has_mask = attn_mask is not None
    masked = opts.masked or has_mask
    # The mask's gradient is dS, (B, Hq, Sq, Sk) in float32: O(N^2) memory, only when it is asked for.
    dmask = (torch.zeros(batch, nheads, *layout.lengths, dtype=torch.float32, device=q.device)
             if mask_needs_grad else None)
    inputs = (q, k, v, dout, lse, delta)
    input_strides = (*strides(q), *strides(k), *strides(v), *strides(dout))
    shorter = min(layout.grid_q, layout.grid_k)
    fits_hopper_dq = hopper_dq_fits(q, k, v, dout, lse, opts, alibi_slopes, attn_mask)
    fits_hopper = packing is None and fits_hopper_dq  # the Hopper dK/dV takes dense batches only
    fused_config = fused_dq_config(q, fits_hopper, opts, shorter)
    if fused_config is not None:
        # one pass: dQ^T summed in float32 by the dK/dV kernel, then transposed, scaled and rounded
        dq_acc = dq_accumulator(q)
        _hopper_dkdv(q, k, v, dout, lse, delta, dk, dv, opts, fused_config, dq_acc)
        _dq_from_accumulator(dq_acc, dq, opts)
        return dq, dk, dv, q.new_empty(0)
    dkdv_config = dkdv_compilable(
        configs.tile_config("dkdv", head_dim, masked, q.dtype, q.device, interpret, attn_mask=has_mask,
                            seqlen=shorter, hopper=fits_hopper), layout.lengths[0])
    dq_config = configs.tile_config("dq", head_dim, masked, q.dtype, q.device, interpret, attn_mask=has_mask,
                                    seqlen=shorter, hopper=fits_hopper_dq)
    dkdv_map, dq_map = block_map_arguments(attn_mask, q, layout.lengths[1],
                                           (dkdv_config.block_m, dkdv_config.block_n, True),
                                           (dq_config.block_m, dq_config.block_n, False))
    # the backward's fp32 keeps pointer loads: with TMA the hdim-256 key-row tile asked for 256 KB of shared
    # memory (H200)
    half = q.dtype != torch.float32
    dq_tma = tma_loads(dq_config.tma and half, k, v)
    # dK/dV and dQ both read only the inputs and delta, so they may run side by side
    gradient_streams = GradientStreams(q.device) if _gradient_streams_pay(q, layout, nheads_k, opts) else None
    with gradient_streams.first() if gradient_streams else contextlib.nullcontext():
        if dkdv_config.hopper and fits_hopper:
            _hopper_dkdv(q, k, v, dout, lse, delta, dk, dv, opts, dkdv_config)
        else:
            dkdv_tma = tma_loads(dkdv_config.tma and half, q, dout)
            launch(
                dkdv_kernel, (cdiv(layout.grid_k, dkdv_config.block_n), batch * nheads_k),
                *inputs, dk, dv, slopes, *layout.cu_seqlens, *input_strides, *strides(dk), *strides(dv),
                stride_alibi_b, *layout.lengths, nheads, nheads_k, nheads // nheads_k,
                BLOCK_M=dkdv_config.block_m, BLOCK_N=dkdv_config.block_n, USE_TMA=dkdv_tma,
                MASK_EVERY_BLOCK=dkdv_config.mask_every_block, PEEL_DIAGONAL=dkdv_config.peel_diagonal,
                KEY_ROWS=dkdv_config.key_rows, **configs.launch_options(dkdv_config), **shared, **dkdv_map,
            )
    if dq_config.hopper and fits_hopper_dq:
        _hopper_dq(q, k, v, dout, lse, delta, dq, layout, dq_config, opts)
    else:
        launch(
            dq_kernel, (cdiv(layout.grid_q, dq_config.block_m), batch * nheads),
            *inputs, dq, slopes, *layout.cu_seqlens, *input_strides, *strides(dq),
            stride_alibi_b, *layout.lengths, nheads, nheads // nheads_k,
            BLOCK_M=dq_config.block_m, BLOCK_N=dq_config.block_n,
            **configs.launch_options(dq_config),
            DMask=dmask if mask_needs_grad else q, MASK_GRAD=mask_needs_grad, USE_TMA=dq_tma, **shared, **dq_map,
        )
    if gradient_streams:
        gradient_streams.join()
    # no SDPA mask on the Hopper path (its kernels take none), so no mask gradient, which only the Triton dQ writes
    if dmask is None:
        return dq, dk, dv, q.new_empty(0)
    return dq, dk, dv, masks.sum_to_shape(dmask, attn_mask.shape).to(attn_mask.dtype)

