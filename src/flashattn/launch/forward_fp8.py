"""The FP8 forward's launch (``kernels/forward_fp8.py``): V^T, the descales' strides, the tile, the grid."""

from __future__ import annotations

import torch

from .. import configs
from ..backend import interpreting
from ..fp8 import P_SCALE, SCALE_BLOCK, has_blocks
from ..options import AttentionOptions
from ..validation import Packing
from .common import LOG2E, Layout, cdiv, last_dim_contiguous, strides
from .launcher import launch


def transposed_v(v: torch.Tensor) -> torch.Tensor:
    """V with its keys contiguous, as the FP8 P V product reads it (Hopper's FP8 wgmma takes its second operand
    K-major only): dense (B, Sk, Hk, D) -> (B, Hk, D, Sk), packed (total_k, Hk, D) -> (Hk, D, total_k).

    A copy, one read and one write of V's bytes (1 byte an element): at 8k keys, 8 kv heads of 128 that is 8 MiB
    each way, a few microseconds of HBM time beside an attention of milliseconds, and memory for one more V."""
    if v.dim() == 4:
        return v.permute(0, 2, 3, 1).contiguous()
    return v.permute(1, 2, 0).contiguous()


def _descale_strides(descale: torch.Tensor) -> tuple[int, int, int]:
    """(batch, kv head, block) strides; a single block is read at every block (stride 0)."""
    return descale.stride(0), descale.stride(1), descale.stride(2) if descale.shape[2] > 1 else 0


def fp8_tile(head_dim: int, masked: bool, device: torch.device) -> configs.TileConfig:
    """The FP8 forward's tile (``configs.FORWARD_FP8``), whose BLOCK_N divides SCALE_BLOCK."""
    config = configs.tile_config("forward_fp8", head_dim, masked, torch.float8_e4m3fn, device, interpreting())
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
    vt = transposed_v(v)
    config = fp8_tile(head_dim, opts.masked, q.device)
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
