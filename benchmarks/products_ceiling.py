"""The products' ceiling of the Hopper forward: its two tile products alone, on its tiles and pipeline.

A plain 8192^3 bf16 matmul on random data is not the ceiling of attention's products: FA4 and the Hopper forward both
run above it at hdim 256 (benchmarks/results/h200-dense.json). This kernel is the forward with its softmax taken out:
the same loader and K/V ring (``forward_hopper.q_ring``, ``key_ring``, ``load_key_block``), two consumer
warpgroups of 64 rows, block j's Q K^T in flight with block j-1's P V, and P the scores rounded to 16 bits (their
register-operand conversion, the work P V needs whatever the softmax). What it reaches on the benchmark grid's shapes
is what the forward's products, tiles and pipeline allow; docs/perf-notes.md ("The two floors") takes it as the
compute floor's ceiling.

    PYTHONPATH=src python benchmarks/products_ceiling.py            # hdim 64, 128, 256 at 1k, 4k, 16k tokens a sequence

Prints one row a shape (TFLOP/s counted as the forward's, 4 x batch x heads x seqlen^2 x head dim) beside the
forward itself (``flash_attn_func``, non-causal) and the 8192^3 matmul, all measured in the same run. Needs an sm90
GPU.
"""

from __future__ import annotations

import argparse
import functools
import sys

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from flashattn import configs, flash_attn_func
from flashattn.kernels.forward_hopper import (
    ROWS_PER_WARPGROUP,
    _block_scores,
    _last_product,
    key_ring,
    load_key_block,
    q_ring,
    register_operand_layout,
    store_rows,
    to_16_bits,
    wgmma_layout,
)
from flashattn.launch.common import token_descriptor

CONSUMERS = gl.constexpr(2)
TILE_ROWS = 2 * 64  # a program's query rows: two consumers' 64


@gluon.jit
def _loader(q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_ready, k_ready, v_ready, k_free, v_free, seqlen, nheads,
            row_tiles, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr):
    tile = gl.program_id(0)
    batch_head = tile // row_tiles
    batch = batch_head // nheads
    head = batch_head % nheads
    q_row = batch * seqlen + (tile % row_tiles) * (CONSUMERS * ROWS_PER_WARPGROUP)
    mbarrier.expect(q_ready.index(0), CONSUMERS * q_desc.block_type.nbytes)
    for c in gl.static_range(CONSUMERS):
        tma.async_copy_global_to_shared(q_desc, [q_row + c * ROWS_PER_WARPGROUP, head * HEAD_DIM], q_ready.index(0),
                                        q_smem.index(c))
    for j in range(seqlen // BLOCK_N):
        load_key_block(k_desc, v_desc, k_bufs, v_bufs, k_ready, v_ready, k_free, v_free, j, batch, batch * seqlen,
                       j * BLOCK_N, head * HEAD_DIM, NUM_STAGES)


@gluon.jit
def _consumer(q_smem, k_bufs, v_bufs, q_ready, k_ready, v_ready, k_free, v_free, Out, stride_om, seqlen, nheads,
              row_tiles, WARP_GROUP: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr,
              NUM_STAGES: gl.constexpr):
    tile = gl.program_id(0)
    batch_head = tile // row_tiles
    batch = batch_head // nheads
    head = batch_head % nheads
    first_row = (tile % row_tiles) * (CONSUMERS * ROWS_PER_WARPGROUP) + WARP_GROUP * ROWS_PER_WARPGROUP
    q = q_smem.index(WARP_GROUP)
    operand: gl.constexpr = register_operand_layout(HEAD_DIM)
    s_zero = gl.zeros([ROWS_PER_WARPGROUP, BLOCK_N], gl.float32, wgmma_layout(BLOCK_N))
    acc = gl.zeros([ROWS_PER_WARPGROUP, HEAD_DIM], gl.float32, wgmma_layout(HEAD_DIM))
    mbarrier.wait(q_ready.index(0), 0)
    # the first block: its Q K^T alone
    mbarrier.wait(k_ready.index(0), 0)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(_block_scores(q, k_bufs, 0, s_zero, False), ))
    mbarrier.arrive(k_free.index(0), count=1)
    p_op = gl.convert_layout(to_16_bits(s, q.dtype), operand)
    stage = 0
    phase = 0
    # then block j's Q K^T in flight with block j-1's P V, as the forward's _next_block
    for j in range(1, seqlen // BLOCK_N):
        prev_stage = stage
        prev_phase = phase
        stage = j % NUM_STAGES
        phase = (j // NUM_STAGES) & 1
        mbarrier.wait(k_ready.index(stage), phase)
        mbarrier.wait(v_ready.index(prev_stage), prev_phase)
        s = _block_scores(q, k_bufs, stage, s_zero, False)
        acc = warpgroup_mma(p_op, v_bufs.index(prev_stage), acc, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s, ))
        mbarrier.arrive(k_free.index(stage), count=1)
        next_op = gl.convert_layout(to_16_bits(s, q.dtype), operand)
        acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p_op))
        mbarrier.arrive(v_free.index(prev_stage), count=1)
        p_op = next_op
    acc = _last_product(v_bufs, v_ready, v_free, stage, phase, acc, p_op, False)
    store_rows(Out, acc, batch * seqlen, first_row, head * HEAD_DIM, stride_om, seqlen, HEAD_DIM, False)


