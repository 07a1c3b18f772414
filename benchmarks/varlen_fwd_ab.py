"""Kernel-only A/B of the Gluon forward on packed (varlen) calls (GPU machine), against the dense call on the same
tokens, as `flashattn bench --varlen` lays them out (16k tokens, heads x hdim = 2048, bf16; mixed lengths from
`bench.mixed_lengths`). Variants (argv, first is the baseline of the ratios):

    new            the tree's kernel and rules
    NAME=PATH      a copy of kernels/forward_hopper.py (same arguments), swapped in under the launcher
    +qb1           suffix: one Q tile a program (ops._forward_q_buffers), packed calls' rule until version 30
    @TILE          suffix, last: packed calls forced onto TILE in `flashattn blocks` notation
                   (128x128x8x2+ws+persistent); the dense call keeps the table's

Each variant's output is checked against a float32 reference per sequence: the largest error, and the (sequence,
head) pairs whose error is over 8x the first variant's largest (a wrong tile). Rounds interleave the variants in
ABBA order. CASES: "hdim causal mean mixed; ...". CHECK_ONLY=1: the checks, no timing (for compute-sanitizer);
TOKENS: the packed tokens (16384).

    CASES="128 0 512 1;128 1 512 1" ROUNDS=3 PYTHONPATH=src python3 benchmarks/varlen_fwd_ab.py \
        new new+qb1 new@128x128x8x2+ws+persistent
"""
import contextlib
import functools
import os
import sys

import torch
import triton
from module_file import load_module_file

import flashattn.kernels.forward_hopper as current
from flashattn import bench, blocks, configs, flash_attn_func, flash_attn_varlen_func, launcher, ops

TOKENS = int(os.environ.get("TOKENS", "16384"))
tree_kernel = current.attention_forward_hopper_kernel
tree_q_buffers = ops._forward_q_buffers
_forced = contextlib.ExitStack()  # the forced tile of the variant in use


def load_variant(spec: str):
    """(kernel, q-buffer rule, forced tile or None) of a variant spec."""
    spec, _, tile = spec.partition("@")
    base, *suffixes = spec.split("+")
    kernel = tree_kernel
    if "=" in base:
        name, path = base.split("=", 1)
        kernel = load_module_file(path, f"variant_{name}").attention_forward_hopper_kernel
    rule = tree_q_buffers
    if "qb1" in suffixes:
        def rule(config, head_dim):
            return 1
    return kernel, rule, (configs.TileConfig(*blocks.parse_candidates(tile)[0]) if tile else None)


def use_variant(variant, packed: bool = True) -> None:
    """Swap ``variant`` in; its forced tile only for packed calls (``packed``)."""
    kernel, rule, tile = variant
    current.attention_forward_hopper_kernel, ops._forward_q_buffers = kernel, rule
    _forced.close()
    if tile is not None and packed:
        _forced.enter_context(configs.use_config("forward", tile))
    launcher.clear_plans()


def reference(q, k, v, lengths, causal):
    out = torch.empty_like(q, dtype=torch.float32)
    start = 0
    for n in lengths:
        rows = slice(start, start + n)
        qs, ks, vs = (x[rows].transpose(0, 1).float() for x in (q, k, v))
        out[rows] = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=causal).transpose(0, 1)
        start += n
    return out


def wrong_pairs(error, lengths, limit):
    """(sequence, head, rows) whose largest error exceeds ``limit``."""
    found, start = [], 0
    for index, n in enumerate(lengths):
        per_head = error[start:start + n].amax(dim=(0, 2)) if n else error.new_zeros(error.shape[1])
        for head in torch.nonzero(per_head > limit).flatten().tolist():
            bad_rows = torch.nonzero(error[start:start + n, head].amax(-1) > limit).flatten()
            found.append((index, n, head, bad_rows.min().item(), bad_rows.max().item()))
        start += n
    return found


# the dense calls on a packed call's own lengths are timed only where they are few: each is a launch of its own, so
# many short ones would time the host, not the GPU
MAX_LENGTH_GROUPS = 4


