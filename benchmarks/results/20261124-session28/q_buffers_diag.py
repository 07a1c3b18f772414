"""Call B: where packed non-causal calls with two Q tiles go wrong (session 22's fault, seen again in call A on
sequences of 89-91 tokens). Each case forces two Q tiles on packed calls and reports the wrong (sequence, head)
pairs, and for each: whether its rows were never written (NaN: the output's memory is NaN-filled first), or equal
another pair's reference (a tile computed with another tile's plan or Q). Ran on a242334, whose
ops._forward_q_buffers took three arguments (the rule after it takes the key length too)."""
import functools
import sys

import torch

sys.path.insert(0, "benchmarks")
from varlen_fwd_ab import reference  # noqa: E402  (the same per-sequence float32 reference as the A/B)

from flashattn import bench, configs, flash_attn_func, flash_attn_varlen_func, launcher, ops  # noqa: E402

HEADS, HDIM = 16, 128
tree_rule, tree_constexprs = ops._forward_q_buffers, ops.warp_specialized_constexprs


def two_q(config, head_dim, is_varlen):
    return tree_rule(config, head_dim, False)


def patched_constexprs(overrides, *args, **kwargs):
    return dict(tree_constexprs(*args, **kwargs), **overrides)


def check(name, lengths, causal=False, dense=False, overrides=None, q_buffers=2):
    ops._forward_q_buffers = two_q if q_buffers == 2 else tree_rule
    ops.warp_specialized_constexprs = (functools.partial(patched_constexprs, overrides) if overrides
                                       else tree_constexprs)
    launcher.clear_plans()
    tokens = sum(lengths)
    torch.manual_seed(1)
    q, k, v = (torch.randn(tokens, HEADS, HDIM, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    cu = torch.tensor([0, *lengths], device="cuda").cumsum(0).to(torch.int32)
    expected = reference(q, k, v, lengths, causal)
    torch.full_like(q, float("nan"))  # freed: the call's output most likely reuses this block
    # the table's tile for 512-token calls, forced: short calls would otherwise take another kernel
    with configs.use_config("forward", configs.TileConfig(128, 128, 8, 2, warp_specialized=True, persistent=True)):
        if dense:
            dense_inputs = (x.view(len(lengths), lengths[0], HEADS, HDIM) for x in (q, k, v))
            out = flash_attn_func(*dense_inputs, causal=causal).reshape(tokens, HEADS, HDIM)
        else:
            out = flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths), causal=causal)
    torch.cuda.synchronize()
    error = (out.float() - expected).abs()
    wrong, start = [], 0
    for index, n in enumerate(lengths):
        for head in range(HEADS):
            block = error[start:start + n, head]
            if n and (block.max() > 0.05 or block.isnan().any()):
                got = out[start:start + n, head].float()
                kind = "unwritten" if got.isnan().all() else ("partly NaN" if got.isnan().any() else "values")
                bad = torch.nonzero((block.amax(-1) > 0.05) | block.isnan().any(-1)).flatten()
                # another (sequence, head)'s reference at the same rows?
                match = None
                for other_start, other_n, other in ((sum(lengths[:j]), m, j) for j, m in enumerate(lengths)):
                    if other_n < n:
                        continue
                    for other_head in range(HEADS):
                        ref = expected[other_start:other_start + n, other_head]
                        if (ref - got).abs().max() < 0.05:
                            match = (other, other_head)
                wrong.append(f"seq {index} (len {n}) head {head} rows {bad.min().item()}-{bad.max().item()} {kind}"
                             + (f" = ref of seq {match[0]} head {match[1]}" if match else ""))
        start += n
    print(f"{name}: {len(wrong)} wrong pairs of {len(lengths) * HEADS}", flush=True)
    for line in wrong[:8]:
        print("   ", line, flush=True)


mixed = bench.mixed_lengths(16384, 512)
check("mixed 512 non-causal, one Q tile (control)", mixed, q_buffers=1)
check("mixed 512 non-causal", mixed)
check("mixed 512 causal", mixed, causal=True)
check("mixed 512 non-causal, counter off", mixed, overrides=dict(DYNAMIC_TILES=False))
check("mixed 512 non-causal, 4-byte stores", mixed, overrides=dict(WIDE_STORES=False))
check("all 89 non-causal", [89] * 64)
check("all 89 causal", [89] * 64, causal=True)
check("all 40 non-causal", [40] * 64)
check("all 128 non-causal", [128] * 64)
check("all 200 non-causal", [200] * 64)
check("dense 89 non-causal (Gluon persistent)", [89] * 64, dense=True)
check("dense 200 non-causal (Gluon persistent)", [200] * 64, dense=True)
check("long then 89s", [1000, 89, 1000, 89, 1000, 89, 1000, 89])
check("89s then long", [89, 89, 89, 89, 1000, 1000, 1000, 1000])