@gluon.jit
def products_kernel(q_desc, k_desc, v_desc, Out, stride_om, seqlen, nheads, row_tiles, HEAD_DIM: gl.constexpr,
                    BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr, CONSUMER_REGISTERS: gl.constexpr,
                    LOADER_REGISTERS: gl.constexpr):
    """O = sum over key blocks of round16(Q K_j^T) V_j for one 128-row tile a program (dense, seqlen a multiple of
    128 and of BLOCK_N; Out float32 (tokens, heads * HEAD_DIM))."""
    q_smem, q_ready, _, _ = q_ring(q_desc, HEAD_DIM, 1, CONSUMERS)
    k_bufs, v_bufs, k_ready, v_ready, k_free, v_free = key_ring(k_desc, v_desc, HEAD_DIM, BLOCK_N, NUM_STAGES,
                                                                CONSUMERS)
    gl.warp_specialize([
        (_consumer, (q_smem, k_bufs, v_bufs, q_ready, k_ready, v_ready, k_free, v_free, Out, stride_om, seqlen,
                     nheads, row_tiles, 0, HEAD_DIM, BLOCK_N, NUM_STAGES)),
        (_consumer, (q_smem, k_bufs, v_bufs, q_ready, k_ready, v_ready, k_free, v_free, Out, stride_om, seqlen,
                     nheads, row_tiles, 1, HEAD_DIM, BLOCK_N, NUM_STAGES)),
        (_loader, (q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_ready, k_ready, v_ready, k_free, v_free, seqlen,
                   nheads, row_tiles, HEAD_DIM, BLOCK_N, NUM_STAGES)),
    ], [4, 1], [CONSUMER_REGISTERS, LOADER_REGISTERS])


def forward_tile(head_dim: int) -> configs.TileConfig:
    """The Hopper forward's non-causal tile at 16k tokens for ``head_dim`` (hdim 64 on two consumers: this kernel's)."""
    return configs.lookup("hopper", "forward", head_dim, False, torch.bfloat16, seqlen=16384, hopper=True)


def products(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: configs.TileConfig) -> torch.Tensor:
    """The kernel's O (float32, q's shape) for dense (batch, seqlen, heads, head dim) bf16 q, k and v."""
    batch, seqlen, nheads, head_dim = q.shape
    if seqlen % TILE_ROWS or seqlen % config.block_n:
        raise ValueError(f"seqlen: expected a multiple of {TILE_ROWS} and of {config.block_n}, got {seqlen}")
    out = torch.empty(q.shape, device=q.device, dtype=torch.float32)
    row_tiles = seqlen // TILE_ROWS
    products_kernel[(row_tiles * batch * nheads,)](
        token_descriptor(q, 64), token_descriptor(k, config.block_n), token_descriptor(v, config.block_n), out,
        out.stride(1), seqlen, nheads, row_tiles, HEAD_DIM=head_dim, BLOCK_N=config.block_n,
        NUM_STAGES=config.num_stages, CONSUMER_REGISTERS=configs.HOPPER_CONSUMER_REGISTERS[2],
        LOADER_REGISTERS=configs.HOPPER_LOADER_REGISTERS, num_warps=4)
    return out


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """What the kernel computes, in PyTorch: the scores rounded to q's dtype, their product with V summed in float32."""
    scores = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()).to(q.dtype).float()
    return torch.einsum("bhqk,bkhd->bqhd", scores, v.float())


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--seqlens", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--tokens", type=int, default=16384, help="batch x seqlen")
    parser.add_argument("--hidden", type=int, default=2048, help="heads x head dim")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        print("products_ceiling: needs an sm90 GPU", file=sys.stderr)
        return 2
    a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    matmul = 2 * 8192**3 / triton.testing.do_bench(lambda: a @ b, warmup=25, rep=200) / 1e9
    print(f"# {torch.cuda.get_device_name()}  bf16 matmul 8192^3 {matmul:.0f} TFLOP/s")
    print("| hdim | seqlen | tile | products TFLOP/s | forward TFLOP/s | forward / products | products / matmul |")
    print("|---|---|---|---|---|---|---|")
    for head_dim in args.head_dims:
        config = forward_tile(head_dim)
        for seqlen in args.seqlens:
            batch, nheads = args.tokens // seqlen, args.hidden // head_dim
            q, k, v = (torch.randn(batch, seqlen, nheads, head_dim, device="cuda", dtype=torch.bfloat16)
                       for _ in range(3))
            flop = 4 * batch * nheads * seqlen**2 * head_dim
            rate = flop / triton.testing.do_bench(functools.partial(products, q, k, v, config), rep=200) / 1e9
            forward = flop / triton.testing.do_bench(functools.partial(flash_attn_func, q, k, v), rep=200) / 1e9
            print(f"| {head_dim} | {seqlen} | 128 x {config.block_n}, {config.num_stages} stages | {rate:.0f} | "
                  f"{forward:.0f} | {forward / rate:.2f} | {rate / matmul:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
