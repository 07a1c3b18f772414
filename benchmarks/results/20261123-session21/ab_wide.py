"""A/B of the Gluon kernels' 16-byte result stores (ops._room_for_wide_stores forced False against the tree's rule),
timed as the bench times a backward (torch.autograd.grad with retain_graph) and a forward, interleaved REPEAT times
in ABBA order, each case with an optional forced dQ tile (`flashattn blocks` notation). CASES: "hdim causal seqlen
[dq-tile]; ...". Prints TFLOP/s per variant and wide/narrow."""
import contextlib
import os

import torch
import triton

from flashattn import blocks, configs, flash_attn_func, launcher, ops

rule = ops._room_for_wide_stores
variants = {"narrow": lambda *args: False, "wide": rule}
repeat = int(os.environ.get("REPEAT", "4"))
print("hdim causal seqlen dq | fwd narrow / wide | bwd narrow / wide | fwd wide/narrow, bwd wide/narrow", flush=True)
for case in os.environ["CASES"].split(";"):
    head_dim, causal, seqlen, *tile = case.split()
    head_dim, causal, seqlen = int(head_dim), causal == "1", int(seqlen)
    dq_tile = configs.TileConfig(*blocks.parse_candidates(tile[0])[0]) if tile else None
    heads, batch = 2048 // head_dim, max(1, 16384 // seqlen)
    torch.manual_seed(0)
    q, k, v, dout = (torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16)
                     for _ in range(4))
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    flops = 4 * batch * heads * seqlen * seqlen * head_dim / (2 if causal else 1)
    times = {name: ([], []) for name in variants}
    for round_ in range(repeat):
        for name in (list(variants) if round_ % 2 == 0 else list(variants)[::-1]):  # ABBA
            ops._room_for_wide_stores = variants[name]
            launcher.clear_plans()
            with configs.use_config("dq", dq_tile) if dq_tile else contextlib.nullcontext():
                out = flash_attn_func(q, k, v, causal=causal)
                torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
                fwd = triton.testing.do_bench(lambda q=q, k=k, v=v, c=causal: flash_attn_func(q, k, v, causal=c),
                                              warmup=50, rep=300)
                bwd = triton.testing.do_bench(
                    lambda o=out, q=q, k=k, v=v, g=dout: torch.autograd.grad(o, (q, k, v), g, retain_graph=True),
                    warmup=50, rep=300)
            times[name][0].append(flops / fwd / 1e9)
            times[name][1].append(2.5 * flops / bwd / 1e9)
    ops._room_for_wide_stores = rule
    mean = {name: [sum(t) / len(t) for t in pair] for name, pair in times.items()}
    print(head_dim, int(causal), seqlen, tile[0] if tile else "table", "|",
          " / ".join(" ".join(f"{t:.1f}" for t in times[n][0]) for n in variants), "|",
          " / ".join(" ".join(f"{t:.1f}" for t in times[n][1]) for n in variants), "|",
          f"{mean['wide'][0] / mean['narrow'][0]:.3f} {mean['wide'][1] / mean['narrow'][1]:.3f}", flush=True)