def dense_same_lengths_ms(lengths, heads, head_dim, causal) -> float:
    """The dense kernel's time over the same sequences: one call per distinct length (its sequences as the batch),
    summed. Against this a packed call's ratio is the cost of packing alone; against the bench's dense call on all
    tokens at the mean length it also carries how the kernel's rate depends on the length (causal: a tile's start and
    end weigh more on shorter rows)."""
    total = 0.0
    for n in sorted(set(lengths)):
        batch = lengths.count(n)
        q, k, v = (torch.randn(batch, n, heads, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        total += triton.testing.do_bench(functools.partial(flash_attn_func, q, k, v, causal=causal), warmup=100,
                                         rep=400)
    return total


def main() -> None:
    specs = sys.argv[1:] or ["new"]
    variants = {spec: load_variant(spec) for spec in specs}
    rounds = int(os.environ.get("ROUNDS", "3"))
    check_only = os.environ.get("CHECK_ONLY") == "1"
    cases = [line.split() for line in os.environ["CASES"].split(";")]
    print("hdim causal mean mixed | dense TFLOP/s |", " | ".join(f"{s} TFLOP/s" for s in specs), "|",
          " ".join(f"{s}/dense" for s in specs), "| max error each (wrong pairs)", flush=True)
    for head_dim, causal, mean, mixed in cases:
        head_dim, causal, mean, mixed = int(head_dim), causal == "1", int(mean), mixed == "1"
        heads = 2048 // head_dim
        lengths = bench.mixed_lengths(TOKENS, mean) if mixed else [mean] * (TOKENS // mean)
        torch.manual_seed(0)
        q, k, v = (torch.randn(TOKENS, heads, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        cu_seqlens = torch.tensor([0, *lengths], device="cuda").cumsum(0).to(torch.int32)
        longest = max(lengths)
        flops = sum(4.0 * heads * n * n * head_dim for n in lengths) / (2 if causal else 1)
        packed_call = functools.partial(flash_attn_varlen_func, q, k, v, cu_seqlens, cu_seqlens, longest, longest,
                                        causal=causal)
        expected = reference(q, k, v, lengths, causal)
        checks = {}
        for spec, variant in variants.items():
            use_variant(variant)
            out = packed_call()
            torch.cuda.synchronize()
            checks[spec] = (out.float() - expected).abs()
        limit = 8 * checks[specs[0]].max().item()
        notes = [f"{checks[s].max().item():.2e} ({len(wrong_pairs(checks[s], lengths, limit))})" for s in specs]
        for spec in specs:
            for pair in wrong_pairs(checks[spec], lengths, limit)[:6]:
                print(f"  {spec}: sequence {pair[0]} (length {pair[1]}) head {pair[2]} rows {pair[3]}-{pair[4]} "
                      "wrong", flush=True)
        if check_only:
            print(head_dim, int(causal), mean, int(mixed), "| checks only |", " | ".join(notes), flush=True)
            continue
        use_variant(variants[specs[0]], packed=False)
        batch = TOKENS // mean
        dense = [x.view(batch, mean, heads, head_dim) for x in (q, k, v)]
        dense_flops = 4.0 * heads * batch * mean * mean * head_dim / (2 if causal else 1)
        dense_ms = triton.testing.do_bench(functools.partial(flash_attn_func, *dense, causal=causal), warmup=100,
                                           rep=400)
        times = {spec: [] for spec in specs}
        for round_ in range(rounds):
            for spec in (specs if round_ % 2 == 0 else specs[::-1]):  # ABBA: drift cancels
                use_variant(variants[spec])
                packed_call()  # records the plan
                ms = triton.testing.do_bench(packed_call, warmup=100, rep=400)
                times[spec].append(flops / ms / 1e9)
        dense_tflops = dense_flops / dense_ms / 1e9
        means = {s: sum(t) / len(t) for s, t in times.items()}
        print(head_dim, int(causal), mean, int(mixed), f"| {dense_tflops:.1f} |",
              " | ".join(" ".join(f"{t:.1f}" for t in times[s]) for s in specs), "|",
              " ".join(f"{means[s] / dense_tflops:.3f}" for s in specs), "|", " ".join(notes), flush=True)
        if len(set(lengths)) <= MAX_LENGTH_GROUPS:
            same_tflops = flops / dense_same_lengths_ms(lengths, heads, head_dim, causal) / 1e9
            print(f"  dense calls on the same lengths ({len(set(lengths))}): {same_tflops:.1f} TFLOP/s;",
                  " ".join(f"{s}/those {means[s] / same_tflops:.3f}" for s in specs), flush=True)
    use_variant((tree_kernel, tree_q_buffers, None))


if __name__ == "__main__":
    main()
