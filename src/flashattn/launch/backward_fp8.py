"""The FP8 backward's dK/dV launch on sm90 (``kernels/backward_fp8_hopper.py``): dO quantized by the quantizer's
kernels, delta, the transposed copies of Q and dO, the kernel, then dK rotated back.

dQ is not computed here: ``ops_fp8`` takes it from the reference path's arithmetic (``fp8_backward.backward`` with
``dkdv=False``) until a kernel computes it.

The rotation back is a float32 torch matmul: with a rotation the kernel writes float32 dK, which one (rows x D) @
(D x D) product takes back to the inputs' basis before the rounding to dO's dtype, the reference path's arithmetic.
"""

from __future__ import annotations

import torch

from .. import configs
from ..backend import interpreting
from ..fp8_format import E4M3_MAX, FP8_DTYPE, SCALE_BLOCK
from ..fp8_quantize import dequantize, rotation_matrix
from ..options import AttentionOptions
from .common import LOG2E, cdiv, last_dim_contiguous, tile_layout, tma_compatible, token_descriptor, token_rows
from .forward_fp8 import transposed_tokens
from .launcher import launch
from .quantize_fp8 import quantize_rows

BLOCK_M = 64  # queries a block: the rows of a dS descale (fp8_backward.DS_BLOCK_M)
BLOCK_N = SCALE_BLOCK  # keys a program: one k and v descale block, the keys of a dS descale
# S^T = K Q^T and dP^T = V dO^T on float16 copies of the e4m3 tensors (exact conversions; float16 wgmma sums in about
# float32) rather than e4m3 wgmma, whose sums over the head dim keep about 13 fraction bits, truncated: modelled on
# the CPU (products exact, each 32-wide step truncated below the largest term), those put dK and dV 2e-3 to 3e-3
# (norm-relative) off the reference path at 256 x 256, hdim 128, with the tile products exact, and fresh accumulators
# per 32 still 1.5e-3; the tile products' own truncation, 7e-4. The e4m3 build (False) is the faster one to measure.
SCORES_16BIT = True


def hopper_fp8_dkdv_fits(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         opts: AttentionOptions) -> bool:
    """Whether the Gluon kernel computes this backward's dK and dV: dense 16-bit dO on an sm90 GPU, head dims 64
    and 128 (two float32 64 x D gradients and a tile product a consumer fit 240 registers), no softcap (its tanh term
    stays on the reference path), no position frame, a non-empty call, and q, k, v readable by TMA as (tokens, heads
    * head_dim) rows. Causal and window masks, GQA/MQA and both descale granularities are the kernel's."""
    return (q.is_cuda and dout.dtype in (torch.bfloat16, torch.float16) and q.shape[-1] in (64, 128)
            and opts.softcap == 0 and opts.frame is None and q.numel() > 0 and k.numel() > 0
            and configs.gpu_family(q.device) == "hopper" and not interpreting()
            and all(token_rows(x) is not None for x in (q, k, v)) and tma_compatible(q, k, v))


def score_operands(q, do8, k, v, scores_16bit: bool) -> tuple[torch.Tensor, ...]:
    """The operands of S^T and dP^T: the e4m3 tensors, or their float16 copies (``SCORES_16BIT``)."""
    return tuple(x.to(torch.float16) for x in (q, do8, k, v)) if scores_16bit else (q, do8, k, v)


def hopper_fp8_dkdv_constexprs(head_dim: int, window_left: bool, window_right: bool) -> dict:
    """The kernel's compile-time arguments (also what benchmarks/sass_report.py compiles); causal is window_right."""
    return dict(HEAD_DIM=head_dim, NUM_STAGES=configs.HOPPER_DKDV_FP8_STAGES, WINDOW_LEFT=window_left,
                WINDOW_RIGHT=window_right, CONSUMER_REGISTERS=configs.HOPPER_CONSUMER_REGISTERS[2],
                LOADER_REGISTERS=configs.HOPPER_LOADER_REGISTERS)


