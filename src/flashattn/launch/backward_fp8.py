"""The FP8 backward's launch on sm90 (``kernels/backward_fp8_hopper.py`` for dK/dV,
``kernels/backward_fp8_dq_hopper.py`` for dQ, or ``kernels/backward_fp8_fused_hopper.py`` for both): dO quantized by
the quantizer's kernels with delta in the same pass, the descales as one set of strides, the float16 and transposed
copies, the main kernels, then dQ and dK rotated back and rounded to dO's dtype (``kernels/backward_fp8_passes.py``).

Every step is a Triton launch on tensors the call allocates with ``torch.empty`` (or ``zeros``), which is what lets
``ops_fp8`` replay the whole backward from a launch plan: the host time of a short call is then the plan's key and
a dozen launches, not the arguments' binding and the descriptors' checks of each.
"""

from __future__ import annotations

import torch

from .. import configs
from ..backend import interpreting
from ..fp8_format import E4M3_MAX, FP8_DTYPE, SCALE_BLOCK
from ..options import AttentionOptions
from .common import LOG2E, cdiv, last_dim_contiguous, tile_layout, tma_compatible, token_descriptor, token_rows
from .forward import l2_section_units
from .forward_fp8 import transposed_tokens
from .launcher import launch, zeros
from .quantize_fp8 import quantize_rows_and_delta

BLOCK_M = 64  # queries a block: the rows of a dS descale (fp8_backward.DS_BLOCK_M)
BLOCK_N = SCALE_BLOCK  # keys a program (dK/dV), a block (dQ): one k and v descale block, the keys of a dS descale
DQ_ROWS = SCALE_BLOCK  # queries a dQ program: two consumers' 64, one q and dO descale block
# S^T = K Q^T and dP^T = V dO^T on float16 copies of the e4m3 tensors (exact conversions; float16 wgmma sums in about
# float32) rather than e4m3 wgmma, whose sums over the head dim keep about 13 fraction bits, truncated: modelled on
# the CPU (products exact, each 32-wide step truncated below the largest term), those put dK and dV 2e-3 to 3e-3
# (norm-relative) off the reference path at 256 x 256, hdim 128, with the tile products exact, and fresh accumulators
# per 32 still 1.5e-3; the tile products' own truncation, 7e-4. The e4m3 build (False) is the faster one to measure.
SCORES_16BIT = True


def hopper_fp8_backward_fits(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         opts: AttentionOptions) -> bool:
    """Whether the Gluon kernels compute this backward: dense 16-bit dO on an sm90 GPU, head dims 64 and 128 (two
    float32 64 x D gradients and a tile product a dK/dV consumer fit 240 registers), no softcap (its tanh term stays
    on the reference path), no position frame, a non-empty call, and q, k, v readable by TMA as (tokens, heads
    * head_dim) rows. Causal and window masks, GQA/MQA and both descale granularities are the kernel's."""
    return (q.is_cuda and dout.dtype in (torch.bfloat16, torch.float16) and q.shape[-1] in (64, 128)
            and opts.softcap == 0 and opts.frame is None and q.numel() > 0 and k.numel() > 0
            and configs.gpu_family(q.device) == "hopper" and not interpreting()
            and all(token_rows(x) is not None for x in (q, k, v)) and tma_compatible(q, k, v))


def score_operands(q, do8, k, v, scores_16bit: bool) -> tuple[torch.Tensor, ...]:
    """The operands of S^T and dP^T: the e4m3 tensors, or their float16 copies (``SCORES_16BIT``)."""
    return float16_copies(q, do8, k, v) if scores_16bit else (q, do8, k, v)


