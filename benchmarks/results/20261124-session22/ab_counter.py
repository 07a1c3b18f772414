"""Call I: dense non-causal calls on a persistent grid in the static tile order (the tree: program p takes p, p + grid,
...) against tiles from the counter (DYNAMIC_TILES forced on), the table's tiles, ABBA over REPEAT rounds. Call H's
packed calls (counter, one Q tile) had run ahead of dense ones (static, two Q tiles) at 512-1k: 461 / 532 against 442 /
520 TFLOP/s at hdim 128."""
import os

import torch
import triton

from flashattn import flash_attn_func, launcher, ops

constexprs = ops.warp_specialized_constexprs
mode = {"counter": False}


def patched(config, head_dim, causal, is_varlen):
    values = constexprs(config, head_dim, causal, is_varlen)
    if mode["counter"] and config.persistent:
        values["DYNAMIC_TILES"] = True
    return values


ops.warp_specialized_constexprs = patched
repeat = int(os.environ.get("REPEAT", "4"))
print("hdim seqlen | static TFLOP/s | counter TFLOP/s | counter/static | max |diff|", flush=True)
for head_dim in (64, 128, 256):
    for seqlen in (512, 1024, 2048, 4096):
        heads, batch = 2048 // head_dim, 16384 // seqlen
        torch.manual_seed(0)
        q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        flops = 4 * batch * heads * seqlen * seqlen * head_dim
        times, outs = {"static": [], "counter": []}, {}
        for round_ in range(repeat):
            for name in (("static", "counter") if round_ % 2 == 0 else ("counter", "static")):
                mode["counter"] = name == "counter"
                launcher.clear_plans()
                flash_attn_func(q, k, v)
                outs[name] = flash_attn_func(q, k, v)
                ms = triton.testing.do_bench(lambda q=q, k=k, v=v: flash_attn_func(q, k, v), warmup=100, rep=400)
                times[name].append(flops / ms / 1e9)
        mean = {n: sum(t) / len(t) for n, t in times.items()}
        diff = (outs["counter"].float() - outs["static"].float()).abs().max().item()
        print(head_dim, seqlen, "|", " ".join(f"{t:.1f}" for t in times["static"]), "|",
              " ".join(f"{t:.1f}" for t in times["counter"]), "|", f"{mean['counter'] / mean['static']:.3f}", "|",
              diff, flush=True)
