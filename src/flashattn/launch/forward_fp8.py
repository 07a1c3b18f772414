"""The FP8 forward's launches: the Triton kernel (``kernels/forward_fp8.py``) for every call, the Gluon kernel
(``kernels/forward_fp8_hopper.py``) for the dense calls it covers on sm90. V^T, the descales' strides, the tile, the
grid."""

from __future__ import annotations

import math

import torch

from .. import configs
from ..backend import interpreting
from ..fp8_format import P_SCALE, SCALE_BLOCK, has_blocks
from ..options import AttentionOptions
from ..validation import Packing
from . import launcher
from .common import (
    LOG2E,
    Layout,
    cdiv,
    last_dim_contiguous,
    sm_count,
    strides,
    tile_layout,
    tma_compatible,
    token_descriptor,
    token_rows,
)
from .forward import shared_consumer_warpgroups, tile_plan_arguments
from .launcher import launch


def transposed_v(v: torch.Tensor) -> torch.Tensor:
    """V with its keys contiguous, as the Triton FP8 kernel's P V product reads it (Hopper's FP8 wgmma takes its
    second operand K-major only): dense (B, Sk, Hk, D) -> (B, Hk, D, Sk), packed (total_k, Hk, D) -> (Hk, D, total_k).
    One read and one write of V's bytes, and memory for one more V."""
    if v.dim() == 3:
        return _copy_transposed(v.unsqueeze(0), v.shape[0], permute=False)[0]
    return _copy_transposed(v, v.shape[1], permute=False)


def _descale_strides(descale: torch.Tensor) -> tuple[int, int, int]:
    """(batch, kv head, block) strides; a single block is read at every block (stride 0)."""
    return descale.stride(0), descale.stride(1), descale.stride(2) if descale.shape[2] > 1 else 0


def fp8_tile(head_dim: int, masked: bool, device: torch.device, hopper: bool = False) -> configs.TileConfig:
    """The FP8 forward's tile (``configs.HOPPER_FORWARD_FP8``), whose BLOCK_N divides SCALE_BLOCK; ``hopper``: the
    call fits the Gluon kernel (``hopper_fp8_fits``), whose entries then come first."""
    config = configs.tile_config("forward_fp8", head_dim, masked, torch.float8_e4m3fn, device, interpreting(),
                                 hopper=hopper)
    if SCALE_BLOCK % config.block_n != 0:
        raise ValueError(f"the FP8 forward's BLOCK_N ({config.block_n}) must divide SCALE_BLOCK ({SCALE_BLOCK}): a "
                         f"key block takes one v descale")
    return config


