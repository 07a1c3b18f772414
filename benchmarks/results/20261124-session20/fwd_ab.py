"""Kernel-only A/B of the Gluon forward: session 19's kernel file (argv[1]) against the tree's, swapped in under the
launcher (plans cleared at each swap), interleaved REPEAT times, on the bench grid's shapes (16k tokens, heads x hdim
= 2048, bf16), hdim 64 on the table's three-consumer tile at every length. Prints TFLOP/s per variant and the
outputs' largest difference."""
import contextlib
import importlib.util
import os
import sys

import torch
import triton

import flashattn.kernels.forward_hopper as current
from flashattn import configs, flash_attn_func, launcher

spec = importlib.util.spec_from_file_location("old_forward_hopper", sys.argv[1])
old = importlib.util.module_from_spec(spec)
spec.loader.exec_module(old)
kernels = {"base": old.attention_forward_hopper_kernel, "new": current.attention_forward_hopper_kernel}
repeat = int(os.environ.get("REPEAT", "3"))
cases = [(64, False, 2048), (64, False, 4096), (64, False, 16384), (64, True, 4096), (64, True, 8192),
         (64, True, 16384), (64, True, 3000), (64, True, 1000), (128, True, 4096)]
# below 4k the table gives causal hdim 64 the Triton tile: force the Gluon one there
THREE_CONSUMERS = configs.TileConfig(128, 128, 8, 3, warp_specialized=True, three_consumers=True)
print("hdim causal seqlen | base TFLOP/s (each) | new TFLOP/s (each) | new/base | max |diff|")
for head_dim, causal, seqlen in cases:
    heads, batch = 2048 // head_dim, max(1, 16384 // seqlen)
    torch.manual_seed(0)
    q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    flops = 4 * batch * heads * seqlen * seqlen * head_dim / (2 if causal else 1)
    times = {name: [] for name in kernels}
    outs = {}
    for round_ in range(repeat):
        for name in (["base", "new"] if round_ % 2 == 0 else ["new", "base"]):  # ABBA: drift cancels
            current.attention_forward_hopper_kernel = kernels[name]
            launcher.clear_plans()
            with configs.use_config("forward", THREE_CONSUMERS) if head_dim == 64 else contextlib.nullcontext():
                outs[name] = flash_attn_func(q, k, v, causal=causal)
                ms = triton.testing.do_bench(lambda q=q, k=k, v=v, c=causal: flash_attn_func(q, k, v, causal=c),
                                             warmup=100, rep=400)
            times[name].append(flops / ms / 1e9)
    diff = (outs["new"].float() - outs["base"].float()).abs().max().item()
    mean = {n: sum(t) / len(t) for n, t in times.items()}
    print(head_dim, causal, seqlen, "|", " ".join(f"{t:.1f}" for t in times["base"]), "|",
          " ".join(f"{t:.1f}" for t in times["new"]), "|", f"{mean['new'] / mean['base']:.3f}", "|", diff)
current.attention_forward_hopper_kernel = kernels["new"]
