"""Run with persistent-key-slices.patch applied (README.md). Kernel-only A/B of the key-slice dK/dV: session 18's
kernel (old_backward_hopper.py, one tile a program) against this tree's (one tile a program, and persistent). Times
only the dK/dV launch (triton.testing.do_bench), after checking that the three agree."""
import functools
import importlib.util
import sys
from pathlib import Path

import torch
import triton
from ab_inputs import backward_inputs

from flashattn import configs, ops

spec = importlib.util.spec_from_file_location("old_bh", Path(__file__).with_name("old_backward_hopper.py"))
old_bh = importlib.util.module_from_spec(spec)
spec.loader.exec_module(old_bh)


def launch_old(q, k, v, dout, lse, delta, dk, dv, scale, config, causal):
    batch, seqlen_q, nheads, head_dim = q.shape
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    key_blocks = triton.cdiv(seqlen_k, 128)
    constexprs = ops.warp_specialized_dkdv_constexprs(config, head_dim, causal)
    constexprs.pop("KV_BUFFERS")
    old_bh.dkdv_key_slices_kernel[(key_blocks * batch * nheads_k,)](
        ops._token_descriptor(q, config.block_m), ops._token_descriptor(k, 128), ops._token_descriptor(v, 128),
        ops._token_descriptor(dout, config.block_m), lse, delta, dk, dv, dk.stride(0), dk.stride(1), dk.stride(2),
        seqlen_q, seqlen_k, nheads, nheads_k, key_blocks, scale, scale * 1.4426950408889634, **constexprs,
        num_warps=4)


def launch_new_grid(q, k, v, dout, lse, delta, dk, dv, scale, config, causal):
    from flashattn.kernels.backward_hopper import dkdv_key_slices_kernel

    batch, seqlen_q, nheads, head_dim = q.shape
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    key_blocks = triton.cdiv(seqlen_k, 128)
    tiles = key_blocks * batch * nheads_k
    dkdv_key_slices_kernel[(tiles,)](
        ops._token_descriptor(q, config.block_m), ops._token_descriptor(k, 128), ops._token_descriptor(v, 128),
        ops._token_descriptor(dout, config.block_m), lse, delta, dk, dv, dk.stride(0), dk.stride(1), dk.stride(2),
        seqlen_q, seqlen_k, nheads, nheads_k, key_blocks, tiles, scale, scale * 1.4426950408889634,
        **ops.warp_specialized_dkdv_constexprs(config, head_dim, causal), num_warps=4)


def main():
    for head_dim, seqlen, causal, block_m in [(64, 2048, False, 64), (64, 4096, False, 64), (64, 8192, True, 64),
                                              (128, 2048, False, 32), (128, 4096, False, 32)]:
        batch, heads, q, k, v, dout, scale, lse, delta, opts = backward_inputs(head_dim, seqlen, causal)
        results = {}
        for name in ("old", "new", "new-2buf", "new-persistent"):
            config = configs.TileConfig(block_m, 128, 8, 3, warp_specialized=True, key_slices=True,
                                        persistent=name != "new")
            dk = torch.empty_like(k)
            dv = torch.empty_like(v)
            if name == "old":
                fn = functools.partial(launch_old, q, k, v, dout, lse, delta, dk, dv, scale, config, causal)
            elif name == "new-2buf":  # two K/V buffers, one tile a program
                fn = functools.partial(launch_new_grid, q, k, v, dout, lse, delta, dk, dv, scale, config, causal)
            else:
                fn = functools.partial(ops._warp_specialized_dkdv, q, k, v, dout, lse, delta, dk, dv, opts, config)
            fn()
            torch.cuda.synchronize()
            results[name] = (triton.testing.do_bench(fn, warmup=100, rep=400), dk.clone(), dv.clone())
        base = results["old"]
        flops = 4 * 2 * batch * heads * seqlen * seqlen * head_dim * (0.5 if causal else 1.0)
        line = f"hdim {head_dim} {'causal ' if causal else ''}{seqlen}:"
        for name, (ms, dk, dv) in results.items():
            agree = max((dk.float() - base[1].float()).abs().max().item(),
                        (dv.float() - base[2].float()).abs().max().item())
            line += f"  {name} {ms * 1e3:.1f} us {flops / ms / 1e9:.1f} TFLOP/s (max diff {agree:.2e})"
        print(line, flush=True)


if __name__ == "__main__":
    sys.exit(main())
