"""Call G: the Gluon decode kernel on a 5-stage ring (GLUON_DECODE_TILE = (64, 5)) at 4k batch 16, one step eager
(under compute-sanitizer) or N steps in a row over cache copies, early or late (argv: early|late, steps)."""

import sys

import torch

from flashattn import decode_ops
from flashattn.bench_decode import DecodeCase, flashattn_step, make_inputs

decode_ops.GLUON_DECODE_TILE = (64, 5)
decode_ops.GLUON_DECODE_EARLY_FIRST_BLOCK = sys.argv[1] == "early"
steps = int(sys.argv[2])
device = torch.device("cuda")
copies = 4
inputs = make_inputs(DecodeCase(batch=16, cache_len=4096), device, copies)
step = flashattn_step(0, append=True)(inputs)
for i in range(steps):
    out = step(i % copies)
torch.cuda.synchronize()
print(sys.argv[1], steps, "steps ok", float(out.float().abs().sum()))
