"""The Gluon dK/dV kernel against the float64 reference and the Triton dK/dV (errors), then its time."""
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from flashattn import configs, ops
from flashattn.options import AttentionOptions

torch.manual_seed(0)
MODE = sys.argv[1] if len(sys.argv) > 1 else "all"


def gluon_dkdv(q, k, v, do, out, lse, opts, block_m=64, stages=2):
    delta = (do.float() * out.float()).sum(-1).transpose(1, 2).contiguous()
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    ops._warp_specialized_dkdv(q, k, v, do, lse, delta, dk, dv, opts, configs.TileConfig(block_m, 64, 8, stages))
    return dk, dv


def reference(q, k, v, do, causal, scale):
    q64, k64, v64 = (x.detach().double().transpose(1, 2).requires_grad_() for x in (q, k, v))
    group = q.shape[2] // k.shape[2]
    kk, vv = (x.repeat_interleave(group, dim=1) for x in (k64, v64))
    s = q64 @ kk.transpose(-1, -2) * scale
    if causal:
        sq, sk = s.shape[-2:]
        mask = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(sk - sq)
        s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num()
    o = p @ vv
    dk, dv = torch.autograd.grad(o, (k64, v64), do.double().transpose(1, 2))
    return dk.transpose(1, 2), dv.transpose(1, 2)


if MODE in ("all", "check"):
    shapes = [(2, 1024, 1024, 4, 4, 256), (1, 113, 203, 4, 2, 256), (2, 1023, 1023, 4, 4, 128), (1, 1, 700, 4, 4, 256),
              (1, 700, 300, 2, 2, 256), (3, 257, 257, 2, 2, 64), (1, 2048, 2048, 8, 2, 128)]
    for shape in shapes:
        b, sq, sk, h, hk, d = shape
        for causal in (False, True):
            q = torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16)
            k, v = (torch.randn(b, sk, hk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            do = torch.randn_like(q)
            opts = AttentionOptions(d ** -0.5, -1, 0 if causal else -1)
            start = time.time()
            out, lse = ops._triton_forward(q, k, v, None, None, opts)
            dk_g, dv_g = gluon_dkdv(q, k, v, do, out, lse, opts)
            torch.cuda.synchronize()
            _, dk_t, dv_t, _ = ops._triton_backward(do, q, k, v, out, lse, None, None, opts)
            dk_r, dv_r = reference(q, k, v, do, causal, opts.softmax_scale)
            pairs = ((dk_g, dk_r), (dk_t, dk_r), (dv_g, dv_r), (dv_t, dv_r))
            errs = [(x.double() - r).abs().max().item() for x, r in pairs]
            ok = errs[0] <= 3 * errs[1] + 1e-4 and errs[2] <= 3 * errs[3] + 1e-4
            print(shape, "causal" if causal else "full", "dk g/t {:.2e} {:.2e} dv g/t {:.2e} {:.2e}".format(*errs),
                  f"{time.time() - start:.1f}s", "OK" if ok else "BAD", flush=True)

if MODE in ("all", "time"):
    from triton.testing import do_bench
    print("case triton_dkdv_ms gluon_dkdv_ms triton_dq_ms triton_bwd_tflops with_gluon_tflops", flush=True)
    for d in (256, 128):
        for causal in (False, True):
            for n in (2048, 4096, 16384):
                b, h = 16384 // n, 2048 // d
                q, k, v, do = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
                opts = AttentionOptions(d ** -0.5, -1, 0 if causal else -1)
                out, lse = ops._triton_forward(q, k, v, None, None, opts)
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(5):
                        ops._triton_backward(do, q, k, v, out, lse, None, None, opts)
                    torch.cuda.synchronize()
                times = {}
                for e in prof.events():
                    if e.device_type == torch.autograd.DeviceType.CUDA:
                        key = "dkdv" if "dkdv" in e.name else "dq" if "dq_kernel" in e.name else "other"
                        times[key] = times.get(key, 0) + e.device_time / 5 / 1e3
                delta = (do.float() * out.float()).sum(-1).transpose(1, 2).contiguous()
                dk, dv = torch.empty_like(k), torch.empty_like(v)
                tile = configs.TileConfig(64, 64, 8, 2)
                args = (q, k, v, do, lse, delta, dk, dv, opts, tile)
                g = do_bench(lambda args=args: ops._warp_specialized_dkdv(*args), warmup=100, rep=200)
                flops = 4 * b * h * n * n * d * (0.5 if causal else 1.0)
                total = sum(times.values())
                print(f"d{d} {'causal' if causal else 'full'} {n} {times.get('dkdv', 0):.3f} {g:.3f} "
                      f"{times.get('dq', 0):.3f} {2.5 * flops / total / 1e9:.1f} "
                      f"{2.5 * flops / (total - times.get('dkdv', 0) + g) / 1e9:.1f}", flush=True)