def hopper_fp8_dkdv_constexprs(head_dim: int, window_left: bool, window_right: bool, dq: bool = False,
                               fused: bool = False) -> dict:
    """The dK/dV kernel's compile-time arguments (``dq``: the dQ kernel's; ``fused``: the dK/dV/dQ kernel's, at the
    head dims of :func:`takes_fused_dq`), also what benchmarks/sass_report.py compiles; causal is window_right."""
    if fused:
        stages = configs.HOPPER_DKDV_DQ_FP8_STAGES[head_dim]
    else:
        stages = configs.HOPPER_DQ_FP8_STAGES[head_dim] if dq else configs.HOPPER_DKDV_FP8_STAGES
    return dict(HEAD_DIM=head_dim, NUM_STAGES=stages, WINDOW_LEFT=window_left, WINDOW_RIGHT=window_right,
                CONSUMER_REGISTERS=configs.HOPPER_CONSUMER_REGISTERS[2],
                LOADER_REGISTERS=configs.HOPPER_LOADER_REGISTERS)


def takes_fused_dq(head_dim: int, opts: AttentionOptions) -> bool:
    """Whether dQ is computed inside the dK/dV kernel (``kernels/backward_fp8_fused_hopper.py``) rather than by a
    second pass: at the head dims configs gives that kernel stages (64: at 128 its loops spill and the two passes are
    faster, docs/perf-notes.md), for calls without ``deterministic``, since its TMA reductions add dQ into float32 in
    any order (``AttentionOptions.repeatable``)."""
    return head_dim in configs.HOPPER_DKDV_DQ_FP8_STAGES and not opts.repeatable


def _descales(descales: tuple, do_descale: torch.Tensor, blocks: int) -> tuple[torch.Tensor, ...]:
    """(q, k, v, dO) descales ((batch, nheads_k) per head, or (batch, nheads_k, n) blocks) as four contiguous float32
    (batch, nheads_k, blocks): a per-head descale repeated over the blocks, fewer blocks padded with ones (never
    read), so that the kernels index every descale with one set of strides."""
    from ..kernels.backward_fp8_passes import descale_blocks_kernel

    batch, nheads_k = do_descale.shape[:2]
    out = []
    for d in (*descales, do_descale):
        per_head = d.dim() == 2
        packed = torch.empty(batch, nheads_k, blocks, dtype=torch.float32, device=d.device)
        launch(descale_blocks_kernel, (nheads_k, batch), d, packed, blocks if per_head else d.shape[2], blocks,
               d.stride(0), d.stride(1), 0 if per_head else d.stride(2), BLOCK=configs.DESCALE_BLOCKS_TILE)
        out.append(packed)
    return tuple(out)


