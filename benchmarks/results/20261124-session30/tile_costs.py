"""Equal-length packed and dense calls (hdim 128, 16 heads, non-causal, bf16, about 16k tokens) over lengths that
fill whole tiles and lengths that leave partial ones, timed with do_bench: the data for a per-tile cost model
(tiles, key blocks, masked last blocks, tiles whose second consumer has no row). Prints one row per length."""
import functools
import math

import torch
import triton

from flashattn import flash_attn_func, flash_attn_varlen_func

HEADS, HEAD_DIM, TOKENS = 16, 128, 16384
LENGTHS = [128, 256, 384, 512, 640, 768, 1024, 64, 100, 192, 200, 300, 320, 400, 448, 500, 576, 600, 700, 900]
print("length batch | tiles blocks masked_tail half_tiles | dense_us packed_us", flush=True)
for n in LENGTHS:
    batch = TOKENS // n
    q, k, v = (torch.randn(batch * n, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    cu = torch.arange(0, batch + 1, device="cuda", dtype=torch.int32) * n
    per_seq = math.ceil(n / 128)
    tiles = batch * HEADS * per_seq
    blocks = tiles * per_seq
    masked_tail = tiles if n % 128 else 0
    half = batch * HEADS if 0 < n % 128 <= 64 else 0
    dense = functools.partial(flash_attn_func, *(x.view(batch, n, HEADS, HEAD_DIM) for x in (q, k, v)))
    packed = functools.partial(flash_attn_varlen_func, q, k, v, cu, cu, n, n)
    dense(), packed()
    dense_us = 1000 * triton.testing.do_bench(dense, warmup=100, rep=400)
    packed_us = 1000 * triton.testing.do_bench(packed, warmup=100, rep=400)
    print(n, batch, "|", tiles, blocks, masked_tail, half, "|", f"{dense_us:.1f} {packed_us:.1f}", flush=True)
