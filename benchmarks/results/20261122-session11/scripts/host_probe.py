"""Where a short forward call's time goes: host enqueue time per call, GPU kernel time (profiler), do_bench."""
import time

import torch
from torch.profiler import ProfilerActivity, profile

from flashattn.bench import PROVIDERS, anchor_grid
from flashattn.demo import median_seconds

device = torch.device("cuda")
cases = [c for c in anchor_grid(head_dims=(64, 128, 256), seqlens=(512, 1024))]
print("case provider host_us gpu_us kernels bench_us", flush=True)
for case in cases:
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(case.batch, case.seqlen, case.nheads, case.head_dim, device=device, dtype=torch.bfloat16,
                           generator=g) for _ in range(3))
    for provider in ("flashattn", "sdpa_flash", "sdpa_cudnn"):
        fn = PROVIDERS[provider](q, k, v, case.causal)
        with torch.no_grad():
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
            n = 200
            start = time.perf_counter()
            for _ in range(n):
                fn()
            host = (time.perf_counter() - start) / n
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(20):
                    fn()
                torch.cuda.synchronize()
            kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
            gpu = sum(e.device_time for e in kernels) / 20
            names = sorted({e.name[:40] for e in kernels})
            bench = median_seconds(fn, device)
        print(f"d{case.head_dim} {'causal' if case.causal else 'full'} {case.seqlen} {provider} {host * 1e6:.1f} "
              f"{gpu:.1f} {len(kernels) // 20} {bench * 1e6:.1f} {names}", flush=True)
