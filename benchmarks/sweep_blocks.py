"""Time flashattn's kernels over candidate tile configs on the local GPU; print the best per case.

Each candidate is checked against torch's SDPA before it is timed: a config that compiles to a wrong
kernel (Triton has been seen to) is reported as WRONG and never wins. Winners go into
``src/flashattn/configs.py`` by hand, after the GPU test suite passes with them.

    PYTHONPATH=src python3 benchmarks/sweep_blocks.py --phase forward --head-dims 64 128
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
import triton.testing

from flashattn import flash_attn_func
from flashattn.configs import TileConfig, use_config

CANDIDATES = {
    "forward": [(128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (128, 128, 8, 2), (128, 64, 4, 4),
                (64, 64, 4, 3), (128, 32, 4, 3), (128, 128, 4, 2), (64, 128, 4, 3), (128, 64, 8, 2)],
    "dkdv": [(32, 128, 4, 2), (64, 128, 8, 2), (32, 64, 4, 3), (64, 64, 4, 2), (64, 128, 4, 3),
             (32, 128, 8, 3), (128, 128, 8, 2)],
    "dq": [(128, 64, 8, 2), (64, 64, 4, 2), (128, 32, 4, 3), (64, 128, 8, 2), (128, 128, 8, 2),
           (128, 64, 4, 3), (128, 64, 8, 3)],
}
CANDIDATES_256 = {
    "forward": [(64, 64, 4, 2), (128, 64, 8, 2), (128, 32, 8, 2), (64, 32, 4, 2), (128, 64, 8, 1), (64, 64, 4, 3)],
    "dkdv": [(32, 64, 4, 2), (64, 64, 8, 2), (32, 32, 4, 2), (64, 32, 8, 2), (32, 128, 8, 2), (64, 128, 8, 1)],
    "dq": [(64, 32, 4, 2), (64, 64, 8, 2), (128, 32, 8, 2), (128, 64, 8, 1), (64, 64, 4, 2), (128, 64, 8, 2)],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phase", choices=list(CANDIDATES), nargs="+", default=list(CANDIDATES))
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--seqlen", type=int, default=4096)
    parser.add_argument("--json", default=None, help="write all timings to this file")
    args = parser.parse_args()
    rows = []
    for head_dim in args.head_dims:
        for causal in (False, True):
            batch, nheads = 16384 // args.seqlen, 2048 // head_dim
            q, k, v = (torch.randn(batch, args.seqlen, nheads, head_dim, device="cuda", dtype=torch.bfloat16,
                                   requires_grad=True) for _ in range(3))
            dout = torch.randn_like(q)
            qh, kh, vh = (x.detach().transpose(1, 2) for x in (q, k, v))
            expected = F.scaled_dot_product_attention(qh, kh, vh, is_causal=causal).transpose(1, 2)
            flops = 4 * batch * nheads * args.seqlen**2 * head_dim / (2 if causal else 1)
            for phase in args.phase:
                table = CANDIDATES_256 if head_dim > 128 else CANDIDATES
                for candidate in table[phase]:
                    config = TileConfig(*candidate)
                    try:
                        with use_config(phase, config):
                            out = flash_attn_func(q, k, v, causal=causal)
                            error = (out - expected).abs().max().item()
                            if phase == "forward":
                                ok = error < 0.03
                                ms = triton.testing.do_bench(
                                    lambda q=q, k=k, v=v, causal=causal: flash_attn_func(q, k, v, causal=causal),
                                    return_mode="median")
                                tflops = flops / ms / 1e9
                            else:
                                grads = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
                                ok = error < 0.03 and all(torch.isfinite(g).all() for g in grads)
                                ms = triton.testing.do_bench(
                                    lambda out=out, q=q, k=k, v=v, dout=dout: torch.autograd.grad(
                                        out, (q, k, v), dout, retain_graph=True),
                                    return_mode="median")
                                tflops = 2.5 * flops / ms / 1e9
                        status = "ok" if ok else "WRONG"
                    except Exception as exc:  # out of shared memory, compile failure: report and go on
                        ms, tflops, status = None, None, f"{type(exc).__name__}"
                    rows.append(dict(phase=phase, head_dim=head_dim, causal=causal, config=candidate, ms=ms,
                                     tflops=tflops, status=status))
                    print(f"{phase:8} d{head_dim:<4} causal={int(causal)} {candidate} "
                          f"{'' if tflops is None else f'{tflops:6.1f} TFLOP/s'} {status}", flush=True)
    print("\nbest:")
    for phase in args.phase:
        for head_dim in args.head_dims:
            for causal in (False, True):
                cands = [r for r in rows if (r["phase"], r["head_dim"], r["causal"]) == (phase, head_dim, causal)
                         and r["status"] == "ok"]
                if cands:
                    best = max(cands, key=lambda r: r["tflops"])
                    print(f"{phase:8} d{head_dim:<4} causal={int(causal)} {best['config']} {best['tflops']:.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