def launch_forward_fp8(q, k, v, descales: tuple[torch.Tensor, ...], opts: AttentionOptions,
                       packing: Packing | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(bfloat16 out, float32 lse) of e4m3 q, k, v; ``descales`` (q, k, v) are (batch, nheads_k, blocks) float32."""
    from ..kernels.forward_fp8 import attention_forward_fp8_kernel

    q, k = last_dim_contiguous(q), last_dim_contiguous(k)
    nheads, head_dim = q.shape[-2:]
    layout = Layout.of(q, k, packing)
    out = torch.empty(q.shape, dtype=torch.bfloat16, device=q.device)
    lse = torch.empty(layout.lse_shape, dtype=torch.float32, device=q.device)
    if layout.grid_q == 0 or k.numel() == 0:
        out.zero_()
        lse.fill_(float("inf"))
        return out, lse
    fits = packing is None and hopper_fp8_fits(q, k, opts)
    config = fp8_tile(head_dim, opts.masked, q.device, hopper=fits)
    if config.hopper and fits:
        _hopper_forward_fp8(q, k, v, descales, out, lse, layout, config, opts)
        return out, lse
    vt = transposed_v(v)
    if opts.softcap > 0:
        qk_scale, softcap_log2 = opts.softmax_scale / opts.softcap, opts.softcap * LOG2E
    else:
        qk_scale, softcap_log2 = opts.softmax_scale * LOG2E, 0.0
    vt_strides = (vt.stride(0), vt.stride(1), vt.stride(2)) if vt.dim() == 4 else (0, vt.stride(0), vt.stride(1))
    grid = (cdiv(layout.grid_q, config.block_m), layout.batch * nheads)
    launch(
        attention_forward_fp8_kernel, grid,
        q, k, vt, out, lse, *layout.cu_seqlens, *descales,
        *strides(q), *strides(k), *vt_strides, *strides(out),
        *(s for d in descales for s in _descale_strides(d)),
        *layout.lengths, nheads, nheads // k.shape[-2], qk_scale, softcap_log2, opts.window_left, opts.window_right,
        HEAD_DIM=head_dim, BLOCK_D=configs.padded_head_dim(head_dim), BLOCK_M=config.block_m,
        BLOCK_N=config.block_n, WINDOW_LEFT=opts.window_left >= 0, WINDOW_RIGHT=opts.window_right >= 0,
        HAS_SOFTCAP=opts.softcap > 0, IS_VARLEN=layout.is_varlen, PER_BLOCK=has_blocks(descales),
        SCALE_BLOCK=SCALE_BLOCK, P_SCALE=P_SCALE, ROUND_P_BY_HAND=interpreting(), **configs.launch_options(config),
    )
    return out, lse


def hopper_fp8_fits(q, k, opts: AttentionOptions) -> bool:
    """Whether the Gluon FP8 forward computes this dense call: a causal or unmasked softmax without softcap at head
    dim 64, 128 or 256 on an sm90 GPU, q and k readable as (tokens, heads * head_dim) rows by TMA (V^T is the
    launcher's own copy). Everything else takes the Triton kernel."""
    return (q.is_cuda and q.shape[-1] in (64, 128, 256) and opts.softcap == 0
            and opts.softmax_scale > 0  # the running max is taken over unscaled scores
            and opts.window_left < 0 and opts.window_right in (-1, 0) and opts.frame is None
            and k.numel() > 0  # a descriptor needs at least one row
            and configs.gpu_family(q.device) == "hopper" and not interpreting()
            and all(token_rows(x) is not None for x in (q, k)) and tma_compatible(q, k))


def permuted_transposed_v(v: torch.Tensor) -> torch.Tensor:
    """V^T of dense v (B, Sk, Hk, D) for the Gluon kernel: (B, Hk, D, Sk') with Sk' = Sk rounded up to 32 (zero keys
    past Sk, so that rows start 16-byte aligned, as TMA needs), its keys reordered within each 32 as the kernel's P
    operand orders them (``kernels.forward_fp8_hopper._p_operand``): position k (bits k4..k0) holds key
    16 k4 + 8 k1 + 4 k3 + 2 k2 + k0. One copy, as ``transposed_v``."""
    return _copy_transposed(v, cdiv(v.shape[1], 32) * 32, permute=True)


def transposed_tokens(x: torch.Tensor, width: int, permute: bool, pairs: bool = False) -> torch.Tensor:
    """(B, H, D, width) copy of e4m3 (B, S, H, D) x with its tokens contiguous, zeros past S (``permute``: each 32 in
    the Gluon kernels' register-operand order; ``pairs``: each 16 in the fused backward's dS byte-pair order): the
    K-major operand of a product that contracts over the tokens (the FP8 backward's Q^T and dO^T,
    ``launch/backward_fp8.py``)."""
    return _copy_transposed(x, width, permute, pairs)


def _copy_transposed(v: torch.Tensor, width: int, permute: bool, pairs: bool = False) -> torch.Tensor:
    """(B, Hk, D, width) V^T of (B, Sk, Hk, D) v by ``kernels/transpose_fp8.py``, which moves whole rows where
    PyTorch's copy of a permuted view goes byte by byte."""
    from ..kernels.transpose_fp8 import transpose_v_kernel

    batch, keys, nheads_k, head_dim = v.shape
    vt = torch.empty(batch, nheads_k, head_dim, width, dtype=v.dtype, device=v.device)
    if vt.numel() == 0:
        return vt
    block_n, warps = configs.TRANSPOSE_V_TILE
    # v and vt themselves (the kernel copies bytes): a launch plan slots each tensor it is passed, and a uint8 view of
    # vt would be a second new tensor (a dtype view has no _base), which no plan can tie to vt
    launch(transpose_v_kernel, (cdiv(width, block_n), nheads_k, batch), v, vt, keys, width,
           *v.stride(), *vt.stride()[:3], HEAD_DIM=head_dim, BLOCK_D=configs.padded_head_dim(head_dim),
           BLOCK_N=block_n, PERMUTE=permute, PAIRS=pairs, num_warps=warps)
    return vt


def _vt_descriptor(vt: torch.Tensor, block_n: int):
    """A host-side TMA descriptor of V^T (B, Hk, D, keys) as (B * Hk * D, keys) rows, one (D, block_n) tile a key
    block."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    batch, nheads_k, head_dim, keys = vt.shape
    return TensorDescriptor(vt, [batch * nheads_k * head_dim, keys], [vt.stride(2), 1], [head_dim, block_n],
                            tile_layout(head_dim, block_n, vt.dtype))


def _hopper_forward_fp8(q, k, v, descales, out, lse, layout: Layout, config: configs.TileConfig,
                        opts: AttentionOptions) -> None:
    from ..kernels.forward_fp8_hopper import attention_forward_fp8_hopper_kernel

    head_dim = q.shape[-1]
    rows = 64 * shared_consumer_warpgroups(config, "FP8 forward")
    tiles, plan = tile_plan_arguments(q, k, lse, layout, rows, opts.window_right == 0)
    programs = min(tiles, sm_count(q.device.index)) if config.persistent else tiles
    constexprs = hopper_fp8_constexprs(config, head_dim, opts.window_right == 0, has_blocks(descales))
    # the tiles taken beyond each program's first: a fresh zero for every call (``launch.forward._hopper_forward``)
    tile_counter = launcher.zeros(1, torch.int32, q.device) if constexprs["DYNAMIC_TILES"] else None
    _, stride_om, stride_oh = strides(out)
    launch(
        attention_forward_fp8_hopper_kernel, (programs,),
        token_descriptor(q, 64), token_descriptor(k, config.block_n),
        _vt_descriptor(permuted_transposed_v(v), config.block_n), out, lse, *descales, tile_counter,
        *(s for d in descales for s in _descale_strides(d)), stride_om, stride_oh, *plan,
        opts.softmax_scale * LOG2E, **constexprs, num_warps=4,
    )


def hopper_fp8_constexprs(config: configs.TileConfig, head_dim: int, causal: bool, per_block: bool) -> dict:
    """The Gluon FP8 forward's compile-time arguments for ``config`` (also what benchmarks/sass_report.py compiles):
    the 16-bit Hopper forward's, with Q buffers and wide stores where shared memory has room for them at 1 byte an
    input element."""
    consumers = shared_consumer_warpgroups(config, "FP8 forward")
    room = configs.HOPPER_SHARED_BYTES
    q_buffers = 2 if config.persistent and _fp8_shared_bytes(config, head_dim, 2, False) <= room else 1
    return dict(HEAD_DIM=head_dim, BLOCK_N=config.block_n, NUM_STAGES=config.num_stages, CAUSAL=causal,
                NUM_CONSUMERS=consumers, CONSUMER_REGISTERS=configs.HOPPER_CONSUMER_REGISTERS[consumers],
                LOADER_REGISTERS=configs.HOPPER_LOADER_REGISTERS, DYNAMIC_TILES=config.persistent,
                WIDE_STORES=_fp8_shared_bytes(config, head_dim, q_buffers, True) <= room,
                Q_BUFFERS=q_buffers, PER_BLOCK=per_block, SCALE_BLOCK=SCALE_BLOCK,
                P_SCALE_LOG2=round(math.log2(P_SCALE)))


def _fp8_shared_bytes(config: configs.TileConfig, head_dim: int, q_buffers: int, wide_stores: bool) -> int:
    """Shared memory of a Gluon FP8 forward program: each consumer's e4m3 64-row Q tiles, the e4m3 K/V ring and,
    for wide stores, each consumer's bfloat16 64-row result on its way to 16-byte stores."""
    consumers = shared_consumer_warpgroups(config, "FP8 forward")
    q_bytes = q_buffers * consumers * 64 * head_dim
    ring_bytes = config.num_stages * 2 * config.block_n * head_dim
    return q_bytes + ring_bytes + (consumers * 64 * head_dim * 2 if wide_stores else 0)
