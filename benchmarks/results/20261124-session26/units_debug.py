"""Call D: which outputs of a units launch go wrong. GLUON_PROBLEMS-like steps run with UNITS forced (splits off),
one and two consumers; per (sequence, kv head): the program and unit it ran as, and the max error of its rows
against the float64 reference (the group's row with the largest error named)."""

import sys

import torch

sys.path.insert(0, "tests")
from kvcache_cases import KVProblem, build, expected, to_paged  # noqa: E402

from flashattn import decode_ops  # noqa: E402
from flashattn.kvcache import flash_attn_with_kvcache  # noqa: E402

PROBLEMS = [  # the first faulted with two consumers
    KVProblem(batch=3, nheads=32, nheads_k=8, head_dim=128, capacity=4200, cache_seqlens=(4097, 1, 1000), seqlen_new=0),
    KVProblem(batch=2, nheads=32, nheads_k=8, head_dim=128, capacity=8192, cache_seqlens=(8191, 4000)),
    KVProblem(batch=2, nheads=16, nheads_k=16, head_dim=128, capacity=700, cache_seqlens=(700, 64), seqlen_new=0),
    KVProblem(batch=16, nheads=32, nheads_k=8, head_dim=128, capacity=2048, page_size=128,
              cache_seqlens=(2047,) * 15 + (100,)),
]

decode_ops.GLUON_DECODE_SPLITS = 1
decode_ops.GLUON_DECODE_UNITS_TWO_CONSUMERS = True
ONLY = sys.argv[1:]  # "2 2": consumers and units of one run on the first problem (the sanitizer's)
PROBLEMS = PROBLEMS[:1] if ONLY else PROBLEMS
decode_ops.GLUON_DECODE_MAX_PROGRAMS_PER_PROCESSOR = float("inf")
decode_ops.GLUON_DECODE_MAX_BYTES_PER_PROCESSOR = float("inf")
for problem in PROBLEMS:
    inputs = build(problem, torch.bfloat16, "cuda", 0)
    oracle = expected(inputs, upcast=True)
    call_inputs = to_paged(inputs, problem.page_size) if problem.page_size else inputs
    for consumers in ((int(ONLY[0]),) if ONLY else (1, 2)):
        for units in ((int(ONLY[1]),) if ONLY else (2, 3)):
            decode_ops.GLUON_DECODE_CONSUMERS, decode_ops.GLUON_DECODE_UNITS = consumers, units
            arguments = dict(call_inputs)
            arguments["k_cache"], arguments["v_cache"] = arguments["k_cache"].clone(), arguments["v_cache"].clone()
            out, _ = flash_attn_with_kvcache(**arguments, return_softmax_lse=True)
            torch.cuda.synchronize()
            error = (out.double() - oracle["out"]).abs()[:, 0].amax(-1)  # (batch, heads)
            group = problem.nheads // problem.nheads_k
            total = problem.batch * problem.nheads_k
            programs = -(-total // units)
            bad = []
            for b in range(problem.batch):
                for h in range(problem.nheads_k):
                    rows = error[b, h * group:(h + 1) * group]
                    if rows.max() > 2e-2:
                        unit = b * problem.nheads_k + h
                        bad.append(f"b{b}h{h}(p{unit % programs}u{unit // programs} len{problem.cache_seqlens[b]} "
                                   f"rows {[round(x, 3) for x in rows.tolist()]})")
            print(f"{problem} consumers {consumers} units {units}: max {error.max().item():.3e}; "
                  f"{len(bad)} of {total} units wrong: {' '.join(bad[:6])}", flush=True)
