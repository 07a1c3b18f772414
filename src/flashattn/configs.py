"""Tile, warp and stage choices: one table, looked up per GPU family, head dim and phase.

Users never pay for autotuning: ``benchmarks/sweep_blocks.py`` times candidates on the GPU machine
and the winners are written here by hand, each checked by the GPU test suite first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TileConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    # sm90: tiles through TMA tensor descriptors; the forward's Q/K/V/O, the dK/dV kernel's streamed Q and dO,
    # the dQ kernel's streamed K and V
    tma: bool = False
    # dK/dV only: a dV pass, then a dK pass over the queries, each holding one fp32 accumulator and
    # computing its tile with the keys along the rows (dkdv_kernel's COMPUTE_DK/COMPUTE_DV, KEY_ROWS):
    # 8 tile products per backward instead of 7, for large head dims whose two accumulators spill
    split_dkdv: bool = False
    # ptxas's register cap per thread (Triton's maxnreg), or None for its own choice. An 8-warp program
    # at <= 128 registers leaves room for a second one on the SM (65,536 registers), where ptxas would
    # sometimes take a few more and halve the occupancy (docs/perf-notes.md, version 7)
    max_registers: int | None = None
    # dK/dV only: one loop over each key block's queries instead of masked boundary loops around an unmasked
    # interior (dkdv_kernel's MASK_EVERY_BLOCK). With a causal mask the three-loop kernel made ptxas
    # serialize its wgmma instructions at hdim 64 and 128 (docs/perf-notes.md, version 8)
    mask_every_block: bool = False
    # dK/dV only: S and dP computed as K Q^T and V dO^T (dkdv_kernel's KEY_ROWS), so that each warpgroup holds
    # whole key rows and P^T, dS^T feed dV and dK from its registers. The split passes always take it
    key_rows: bool = False
    # dK/dV only: with a causal mask (no left window), the diagonal's masked blocks and the partial last one
    # as straight-line code around one unmasked loop (dkdv_kernel's PEEL_DIAGONAL), the other form that
    # ptxas keeps asynchronous (docs/perf-notes.md, versions 8 and 9); other masks take the one-loop form with
    # mask_every_block, the three-loop form without
    peel_diagonal: bool = False
    # sm90: the warp-specialized Gluon kernels. Forward (kernels/forward_hopper.py) and dQ (kernels/dq_hopper.py):
    # 128 query rows a program in two consumer warpgroups and a TMA loader warp, K/V in a ring of num_stages
    # buffers; block_m and num_warps are fixed by that structure (128, 8 consumer warps). dK/dV
    # (kernels/backward_hopper.py): block_n keys a program, Q/dO in the ring. Calls they do not cover (dropout,
    # ALiBi, softcap, windows, SDPA masks, paged K/V, fp32, padded head dims) take the Triton kernel with
    # this tile
    warp_specialized: bool = False
    # with warp_specialized: the two consumer warpgroups take turns issuing their products (FA3's ping-pong)
    pingpong: bool = False
    # with warp_specialized: one program per SM walks the query tiles, its loader fetching the next tile
    # while the consumers finish the last; otherwise one program per tile
    persistent: bool = False
    # with warp_specialized: three consumer warpgroups (192 query rows a program, 160 registers a thread) instead
    # of two (128 rows, 240 registers), FA3's choice at head dim 64
    three_consumers: bool = False
    # dK/dV with warp_specialized: each consumer warpgroup owns 64 of the program's 128 keys and both of their
    # gradients (FA3's layout, kernels/backward_hopper.py's dkdv_key_slices_kernel) instead of one gradient of all
    # the program's keys; for head dims up to 128, where a warpgroup holds both accumulators. block_n is 128
    key_slices: bool = False


# Under TRITON_INTERPRET=1 every program runs in numpy: small tiles keep the tests fast there.
INTERPRETER = TileConfig(16, 16, 1, 1)

# (max head dim, masked by causal/window) -> config, for Hopper (sm90) and bf16/fp16. Measured with
# benchmarks/sweep_blocks.py and benchmarks/probe_forward_tma.sh on an H200, 2026-11-21 (seqlen 4096 and
# 16384, 16k tokens, heads * headdim = 2048). TMA descriptors win where the tiles are large (hdim 128:
# 535-541 against 500-519 TFLOP/s at 16k; hdim 256 non-causal: 505 against 485) and lose at hdim 64
# (408 against 440), where the kernel is bound by the exponentials rather than by feeding the MMAs.
# hdim 64: capped at 128 registers, so that two programs share an SM. The dense kernel fits without
# the cap (125 registers), the varlen one took 130 and ran one program per SM (Nsight Compute, 4k causal).
_HOPPER_FORWARD = {
    (64, False): TileConfig(128, 64, 8, 3, max_registers=128),
    (64, True): TileConfig(128, 64, 8, 3, max_registers=128),
    (128, False): TileConfig(128, 128, 8, 3, tma=True),
    (128, True): TileConfig(128, 64, 8, 3),
    (256, False): TileConfig(128, 64, 8, 2, tma=True),
    (256, True): TileConfig(128, 64, 8, 2),
}
# Long sequences (both >= LONG_SEQLEN): the causal hdim-128 forward takes the large TMA tile, 523-538
# against 489 TFLOP/s at 16k; at 1k its 128x128 diagonal tiles waste too much (231 against 278).
LONG_SEQLEN = 8192
_HOPPER_FORWARD_LONG = {
    (128, True): TileConfig(128, 128, 8, 3, tma=True),
}
# hdim 256: one pass of 128 x 64, 8 warps, 1 stage, the best of `flashattn blocks --phase backward
# --head-dim 256 --seqlen 4096 [--causal]` on an H200 (whole backward 2.49 ms causal, 4.29 ms not,
# against 3.27 / 5.27 ms for the two-pass split_dkdv tile 32 x 128 x 8 x 2, which the table used
# before; the split stays a sweep candidate: `--candidates 32x128x8x2+split`).
# The two-pass hdim-256 tile that the table used in version 3 (docs/perf-notes.md): no spills, but
# slower than the one-pass tile; tests/test_dkdv_split.py keeps the split path working on the GPU.
HOPPER_SPLIT_DKDV = TileConfig(32, 128, 8, 2, split_dkdv=True)
# hdim 64/128: 64 x 64 on 4 warps, two programs per SM. It spills in its loop at hdim 128, yet beat the
# spill-free 128x64x8x1 / 8x2 at 4k on an H200 (hdim 128: 392 / 306 against 316-354 / 275-295 TFLOP/s,
# non-causal / causal; docs/perf-notes.md version 5): an 8-warp program holds the register file alone.
# hdim 64 takes a third stage: 353-360 against 337-344 TFLOP/s non-causal at 4k, and +3-4.5% causal at
# 2k-16k (H200, `flashattn blocks --phase dkdv`, each candidate twice, 2026-11-22).
# Causal hdim 64/128: one loop (mask_every_block). In the three-loop form ptxas serialized every wgmma of the
# kernel (info C7515; 46% more time per tile at hdim 128 in Nsight Compute). hdim 128, whole backward: 352.6
# against 307.3 TFLOP/s at 4k, 388.9 against 342.2 at 16k, 253.4 against 223.4 at 1k (H200, `flashattn blocks
# --phase dkdv --causal`, docs/perf-notes.md version 8).
# hdim 64: S and dP with the keys along the rows, and causal in one loop: 376.7 / 374.5 against 360.9 / 361.8
# TFLOP/s non-causal (twice), 298.8 against 282.5 causal at 4k, 330.0 against 318.4 at 16k (same sweeps).
# hdim 64 causal: the diagonal peeled out of the one loop (a left window keeps the one loop): 175.9 / 241.7 /
# 326.2 / 367.2 against 172.3 / 225.7 / 296.1 / 327.7 TFLOP/s at 512 / 1k / 4k / 16k (H200, docs/perf-notes.md
# version 9). At hdim 128 every peeled candidate lost: 287-307 against 351 at 4k; again in version 10
# (64x128x8x2+every+keyrows+peel 346.6 / 398.2 against 351.7 / 396.4 at 4k / 16k).
# hdim 256 causal: one loop too. The three-loop build spills in its interior loop (11 STL / 38 LDL, 892
# instructions; one loop: 0 / 3, 808; sm90 compile). 202.6 / 288.3 / 313.6 against 194.0 / 277.6 / 297.0
# TFLOP/s at 1k / 4k / 16k (H200, docs/perf-notes.md version 10).
# TMA for the streamed Q and dO (version 10; one lease, two numbers where a pair ran twice; whole backward, TFLOP/s):
# - hdim 128 causal: 357.3 / 357.9 against 345.9 / 343.3 at 4k, 406.9 against 388.3 at 16k; -1% at 1k
#   (252.1 against 254.4-254.9);
# - hdim 128, in one loop: 369.3 / 369.0 against 363.8 / 364.0 at 2k, 397.0 against 388.7 at 4k, 413.6 /
#   404.0 against 408.0 / 405.9 at 16k; TMA in the two-loop form lost (380.6);
# - hdim 256 causal: 204.5 / 203.8 against 202.1 / 201.8 at 1k, 298.6 against 288.3 at 4k, 331.6 / 331.2
#   against 312.2 / 311.8 at 16k;
# - hdim 256 non-causal: 315.7 against 321.3 at 4k, 320.4 against 316.0 at 8k, 318.2 against 308.5 at
#   16k; not taken. hdim 64: lost (373.2 against 376.7; causal 321.2 against 330.1).
_HOPPER_DKDV = {
    (64, False): TileConfig(64, 64, 4, 3, key_rows=True),
    (64, True): TileConfig(64, 64, 4, 3, mask_every_block=True, key_rows=True, peel_diagonal=True),
    (128, False): TileConfig(64, 64, 4, 2, tma=True, mask_every_block=True),
    (128, True): TileConfig(64, 64, 4, 2, tma=True, mask_every_block=True),
    (256, False): TileConfig(128, 64, 8, 1),
    (256, True): TileConfig(128, 64, 8, 1, tma=True, mask_every_block=True),
}
# dQ: K and V through TMA at hdim 256. Causal: 206.1 / 205.9 against 201.8 / 202.5 TFLOP/s at 1k, 307.3 /
# 305.4 against 297.6 / 295.1 at 4k, 338.9 / 341.7 against 330.3 / 331.2 at 16k (whole backward, two passes
# on one H200 lease, docs/perf-notes.md version 11). hdim 256 non-causal lost (304.4 against 320.0 at 4k,
# 293.5 against 306.2 at 16k) on its 1-stage tile, but won on the causal entry's 2-stage tile, from 2k:
# 331.7 / 330.4 against 320.3 / 321.9 at 4k, 320.8 against 316.6 at 8k, 310.2 / 310.3 against 308.9 / 308.5
# at 16k; at 1k it lost (266.7 against 270.8), so short sequences keep the 1-stage tile. hdim 128 moved by
# under 1%, either way.
_HOPPER_DQ = {
    (64, False): TileConfig(128, 64, 8, 3),
    (64, True): TileConfig(128, 64, 8, 3),
    (128, False): TileConfig(128, 64, 8, 3),
    (128, True): TileConfig(128, 64, 8, 3),
    (256, False): TileConfig(64, 64, 4, 2, tma=True),
    (256, True): TileConfig(64, 64, 4, 2, tma=True),
}
# Other GPUs (Ampere and older, or anything unknown): smaller tiles that fit 100 KB of shared memory.
_PORTABLE_FORWARD = {(64, c): TileConfig(64, 64, 4, 2) for c in (False, True)} | {
    (128, c): TileConfig(64, 32, 4, 2) for c in (False, True)} | {
    (256, c): TileConfig(32, 32, 4, 1) for c in (False, True)}
_PORTABLE_DKDV = {(64, c): TileConfig(32, 64, 4, 1) for c in (False, True)} | {
    (128, c): TileConfig(32, 64, 4, 1) for c in (False, True)} | {
    (256, c): TileConfig(16, 32, 4, 1) for c in (False, True)}
_PORTABLE_DQ = {(64, c): TileConfig(64, 32, 4, 1) for c in (False, True)} | {
    (128, c): TileConfig(64, 32, 4, 1) for c in (False, True)} | {
    (256, c): TileConfig(32, 16, 4, 1) for c in (False, True)}

# Short sequences (the shorter length <= SHORT_SEQLEN, known): the non-causal hdim-128/256 forward
# drops TMA. Each program builds its tensor descriptors in global memory before its loop, and a loop of
# 4-8 key blocks does not pay that back. Swept on an H200 (run efcc6a4, `flashattn blocks`, TFLOP/s at
# 512 / 1k tokens): hdim 128, 128x64x8x3 305 / 390 against 128x128x8x3 294 / 380 and the long table's
# 128x128x8x3+tma 257 / 364; hdim 256, 128x64x8x2 333 / 411 against 238 / 402 with TMA.
# Causal hdim 64/128: 64 x 64 query/key tiles on 4 warps. At 512-1k tokens most query blocks hold a
# diagonal, and a 128-row block wastes half its diagonal tile (swept twice in one run on an H200,
# 2026-11-22, TFLOP/s at 512 / 1k: hdim 64, 214-216 / 282-288 against 195-196 / 274 for 128x64x8x3;
# hdim 128, 217-219 / 305-308 against 155-190 / 277-279; 4 stages lost, 2 stages tied at 512 only).
SHORT_SEQLEN = 1024
# Causal hdim 128 at <= 512 tokens: 32-key blocks. 64x32x4x3 asks for 64 KB of shared memory and 128 registers, so
# three programs share an SM where the 1k entry's 64x64x4x3 (112 KB, 172 registers) fits two; each tile holds at
# most 4-8 key blocks, and a third program hides more of a tile's first loads and its store. Three passes on one
# H200 lease (2026-11-23, `benchmarks/sweeps/occupancy.txt`, `forward-short.txt`), TFLOP/s: 233.5 / 233.5 / 208.8
# against 217.1 / 217.7 / 202.3 (64x64x4x1: 230.4 / 230.1 / 207.4); at 1k it lost (284.6 against 304.7).
# Capped at 168 registers: the packed (varlen) build took 186 (the dense one 128, sm90 compile of Triton 3.6), so two
# of its programs shared an SM where three of the dense one's did, and the packed call ran 12% slower at 512 tokens
# (171 against 152 us a call, H200, docs/perf-notes.md version 18). At 168 it does not spill.
SHORTEST_SEQLEN = 512
_HOPPER_FORWARD_SHORTEST = {
    (128, True): TileConfig(64, 32, 4, 3, max_registers=168),
}
_HOPPER_FORWARD_SHORT = {
    (64, True): TileConfig(64, 64, 4, 3),
    (128, False): TileConfig(128, 64, 8, 3),
    (128, True): TileConfig(64, 64, 4, 3),
    (256, False): TileConfig(128, 64, 8, 2),
}
# Causal hdim 128 at <= 1k tokens: dK/dV without TMA. There the backward waits on the host, and the
# descriptors' workspace adds host time: 178.8 against 187.9 TFLOP/s at 512 on one pass, 142.1 against 142.5
# on another (the first after a compile); 252.1 against 254.4-254.9 at 1k (H200, version 10).
_HOPPER_DKDV_SHORT = {
    (128, True): TileConfig(64, 64, 4, 2, mask_every_block=True),
}
_LONG_TABLES = {("hopper", "forward"): _HOPPER_FORWARD_LONG}

# The warp-specialized Gluon forward (kernels/forward_hopper.py), for the calls it covers
# (ops._warp_specialized_fits: head dim exactly 64, 128 or 256, 16-bit, causal or no mask, no dropout, softcap,
# ALiBi or SDPA mask); the Triton tables above serve every other call. Swept on an H200 (2026-11-22,
# `flashattn blocks`, benchmarks/sweeps/forward-ws.txt; TFLOP/s against the Triton entry):
# - hdim 128 non-causal: 128x128x8x2+ws 514 at 4k (494.5), 596 at 16k (534.7); 3 stages 503 / 599.5;
# - hdim 128 causal: 3 stages 461.7 at 4k (409.4), 585 at 16k (530); 2 stages 450 / 592;
# - hdim 256, 128x64x8x2+ws: 591.8 / 534.0 at 4k non-causal / causal (507.7 / 425.8), 663.1 at 16k (535.2);
#   32-key blocks on 4 stages lost (452.6);
# - hdim 64 with two consumers: lost (347.6 against 425.0 at 4k, 330 against 382 causal). There the exponentials
#   bound the loop, and the Triton tile runs two 8-warp programs per SM where this kernel's 240-register
#   consumers allow one. Three consumers (192 rows a program, FA3's hdim-64 choice), swept after the L2 sections
#   (session 11): non-causal 457.3 / 499.0 at 4k / 16k against 428.1 / 438.3 (4 stages 452.3 / 499.0), but 334.7
#   (358.8 persistent) against 381.8 at 1k; causal 365.6 against 384.6 at 4k, 466.8 against 427.4 at 16k
#   (128x64 blocks: 354.6 / 429.9). Causal hdim 64 kept the Triton tile until its consumers took their own causal
#   key ranges, and takes it below 4k (``_WS_FROM_SEQLEN``);
# - ping-pong turns between the consumers: no gain (590.4 against 599.5 at hdim 128 16k).
# - after session 20's kernel changes (short tile first, P rounded in pairs: +2-5% at hdim 64) the Triton tiles
#   still win below 4k causal (2k: 345-349 against 332-335; 1k: 288-292 against 232-233) and at 1k non-causal
#   (385 against 359-362; 389-393 persistent) (H200, docs/perf-notes.md version 21).
# - version 22 (persistent grids take causal tiles from a counter; O stored 16 bytes a thread where shared memory
#   leaves room): causal hdim 128 on a persistent 2-stage grid, 466.9 / 476.2 against 428.6 / 429.8 at 2k and
#   534.9 / 530.3 against 519.8 / 521.5 at 4k; from 8k one program a tile (persistent 3 stages: 571 against 569-575
#   at 8k, 595-597 against 607-614 at 16k) (H200, benchmarks/sweeps/forward-wide-stores.txt, two passes).
# - version 23 (a persistent program holds two Q tiles, ops._forward_q_buffers; Q released after a consumer's last
#   Q K^T): persistent grids up to 4k non-causal too, one program a tile from 8k (H200, benchmarks/sweeps/
#   forward-double-q.txt, forward-persistent-crossover.txt, once each, TFLOP/s persistent against one program a tile):
#   hdim 64 479.3 / 503.9 / 504.5 against 471.5 / 501.6 / 516.2 at 4k / 8k / 16k, causal 434.6 / 469.3 / 489.9
#   against 416.8 / 468.9 / 506.3; hdim 128 574.3 / 600.6 / 624.8 / 637.3 against 551.8 / 586.2 / 626.2 / 640.5 at
#   2k / 4k / 8k / 16k; hdim 256 592.0 / 637.4 / 682.7 against 573.8 / 640.2 / 674.2 at 2k / 4k / 8k (one Q tile
#   there: 64 KB), causal 475.6 / 543.5 against 483.2 / 560.7 at 2k / 4k (kept one program a tile).
_HOPPER_FORWARD_WS = {
    (64, False): TileConfig(128, 128, 8, 3, warp_specialized=True, three_consumers=True, persistent=True),
    (64, True): TileConfig(128, 128, 8, 3, warp_specialized=True, three_consumers=True, persistent=True),
    (128, False): TileConfig(128, 128, 8, 2, warp_specialized=True, persistent=True),
    (128, True): TileConfig(128, 128, 8, 2, warp_specialized=True, persistent=True),
    (256, False): TileConfig(128, 64, 8, 2, warp_specialized=True, persistent=True),
    (256, True): TileConfig(128, 64, 8, 2, warp_specialized=True),
}
_HOPPER_FORWARD_WS_LONG = {
    (64, False): TileConfig(128, 128, 8, 3, warp_specialized=True, three_consumers=True),
    (64, True): TileConfig(128, 128, 8, 3, warp_specialized=True, three_consumers=True),
    (128, False): TileConfig(128, 128, 8, 2, warp_specialized=True),
    (128, True): TileConfig(128, 128, 8, 3, warp_specialized=True),
}
# Short sequences (version 22, same sweeps; TFLOP/s at 512 / 1k against the entries before it): every head dim on a
# persistent grid. Causal hdim 128 on 64-key blocks, 263.3 / 373.2 against the Triton tiles' 233.5 / 306.2 (its
# 128-key tile: 237.2 / 363.2; two stages 256.7 / 370.4); hdim 128 non-causal on two stages (16-byte stores),
# 419.7 / 517.4 against 404.8 / 499.3 for three; hdim 64 non-causal on three consumers, 322.1 / 387.9 against the
# Triton tile's 323.8 / 383.7; hdim 256, 409.9 against 394.9 at 512, causal 265.4 / 381.5 against 257.6 / 376.3.
# Causal hdim 64 keeps the Triton tile (below 4k, _WS_FROM_SEQLEN): 229.7 against 283.0 at 1k (version 23, two Q
# tiles: 282.6-284.4 against 281.8-289.8). hdim 64 non-causal at 512 took the Triton tile until version 23 (324.1 /
# 325.3 against 319.2 / 319.6 in version 22); with two Q tiles the three consumers run 375-380 against its 322-324
# (H200, benchmarks/sweeps/forward-double-q.txt and call A's kernel-only A/B, docs/perf-notes.md version 23).
_HOPPER_FORWARD_WS_SHORT = {
    (64, False): TileConfig(128, 128, 8, 3, warp_specialized=True, three_consumers=True, persistent=True),
    (128, False): TileConfig(128, 128, 8, 2, warp_specialized=True, persistent=True),
    (128, True): TileConfig(128, 64, 8, 3, warp_specialized=True, persistent=True),
    (256, False): TileConfig(128, 64, 8, 2, warp_specialized=True, persistent=True),
    (256, True): TileConfig(128, 64, 8, 2, warp_specialized=True, persistent=True),
}
# The warp-specialized Gluon dK/dV kernel (kernels/backward_hopper.py; ops._warp_specialized_dq_fits, dense batches:
# the forward's conditions): 64 keys a program, 64-row query blocks on 2 stages (the only tile: Q and dO
# stages of 128 rows at hdim 256 would take 256 KB). Measured on an H200 (session 11, GPU time of the dK/dV
# kernel, ms, against the Triton entry; bench of the two kernels with the same dQ kernel):
# - hdim 256 non-causal: 1.156 / 2.169 / 9.924 at 2k / 4k / 16k against 1.349 / 2.571 / 10.873;
# - hdim 256 causal: 0.650 / 1.176 / 4.443 against 0.741 / 1.341 / 4.866;
# - hdim 128: lost (1.685 / 3.016 / 11.455 against 0.990 / 1.854 / 7.416 non-causal). Its Triton tile takes 128
#   keys a program, and the 64-key program reads Q and dO twice as often with products half as wide.
# Timed as the whole backward (session 12, TFLOP/s): hdim 256 366.3 against 331.6 at 4k, 330.1 against 311.2 at
# 16k, 234.8 against 221.9 at 512, causal 512 162.8 against 149.7. At hdim 64 and 128 neither 128-key form won:
# one gradient per warpgroup 8-20% behind the Triton tiles, key slices (both gradients of 64 keys per warpgroup,
# +slices) level non-causal at hdim 128 (400.2 / 419.5 against 402.5 / 421.3 at 4k / 16k) and 5-14% behind
# elsewhere (docs/perf-notes.md, version 13.1).
# hdim 64 and 128 without a mask (session 18, docs/perf-notes.md version 19): the key-slice kernel, software-pipelined
# and cut to 354 instructions a loop at hdim 64 (the Triton tile's has 335, its loads included). H200, whole
# backward, TFLOP/s against the Triton entry: hdim 64 387.2 / 383.3 at 4k, 415.6 / 398.7 at 16k, 359.9 / 359.9 at
# 2k, 301.8 / 321.5 at 1k; hdim 128 450.2 / 435.1 at 4k, 404.2 / 402.5 at 2k, 459.6 / 454.9 at 16k (32 query rows:
# 64 spill there). From 2k (_WS_FROM_SEQLEN). Causal stays with the Triton tiles: hdim 64 290.8 / 303.6 at 2k,
# 343.9 / 341.5 at 4k, 358.6 / 362.4 at 8k, 387.3 / 378.0 at 16k; hdim 128 375.6 / 385.1 at 4k, 442.6 / 443.5 at 16k.
_HOPPER_DKDV_WS = {
    (64, False): TileConfig(64, 128, 8, 3, warp_specialized=True, key_slices=True),
    (128, False): TileConfig(32, 128, 8, 3, warp_specialized=True, key_slices=True),
    (256, False): TileConfig(64, 64, 8, 2, warp_specialized=True),
    (256, True): TileConfig(64, 64, 8, 2, warp_specialized=True),
}
# The warp-specialized Gluon dQ kernel (kernels/dq_hopper.py; ops._warp_specialized_dq_fits: the forward's
# conditions, dense or varlen): 128 query rows a program (two consumer warpgroups), K and V blocks on 3 stages (K is
# held a block longer than V), 32-key blocks at hdim 256, where 128 rows of Q and dO leave 96 KB for them. Measured
# on an H100 (session 13, whole backward, TFLOP/s, against the Triton entry; docs/perf-notes.md, version 14):
# - hdim 128: 428.3 against 409.5 at 4k, 462.6 against 428.8 at 16k, 341.5 against 325.8 at 1k; causal 391.0
#   against 355.9 at 4k. Two stages lost (384.4, causal 344.1), and so did 32-key blocks (398.6);
# - hdim 256: 374.2 against 361.1 at 4k, 370.8 against 336.1 at 16k; causal 341.8 against 325.1 at 4k. Two stages
#   lost (329.7);
# - hdim 64: lost (326.1 against 350.3 at 2k, causal 312.0 against 331.6 at 4k): at 64 wide the exponentials and dS
#   weigh more against the products, and the Triton tile overlaps them better. Three consumer warpgroups (H200,
#   session 14, version 15) came level, not ahead: 348.8 against 350.3 at 2k and 371.6 against 370.5 at 4k with 4
#   stages; 3 stages 3-4% behind.
_HOPPER_DQ_WS = {
    (128, False): TileConfig(128, 64, 8, 3, warp_specialized=True),
    (128, True): TileConfig(128, 64, 8, 3, warp_specialized=True),
    (256, False): TileConfig(128, 32, 8, 3, warp_specialized=True),
    (256, True): TileConfig(128, 32, 8, 3, warp_specialized=True),
}
# Short sequences (whole backward, H100, TFLOP/s): the Triton entries where they won, hdim 256 causal 1k (220.8
# against 194.2); hdim 256 non-causal keeps the Gluon dQ (240.1 against 225.9 at 512, 308.3 against 286.8 at 1k).
# hdim 128 kept the Triton dQ up to 1k until version 22's 16-byte dQ stores: since then the Gluon dQ wins there too
# (H200, two passes of benchmarks/sweeps/dq-gluon-short-wide.txt, against the Triton dQ: 294.5 / 294.3 against
# 271.1 / 271.7 at 512, 363.5 / 353.7 against 341.9 / 341.2 at 1k; causal 209.1 / 209.2 against 188.9 / 189.6 at
# 512, 278.6 / 283.1 against 260.4 / 260.3 at 1k).
_HOPPER_DQ_WS_SHORT = {
    (256, True): None,
}
# Entries of the Gluon tables that serve only calls from a length on (the shorter of the two, as for the other
# buckets); shorter calls take the Triton table. Causal hdim 64 with three consumers, once each consumer took its own
# causal key range (session 16, version 17; two passes on one H200 lease, `flashattn blocks`,
# benchmarks/sweeps/forward-causal-64-consumers.txt, TFLOP/s against the Triton 128x64x8x3 tile): 401.0 / 396.9
# against 389.9 / 390.0 at 4k, 460.8 / 460.6 against 419.0 / 417.3 at 8k, 492.1 / 491.7 against 432.0 / 430.4 at
# 16k; at 2k it lost, 321.9 / 322.4 against 346.5 / 348.6. Persistent or 4 stages: no better (355-459, 390-456).
_WS_FROM_SEQLEN = {("hopper", "forward"): {(64, True): 4096},
                   ("hopper", "dkdv"): {(64, False): 2048, (128, False): 2048}}
# Packed (varlen) calls take no long-sequence Gluon entry (``lookup``): the forward keeps its persistent grid (tiles
# handed out by a counter) past LONG_SEQLEN, as the longest sequence sets the bucket and the others are shorter, their
# tiles unequal. Kernel-only A/B, H200 (docs/perf-notes.md version 30, calls A-C, I, J, L), TFLOP/s ratio to the dense
# call on the same 16k tokens, one program a tile -> persistent 2 stages: hdim 128 mixed lengths causal 0.868 / 0.864 /
# 0.886 / 0.872 -> 0.895 / 0.904 / 0.902 / 0.885, non-causal 0.913 / 0.922 -> 0.935 / 0.952; equal lengths (one sequence
# of 16k, two of 8k) causal 0.950 / 0.978 -> 0.951 / 0.985, non-causal 0.952 / 0.974 -> 0.968 / 0.994; hdim 64 mixed
# causal 0.879 -> 0.902.
# (family, phase) -> the Gluon kernel's table, its short- and long-sequence entries (a None entry: the Triton table's)
_WS_TABLES = {("hopper", "forward"): (_HOPPER_FORWARD_WS, _HOPPER_FORWARD_WS_SHORT, _HOPPER_FORWARD_WS_LONG),
              ("hopper", "dkdv"): (_HOPPER_DKDV_WS, {}, {}),
              ("hopper", "dq"): (_HOPPER_DQ_WS, _HOPPER_DQ_WS_SHORT, {})}
_HOPPER_DQ_SHORT = {
    (256, False): TileConfig(128, 64, 8, 1),
}
_SHORTEST_TABLES = {("hopper", "forward"): _HOPPER_FORWARD_SHORTEST}
_SHORT_TABLES = {("hopper", "forward"): _HOPPER_FORWARD_SHORT, ("hopper", "dkdv"): _HOPPER_DKDV_SHORT,
                 ("hopper", "dq"): _HOPPER_DQ_SHORT}
_TABLES = {
    ("hopper", "forward"): _HOPPER_FORWARD,
    ("hopper", "dkdv"): _HOPPER_DKDV,
    ("hopper", "dq"): _HOPPER_DQ,
    ("portable", "forward"): _PORTABLE_FORWARD,
    ("portable", "dkdv"): _PORTABLE_DKDV,
    ("portable", "dq"): _PORTABLE_DQ,
}


def padded_head_dim(head_dim: int) -> int:
    """The tile width along the head dim: a power of two, at least 32.

    16 is the tensor cores' minimum, but ptxas (CUDA 13.0) crashed compiling the causal dq kernel
    with 16-wide tiles on an H200; the 32-wide tile masks the padding like any other head dim.
    """
    return max(32, next_power_of_2(head_dim))


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1): Triton's tile sizes, without importing triton."""
    return 1 << max(0, n - 1).bit_length()