def float16_copies(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Float16 copies of contiguous e4m3 tensors (``e4m3_to_float16_kernel``)."""
    from ..kernels.backward_fp8_passes import e4m3_to_float16_kernel

    copies = []
    for x in tensors:
        y = torch.empty(x.shape, dtype=torch.float16, device=x.device)
        block, warps = configs.E4M3_TO_FLOAT16_TILE
        launch(e4m3_to_float16_kernel, (cdiv(x.numel(), block),), x, y, x.numel(), BLOCK=block, num_warps=warps)
        copies.append(y)
    return tuple(copies)


def rotated_back(grad: torch.Tensor, rotation, dtype: torch.dtype) -> torch.Tensor:
    """Contiguous float32 ``grad`` (..., head_dim) in ``dtype``, first taken back to the inputs' basis when
    ``rotation`` (the quantizer's (S, col_scale) in bfloat16, :func:`quantize_fp8.rotation_operands`) is given: the
    reference path's float32 product, then one rounding (``rotate_back_kernel``)."""
    from ..kernels.backward_fp8_passes import rotate_back_kernel

    head_dim = grad.shape[-1]
    out = torch.empty(grad.shape, dtype=dtype, device=grad.device)
    rows = grad.numel() // head_dim
    block_r, tiles, warps = configs.ROTATE_BACK_TILE
    s, col_scale = rotation if rotation is not None else (grad, grad)  # any pointers: never read without ROTATE
    launch(rotate_back_kernel, (cdiv(rows, block_r * tiles),), grad, s, col_scale, out, rows, HEAD_DIM=head_dim,
           BLOCK_D=configs.padded_head_dim(head_dim), BLOCK_R=block_r, TILES=tiles, ROTATE=rotation is not None,
           UPCAST=interpreting(), num_warps=warps)
    return out


def transposed_queries(x: torch.Tensor) -> torch.Tensor:
    """(B, H, D, Sq') copy of e4m3 (B, Sq, H, D) q or dO, Sq' = Sq rounded up to a 64-query block (zeros past Sq), each
    32 queries in the register operand's order (``forward_fp8_hopper._p_operand``): the K-major B operand of the
    products that contract over the queries."""
    return transposed_tokens(x, cdiv(x.shape[1], BLOCK_M) * BLOCK_M, permute=True)


def transposed_keys(k: torch.Tensor, pairs: bool = False) -> torch.Tensor:
    """(B, Hk, D, Sk') copy of e4m3 (B, Sk, Hk, D) k, Sk' = Sk rounded up to a 128-key block (zeros past Sk): the
    K-major B operand of dQ = dS K. Each 32 keys in the register operand's order, as the FP8 forward's V^T, for the
    dQ kernel, whose dS has the forward's P layout; with ``pairs`` each 16 keys as 0, 8, 1, 9, ..., 7, 15, for the
    fused kernel, which stores the keys g and g + 8 of its dS^T accumulator as one 16-bit word."""
    return transposed_tokens(k, cdiv(k.shape[1], BLOCK_N) * BLOCK_N, permute=not pairs, pairs=pairs)


def _transposed_descriptor(xt: torch.Tensor, block: int):
    """A TMA descriptor of a (B, H, D, S') transposed copy as (B * H * D, S') rows, in (D, block) tiles."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    batch, nheads, head_dim, width = xt.shape
    return TensorDescriptor(xt, [batch * nheads * head_dim, width], [xt.stride(2), 1], [head_dim, block],
                            tile_layout(head_dim, block, xt.dtype))


def _dq_accumulator(dq: torch.Tensor):
    """A TMA descriptor of float32 (B, Sq, H, D) dQ as (B * Sq, H * D) rows in (64 queries, D / 2) tiles: a fused
    consumer's head-dim half of a query block. A batch's last block also covers the next batch's first rows, into
    which it adds its exact zeros (dS is 0 past seqlen_q); TMA clips the tensor's end."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    batch, seqlen_q, nheads, head_dim = dq.shape
    return TensorDescriptor(dq, [batch * seqlen_q, nheads * head_dim], [nheads * head_dim, 1],
                            [BLOCK_M, head_dim // 2], tile_layout(BLOCK_M, head_dim // 2, torch.float32))


def launch_backward_fp8(dout, q, k, v, descales: tuple, out, lse, rotation, opts: AttentionOptions,
                        granularity: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) in dout's dtype, contiguous, as ``fp8_backward.backward`` returns them, for a call that
    :func:`hopper_fp8_backward_fits`; its arguments, except ``rotation``: the forward's rotation as the quantizer's
    (S, col_scale) operands in bfloat16, or None."""
    from ..kernels.backward_fp8_dq_hopper import dq_fp8_hopper_kernel
    from ..kernels.backward_fp8_hopper import dkdv_fp8_hopper_kernel

    dout, out = last_dim_contiguous(dout), last_dim_contiguous(out)
    batch, seqlen_q, nheads, head_dim = q.shape
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    # dO in e4m3 and, in the same pass, delta = rowsum(dO * O) on the rounded dO, the one dP sees (fp8_backward's)
    do8, do_descale, delta = quantize_rows_and_delta(dout, out, nheads_k, SCALE_BLOCK, E4M3_MAX, granularity == "head",
                                                     FP8_DTYPE)
    all_descales = _descales(descales, do_descale, cdiv(max(seqlen_q, seqlen_k), SCALE_BLOCK))
    descale_strides = all_descales[0].stride()
    lse = lse.contiguous()
    # with a rotation dQ and dK stay float32 until they are rotated back
    grad_dtype = torch.float32 if rotation is not None else dout.dtype
    dk = torch.empty(k.shape, dtype=grad_dtype, device=q.device)
    dv = torch.empty(v.shape, dtype=dout.dtype, device=q.device)
    window_left, window_right = opts.window_left >= 0, opts.window_right >= 0
    q_s, do_s, k_s, v_s = score_operands(q, do8, k, v, SCORES_16BIT)
    k_desc, v_desc = token_descriptor(k_s, BLOCK_N), token_descriptor(v_s, BLOCK_N)
    q_desc, do_desc = token_descriptor(q_s, BLOCK_M), token_descriptor(do_s, BLOCK_M)
    masks = (opts.window_left, opts.window_right, opts.softmax_scale, opts.softmax_scale * LOG2E)
    key_blocks = cdiv(seqlen_k, BLOCK_N)
    # under a right bound without a left one the tiles are unequal and run in L2 sections of pairs
    # (kernels/backward_fp8_hopper._key_tile, backward_fp8_dq_hopper._query_tile), sized by the bytes that every tile
    # of a pair reads again: for the key tiles its GQA group's Q and dO (16-bit and e4m3 transposed copies), for the
    # query tiles its kv head's K and V (16-bit) and K^T. Elsewhere the kernels take no sections, and the 1 passed
    # compiles in as a constant (the JIT's "== 1" specialization), leaving their builds as they were.
    sectioned = window_right and not window_left
    group = nheads // nheads_k
    key_sections = l2_section_units(batch * nheads_k, 2 * group * seqlen_q * head_dim * (q_s.element_size() + 1),
                                    configs.HOPPER_L2_SECTION_BYTES) if sectioned else 1
    key_block_arguments = (_transposed_descriptor(transposed_queries(q), BLOCK_M),
                           _transposed_descriptor(transposed_queries(do8), BLOCK_M), k_desc, v_desc)
    gradient_arguments = (lse, delta, dk, dv, *all_descales, dk.stride(0), dk.stride(1), dk.stride(2),
                          *descale_strides, seqlen_q, seqlen_k, nheads, nheads_k, key_blocks, key_sections, *masks)
    if takes_fused_dq(head_dim, opts):
        from ..kernels.backward_fp8_fused_hopper import dkdv_dq_fp8_hopper_kernel

        # float32 dQ in q's layout, added into (zeroed by a plan's replay too), rotated back or rounded below
        dq = zeros(q.shape, torch.float32, q.device)
        launch(dkdv_dq_fp8_hopper_kernel, (key_blocks * batch * nheads_k,), q_desc, do_desc, *key_block_arguments,
               _transposed_descriptor(transposed_keys(k, pairs=True), BLOCK_N), _dq_accumulator(dq),
               *gradient_arguments, **hopper_fp8_dkdv_constexprs(head_dim, window_left, window_right, fused=True),
               num_warps=4)
    else:
        dq = torch.empty(q.shape, dtype=grad_dtype, device=q.device)
        launch(dkdv_fp8_hopper_kernel, (key_blocks * batch * nheads_k,), q_desc, do_desc, *key_block_arguments,
               *gradient_arguments, **hopper_fp8_dkdv_constexprs(head_dim, window_left, window_right), num_warps=4)
        row_tiles = cdiv(seqlen_q, DQ_ROWS)
        row_sections = l2_section_units(batch * nheads, (2 * q_s.element_size() + 1) * seqlen_k * head_dim / group,
                                        configs.HOPPER_CAUSAL_L2_SECTION_BYTES) if sectioned else 1
        launch(dq_fp8_hopper_kernel, (row_tiles * batch * nheads,), q_desc, do_desc, k_desc, v_desc,
               _transposed_descriptor(transposed_keys(k), BLOCK_N), lse, delta, dq, *all_descales,
               dq.stride(0), dq.stride(1), dq.stride(2), *descale_strides,
               seqlen_q, seqlen_k, nheads, nheads_k, row_tiles, row_sections, *masks,
               **hopper_fp8_dkdv_constexprs(head_dim, window_left, window_right, dq=True), num_warps=4)
    # q and k were rotated as x M, so the gradient of x is the rotated one times M^T
    if rotation is not None:
        dk = rotated_back(dk, rotation, dout.dtype)
    if dq.dtype != dout.dtype:
        dq = rotated_back(dq, rotation, dout.dtype)
    return dq, dk, dv
