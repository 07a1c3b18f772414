"""Kernel-only A/B of the Gluon forward (GPU machine): kernel files (argv: NAME=PATH, each a copy of
kernels/forward_hopper.py with a change) against the tree's ("new", first), swapped in under the launcher (plans
cleared at each swap), interleaved REPEAT times in ABBA order so that drift cancels, each case on its forced tile
(`flashattn blocks` notation; "table": the tile the table gives the call), on the bench grid's shapes (16k tokens,
heads x hdim = 2048, bf16). Prints TFLOP/s per variant and the outputs' largest difference from "new". A variant must
take the launcher's arguments.

    CASES="128 1 1024 128x64x8x3+ws+persistent;64 0 4096 128x128x8x3+ws+consumers3" REPEAT=4 \
        PYTHONPATH=src python3 benchmarks/fwd_ab.py wide=path/to/variant.py
"""
import contextlib
import os
import sys

import torch
import triton
from module_file import load_module_file

import flashattn.kernels.forward_hopper as current
from flashattn import blocks, configs, flash_attn_func, launcher

kernels = {"new": current.attention_forward_hopper_kernel}
for argument in sys.argv[1:]:  # NAME=PATH: a kernel file to load as variant NAME
    name, path = argument.split("=", 1)
    kernels[name] = load_module_file(path, f"variant_{name}").attention_forward_hopper_kernel
repeat = int(os.environ.get("REPEAT", "3"))
cases = [line.split() for line in os.environ["CASES"].split(";")]  # "hdim causal seqlen tile; ..."
print("hdim causal seqlen tile |", " | ".join(f"{name} TFLOP/s (each)" for name in kernels), "|",
      " ".join(f"{name}/new" for name in kernels if name != "new"), "| max |diff| against new", flush=True)
for head_dim, causal, seqlen, tile in cases:
    head_dim, causal, seqlen = int(head_dim), causal == "1", int(seqlen)
    config = None if tile == "table" else configs.TileConfig(*blocks.parse_candidates(tile)[0])
    heads, batch = 2048 // head_dim, max(1, 16384 // seqlen)
    torch.manual_seed(0)
    q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    flops = 4 * batch * heads * seqlen * seqlen * head_dim / (2 if causal else 1)
    times = {name: [] for name in kernels}
    outs = {}
    for round_ in range(repeat):
        for name in (list(kernels) if round_ % 2 == 0 else list(kernels)[::-1]):  # ABBA: drift cancels
            current.attention_forward_hopper_kernel = kernels[name]
            launcher.clear_plans()
            with configs.use_config("forward", config) if config else contextlib.nullcontext():
                flash_attn_func(q, k, v, causal=causal)  # records the plan
                outs[name] = flash_attn_func(q, k, v, causal=causal)  # a replay
                ms = triton.testing.do_bench(lambda q=q, k=k, v=v, c=causal: flash_attn_func(q, k, v, causal=c),
                                             warmup=100, rep=400)
            times[name].append(flops / ms / 1e9)
    diff = max((outs[n].float() - outs["new"].float()).abs().max().item() for n in kernels)
    mean = {n: sum(t) / len(t) for n, t in times.items()}
    print(head_dim, int(causal), seqlen, tile, "|", " | ".join(" ".join(f"{t:.1f}" for t in times[n]) for n in kernels),
          "|", " ".join(f"{mean[n] / mean['new']:.3f}" for n in kernels if n != "new"), "|", diff, flush=True)
current.attention_forward_hopper_kernel = kernels["new"]
