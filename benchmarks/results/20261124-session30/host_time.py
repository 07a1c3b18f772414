"""Host time of a dense and a packed forward call on equal lengths (hdim 128, 16 heads, 16k tokens): calls issued
back to back without synchronizing, timed on the host once the queue is full, against the GPU time of the same calls
(do_bench). A call whose host time exceeds its GPU time is timed by the host in do_bench."""
import functools
import time

import torch
import triton

from flashattn import flash_attn_func, flash_attn_varlen_func

HEADS, HEAD_DIM, TOKENS = 16, 128, 16384
for n in (128, 256, 512):
    batch = TOKENS // n
    q, k, v = (torch.randn(batch * n, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    cu = torch.arange(0, batch + 1, device="cuda", dtype=torch.int32) * n
    calls = {"dense": functools.partial(flash_attn_func, *(x.view(batch, n, HEADS, HEAD_DIM) for x in (q, k, v))),
             "packed": functools.partial(flash_attn_varlen_func, q, k, v, cu, cu, n, n)}
    for name, call in calls.items():
        for _ in range(20):
            call()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(200):
            call()
        host_us = (time.perf_counter() - start) / 200 * 1e6
        torch.cuda.synchronize()
        gpu_us = 1000 * triton.testing.do_bench(call, warmup=50, rep=300)
        print(f"{n} {name}: host {host_us:.1f} us a call (200 issued), do_bench {gpu_us:.1f} us", flush=True)