def gpu_family(device: torch.device) -> str:
    if device.type != "cuda":
        return "portable"
    index = device.index if device.index is not None else torch.cuda.current_device()
    if _compute_capability_major(index) == 9:
        return "hopper"
    return "portable"


@functools.cache
def _compute_capability_major(index: int) -> int:
    """Cached: every launch looks its tiles up, and the driver query costs host time on each call."""
    return torch.cuda.get_device_capability(index)[0]


_OVERRIDES: dict[str, TileConfig] = {}


@contextlib.contextmanager
def use_config(phase: str, config: TileConfig):
    """Force ``config`` for ``phase`` inside the block: how the block-size sweep tries candidates."""
    previous = _OVERRIDES.get(phase)
    _OVERRIDES[phase] = config
    try:
        yield
    finally:
        if previous is None:
            del _OVERRIDES[phase]
        else:
            _OVERRIDES[phase] = previous


def forced_configs() -> tuple:
    """The configs that ``use_config`` forces now, by phase: part of a launch plan's key (``ops``)."""
    return tuple(_OVERRIDES.items())


def lookup(family: str, phase: str, head_dim: int, masked: bool, dtype: torch.dtype, attn_mask: bool = False,
           seqlen: int = 0, warp_specialized: bool = False, packed: bool = False) -> TileConfig:
    """The table's config for ``phase`` on a GPU ``family`` ("hopper" or "portable"), without a device.

    ``attn_mask``: an SDPA mask streams beside K and V. ``seqlen``: the shorter of the (longest) query
    and key lengths, which picks the long- and short-sequence entries (0: unknown, neither).
    ``warp_specialized``: the call fits the Gluon forward (``ops._warp_specialized_fits``), whose own table
    then comes first. ``packed``: a varlen call, which takes no long-sequence Gluon entry (the forward keeps its
    persistent grid past LONG_SEQLEN; only the forward has such entries).
    """
    width = padded_head_dim(head_dim)
    bucket = min(b for b in (64, 128, 256) if b >= width)
    if warp_specialized and (family, phase) in _WS_TABLES:
        key = (bucket, masked)
        table, short, long = _WS_TABLES[(family, phase)]
        if packed:
            long = {}  # see the comment above _WS_TABLES
        by_length = _for_length(seqlen, short, {}, long)
        if key in by_length:
            config = by_length[key]  # None: the Triton table's entry
        elif 0 < seqlen < _WS_FROM_SEQLEN.get((family, phase), {}).get(key, 0):
            config = None
        else:
            config = table.get(key)
        if config is not None:
            return config
    by_length = _for_length(seqlen, _SHORT_TABLES.get((family, phase), {}),
                            _SHORTEST_TABLES.get((family, phase), {}), _LONG_TABLES.get((family, phase), {}))
    config = by_length.get((bucket, masked)) or _TABLES[(family, phase)][(bucket, masked)]
    return fitted(config, dtype, attn_mask)


