"""Probe: the fp32 decode error with softcap 30 and ALiBi, by split count (GPU)."""
import dataclasses
import os
import sys

os.environ["FLASHATTN_BACKEND"] = "triton"
sys.path.insert(0, "tests")
import torch
from kvcache_cases import KVProblem
from test_kvcache import check

base = KVProblem(batch=2, nheads=8, nheads_k=8, head_dim=256, capacity=1024, cache_seqlens=(1000, 3),
                 batch_cache=5, options={"softcap": 30.0, "alibi_slopes": "per-head"})
for splits in (1, 2, 0):
    for opts in (base.options, {"softcap": 30.0}, {"alibi_slopes": "per-head"}):
        try:
            check(dataclasses.replace(base, num_splits=splits, options=opts), torch.float32, "cuda")
            print(splits, opts, "pass", flush=True)
        except AssertionError as e:
            print(splits, opts, "FAIL", str(e).splitlines()[0], flush=True)