def _descales(descales: tuple, do_descale: torch.Tensor, blocks: int) -> torch.Tensor:
    """(q, k, v, dO) descales ((batch, nheads_k) per head, or (batch, nheads_k, n) blocks) as one contiguous float32
    (4, batch, nheads_k, blocks): a per-head descale repeated over the blocks, fewer blocks padded with ones (never
    read), so that the kernel indexes every descale with one set of strides."""
    batch, nheads_k = do_descale.shape[:2]
    out = torch.ones(4, batch, nheads_k, blocks, dtype=torch.float32, device=do_descale.device)
    for i, d in enumerate((*descales, do_descale)):
        d = d.float() if d.dim() == 3 else d.float()[:, :, None]
        out[i, :, :, :d.shape[2] if d.shape[2] > 1 else blocks] = d
    return out


def transposed_queries(x: torch.Tensor) -> torch.Tensor:
    """(B, H, D, Sq') copy of e4m3 (B, Sq, H, D) q or dO, Sq' = Sq rounded up to a 64-query block (zeros past Sq), each
    32 queries in the register operand's order (``forward_fp8_hopper._p_operand``): the K-major B operand of the
    products that contract over the queries."""
    return transposed_tokens(x, cdiv(x.shape[1], BLOCK_M) * BLOCK_M, permute=True)


def _transposed_descriptor(xt: torch.Tensor):
    """A TMA descriptor of a (B, H, D, Sq') transposed copy as (B * H * D, Sq') rows, in (D, BLOCK_M) tiles."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    batch, nheads, head_dim, width = xt.shape
    return TensorDescriptor(xt, [batch * nheads * head_dim, width], [xt.stride(2), 1], [head_dim, BLOCK_M],
                            tile_layout(head_dim, BLOCK_M, xt.dtype))


def launch_dkdv_fp8(dout, q, k, v, descales: tuple, out, lse, signs, opts: AttentionOptions,
                    granularity: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(dk, dv) in dout's dtype, contiguous, as ``fp8_backward.backward`` returns them (its arguments), for a call
    that :func:`hopper_fp8_dkdv_fits`."""
    from ..kernels.backward_fp8_hopper import dkdv_fp8_hopper_kernel

    dout, out = last_dim_contiguous(dout), last_dim_contiguous(out)
    batch, seqlen_q, nheads, head_dim = q.shape
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    do8, do_descale = quantize_rows(dout, None, nheads_k, SCALE_BLOCK, E4M3_MAX, granularity == "head", FP8_DTYPE)
    all_descales = _descales(descales, do_descale, cdiv(max(seqlen_q, seqlen_k), SCALE_BLOCK))
    # delta = rowsum(dO * O) on the rounded dO, the one dP^T sees (fp8_backward's)
    delta = (dequantize(do8, do_descale) * out.float()).sum(-1).transpose(1, 2).contiguous()  # (B, H, Sq)
    lse = lse.contiguous()
    # with a rotation dK stays float32 until it is rotated back
    dk = torch.empty(k.shape, dtype=torch.float32 if signs is not None else dout.dtype, device=q.device)
    dv = torch.empty(v.shape, dtype=dout.dtype, device=q.device)
    key_blocks = cdiv(seqlen_k, BLOCK_N)
    constexprs = hopper_fp8_dkdv_constexprs(head_dim, opts.window_left >= 0, opts.window_right >= 0)
    q_s, do_s, k_s, v_s = score_operands(q, do8, k, v, SCORES_16BIT)
    launch(dkdv_fp8_hopper_kernel, (key_blocks * batch * nheads_k,),
           token_descriptor(q_s, BLOCK_M), token_descriptor(do_s, BLOCK_M),
           _transposed_descriptor(transposed_queries(q)), _transposed_descriptor(transposed_queries(do8)),
           token_descriptor(k_s, BLOCK_N), token_descriptor(v_s, BLOCK_N), lse, delta, dk, dv, *all_descales,
           dk.stride(0), dk.stride(1), dk.stride(2), *all_descales.stride()[1:],
           seqlen_q, seqlen_k, nheads, nheads_k, key_blocks, opts.window_left, opts.window_right,
           opts.softmax_scale, opts.softmax_scale * LOG2E, **constexprs, num_warps=4)
    if signs is not None:
        # k was rotated as x M, so the gradient of x is the rotated one times M^T
        dk = dk @ rotation_matrix(signs, torch.float32).T
    return dk.to(dout.dtype), dv
