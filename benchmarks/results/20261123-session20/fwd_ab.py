"""Kernel-only A/B of the Gluon forward: kernel files (argv: NAME=PATH, session 19's as "base") against the
tree's ("new"), swapped in under the launcher (plans cleared at each swap), interleaved REPEAT times in ABBA order,
on the bench grid's shapes (16k tokens, heads x hdim = 2048, bf16), hdim 64 on the table's three-consumer tile at
every length. Prints TFLOP/s per variant and the outputs' largest difference from base."""
import contextlib
import importlib.util
import os
import sys

import torch
import triton

import flashattn.kernels.forward_hopper as current
from flashattn import configs, flash_attn_func, launcher

kernels = {}
for argument in sys.argv[1:]:  # NAME=PATH: a kernel file to load as variant NAME ("base" first)
    name, path = argument.split("=", 1)
    spec = importlib.util.spec_from_file_location(f"variant_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    kernels[name] = module.attention_forward_hopper_kernel
kernels["new"] = current.attention_forward_hopper_kernel
repeat = int(os.environ.get("REPEAT", "3"))
cases = [(64, False, 2048), (64, False, 4096), (64, False, 16384), (64, True, 4096), (64, True, 8192),
         (64, True, 16384), (64, True, 3000), (64, True, 1000), (128, False, 4096), (128, True, 4096),
         (256, True, 4096)]
# below 4k the table gives causal hdim 64 the Triton tile: force the Gluon one there
THREE_CONSUMERS = configs.TileConfig(128, 128, 8, 3, warp_specialized=True, three_consumers=True)
print("hdim causal seqlen |", " | ".join(f"{name} TFLOP/s (each)" for name in kernels), "|",
      " ".join(f"{name}/base" for name in kernels if name != "base"), "| max |diff| against base")
for head_dim, causal, seqlen in cases:
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
            with configs.use_config("forward", THREE_CONSUMERS) if head_dim == 64 else contextlib.nullcontext():
                outs[name] = flash_attn_func(q, k, v, causal=causal)
                ms = triton.testing.do_bench(lambda q=q, k=k, v=v, c=causal: flash_attn_func(q, k, v, causal=c),
                                             warmup=100, rep=400)
            times[name].append(flops / ms / 1e9)
    diff = max((outs[n].float() - outs["base"].float()).abs().max().item() for n in kernels)
    mean = {n: sum(t) / len(t) for n, t in times.items()}
    print(head_dim, causal, seqlen, "|", " | ".join(" ".join(f"{t:.1f}" for t in times[n]) for n in kernels), "|",
          " ".join(f"{mean[n] / mean['base']:.3f}" for n in kernels if n != "base"), "|", diff)
current.attention_forward_hopper_kernel = kernels["new"]
