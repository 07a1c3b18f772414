"""A/B of the Gluon forward's L2 sections (ops.WS_L2_SECTION_BYTES) on ANCHORS-grid shapes, TFLOP/s."""
import os
import sys

import torch

from flashattn import ops
from flashattn.bench import anchor_grid, measure

device = torch.device("cuda")
budgets = {f"{m}M": int(m) << 20 for m in os.environ.get("BUDGETS", "2,4,8,16").split(",")}
reference = os.environ.get("REFERENCE", "") == "1"
seqlens = tuple(int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "512,1024,4096,8192,16384").split(","))
cases = anchor_grid(head_dims=(128, 256), seqlens=seqlens)
print("case", *budgets, "sdpa_cudnn", "sdpa_flash", flush=True)
for case in cases:
    row = []
    for budget in budgets.values():
        ops.WS_L2_SECTION_BYTES = budget
        m, _ = measure("flashattn", case, device, ("fwd",), None)
        row.append(f"{m.fwd_tflops:.1f}" if m.fwd_tflops else m.error)
    for provider in ("sdpa_cudnn", "sdpa_flash") if reference else ():
        m, _ = measure(provider, case, device, ("fwd",), None)
        row.append(f"{m.fwd_tflops:.1f}" if m.fwd_tflops else str(m.error))
    print(f"d{case.head_dim} {'causal' if case.causal else 'full'} {case.seqlen}", *row, flush=True)