def _for_length(seqlen: int, short: dict, shortest: dict, long: dict) -> dict:
    """The length-specific entries that apply at ``seqlen`` (0, unknown: none): ``short`` up to SHORT_SEQLEN, with
    ``shortest`` over it up to SHORTEST_SEQLEN, ``long`` from LONG_SEQLEN."""
    if seqlen >= LONG_SEQLEN:
        return long
    if 0 < seqlen <= SHORTEST_SEQLEN:
        return short | shortest
    if 0 < seqlen <= SHORT_SEQLEN:
        return short
    return {}


def fitted(config: TileConfig, dtype: torch.dtype, attn_mask: bool = False) -> TileConfig:
    """``config`` (a table entry, for 16-bit inputs and no SDPA mask) cut to fit ``dtype`` and a mask."""
    if dtype == torch.float32:
        # fp32 tiles take twice the shared memory: halve the key/query tile that streams.
        config = dataclasses.replace(config, block_m=max(16, config.block_m // 2),
                                     block_n=max(16, config.block_n // 2),
                                     num_stages=max(1, config.num_stages - 1), max_registers=None)
    if attn_mask:
        # the mask's (BLOCK_M, BLOCK_N) tile is pipelined beside K and V, 4 bytes a score for a float
        # mask: the hdim-128 forward's 128x128x3 tiles asked for 361 KB of shared memory on an H200
        config = dataclasses.replace(config, block_n=min(config.block_n, 64), num_stages=min(config.num_stages, 2),
                                     max_registers=None)
    return config


def launch_options(config: TileConfig) -> dict:
    """The Triton launch options of ``config``: warps, stages and, where set, the register cap."""
    options = dict(num_warps=config.num_warps, num_stages=config.num_stages)
    if config.max_registers is not None:
        options["maxnreg"] = config.max_registers
    return options


def tile_config(phase: str, head_dim: int, masked: bool, dtype: torch.dtype, device: torch.device,
                interpret: bool, attn_mask: bool = False, seqlen: int = 0,
                warp_specialized: bool = False, packed: bool = False) -> TileConfig:
    """The config for ``phase`` in {"forward", "dkdv", "dq"} on ``device``: a forced one (``use_config``),
    the interpreter's, or the table's (:func:`lookup`)."""
    if phase in _OVERRIDES:
        return _OVERRIDES[phase]
    if interpret:
        return INTERPRETER
    return lookup(gpu_family(device), phase, head_dim, masked, dtype, attn_mask, seqlen, warp_specialized, packed)
