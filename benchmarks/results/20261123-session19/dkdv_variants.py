"""Run with persistent-key-slices.patch applied (README.md). Kernel-only timing of dK/dV key-slice variants (files in
variants/, each a copy of kernels/backward_hopper.py with one change) against session 18's kernel
(old_backward_hopper.py), one tile a program, and this tree's kernel on its persistent grid. Each variant's dK and
dV are compared with the old kernel's."""
import functools
import importlib.util
import sys
from pathlib import Path

import torch
import triton
from ab_inputs import backward_inputs
from dkdv_ab import launch_old

from flashattn import configs, ops

HERE = Path(__file__).parent


def load(path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def launch_variant(module, persistent, q, k, v, dout, lse, delta, dk, dv, scale, config, causal):
    batch, seqlen_q, nheads, head_dim = q.shape
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    key_blocks = triton.cdiv(seqlen_k, 128)
    tiles = key_blocks * batch * nheads_k
    programs = min(tiles, torch.cuda.get_device_properties(0).multi_processor_count) if persistent else tiles
    constexprs = ops.warp_specialized_dkdv_constexprs(config, head_dim, causal)
    constexprs["KV_BUFFERS"] = 2 if persistent else 1
    module.dkdv_key_slices_kernel[(programs,)](
        ops._token_descriptor(q, config.block_m), ops._token_descriptor(k, 128), ops._token_descriptor(v, 128),
        ops._token_descriptor(dout, config.block_m), lse, delta, dk, dv, dk.stride(0), dk.stride(1), dk.stride(2),
        seqlen_q, seqlen_k, nheads, nheads_k, key_blocks, tiles, scale, scale * 1.4426950408889634, **constexprs,
        num_warps=4)


def main(names):
    variants = {name: load(HERE / "variants" / f"{name}.py") for name in names}
    for head_dim, seqlen, causal, block_m in [(64, 2048, False, 64), (64, 4096, False, 64), (64, 8192, True, 64),
                                              (128, 2048, False, 32),
                                              (128, 4096, False, 32)]:
        batch, heads, q, k, v, dout, scale, lse, delta, opts = backward_inputs(head_dim, seqlen, causal)
        config = configs.TileConfig(block_m, 128, 8, 3, warp_specialized=True, key_slices=True)
        runs = {"old": functools.partial(launch_old, q, k, v, dout, lse, delta)}
        for name, module in variants.items():
            for persistent in (False, ) if name.startswith("old_") else (False, True):  # old_*: one tile a program
                runs[name + ("+persistent" if persistent else "")] = functools.partial(
                    launch_variant, module, persistent, q, k, v, dout, lse, delta)
        runs["tree+persistent"] = None
        flops = 4 * 2 * batch * heads * seqlen * seqlen * head_dim * (0.5 if causal else 1.0)
        line = f"hdim {head_dim} {'causal ' if causal else ''}{seqlen}:"
        base = None
        for name, run in runs.items():
            dk = torch.empty_like(k)
            dv = torch.empty_like(v)
            if run is None:
                tree = configs.TileConfig(block_m, 128, 8, 3, warp_specialized=True, key_slices=True, persistent=True)
                fn = functools.partial(ops._warp_specialized_dkdv, q, k, v, dout, lse, delta, dk, dv, opts, tree)
            else:
                fn = functools.partial(run, dk, dv, scale, config, causal)
            fn()
            torch.cuda.synchronize()
            ms = triton.testing.do_bench(fn, warmup=100, rep=400)
            if base is None:
                base = (dk.float(), dv.float())
            diff = max((dk.float() - base[0]).abs().max().item(), (dv.float() - base[1]).abs().max().item())
            line += f"\n    {name:28s} {ms * 1e3:8.1f} us {flops / ms / 1e9:6.1f} TFLOP/s  max diff {diff:.1e}"
        print(line, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
