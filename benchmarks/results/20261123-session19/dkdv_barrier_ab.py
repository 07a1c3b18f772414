"""Kernel-only A/B on main: the key-slice dK/dV with one barrier freeing a stage (this tree) against session 18's
two (variants/s18.py: commit 0b1f286's kernels/backward_hopper.py, its relative import made absolute), on one tile
a program; then the whole backward with this tree's kernel (flash_attn_func's backward, do_bench).
Every row checks that the two kernels' dK and dV are equal."""
import functools
import importlib.util
import sys
from pathlib import Path

import torch
import triton
from ab_inputs import backward_inputs

from flashattn import configs, flash_attn_func, ops

HERE = Path(__file__).parent


def load(name):
    spec = importlib.util.spec_from_file_location(name, HERE / "variants" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    s18 = load("s18")
    cases = [(64, 2048, False, 64), (64, 4096, False, 64), (64, 16384, False, 64), (64, 2048, True, 64),
             (64, 8192, True, 64), (128, 2048, False, 32), (128, 4096, False, 32), (128, 4096, True, 32)]
    for head_dim, seqlen, causal, block_m in cases:
        batch, heads, q, k, v, dout, scale, lse, delta, opts = backward_inputs(head_dim, seqlen, causal)
        config = configs.TileConfig(block_m, 128, 8, 3, warp_specialized=True, key_slices=True)
        line = f"hdim {head_dim} {'causal ' if causal else ''}{seqlen}:"
        results = []
        for name in ("s18", "tree"):
            dk, dv = torch.empty_like(k), torch.empty_like(v)
            if name == "tree":
                fn = functools.partial(ops._warp_specialized_dkdv, q, k, v, dout, lse, delta, dk, dv, opts, config)
            else:
                key_blocks = triton.cdiv(seqlen, 128)
                fn = functools.partial(
                    s18.dkdv_key_slices_kernel[(key_blocks * batch * heads,)],
                    ops._token_descriptor(q, block_m), ops._token_descriptor(k, 128), ops._token_descriptor(v, 128),
                    ops._token_descriptor(dout, block_m), lse, delta, dk, dv, dk.stride(0), dk.stride(1),
                    dk.stride(2), seqlen, seqlen, heads, heads, key_blocks, scale, scale * 1.4426950408889634,
                    **ops.warp_specialized_dkdv_constexprs(config, head_dim, causal), num_warps=4)
            fn()
            torch.cuda.synchronize()
            ms = triton.testing.do_bench(fn, warmup=100, rep=400)
            results.append((ms, dk.clone(), dv.clone()))
            flops = 8 * batch * heads * seqlen * seqlen * head_dim * (0.5 if causal else 1.0)
            line += f"  {name} {ms * 1e3:.1f} us {flops / ms / 1e9:.1f} TFLOP/s"
        same = torch.equal(results[0][1], results[1][1]) and torch.equal(results[0][2], results[1][2])
        line += f"  equal {same}"
        # the whole backward through the library, with this tree's kernel forced
        qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
        with configs.use_config("dkdv", config):
            o = flash_attn_func(qg, kg, vg, causal=causal)
            bwd = functools.partial(torch.autograd.grad, o, (qg, kg, vg), dout, retain_graph=True)
            bwd()
            ms = triton.testing.do_bench(bwd, warmup=100, rep=400)
        line += f"  | whole backward {1.25 * flops / ms / 1e9:.1f} TFLOP/s"  # 2.5 forwards of 4 BHS^2D
        print(line, flush=True)


if __name__ == "__main__":
    sys.exit(main())
