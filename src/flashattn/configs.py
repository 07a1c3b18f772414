"""Every tile, split and budget choice: one table per GPU family and phase, looked up per head dim, mask and length.

Users never pay for autotuning: ``benchmarks/sweep_blocks.py`` (dense) and ``benchmarks/decode_splits.py`` (decode)
time candidates on a GPU; the winners are written here, each with a one-line reason (docs/perf-notes.md holds the
measurements behind it). ``use_config`` is the one way to force a tile (what the sweeps do).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class TileConfig:
    """One kernel's tile: (block_m, block_n) queries x keys, warps, pipeline stages, and the kernel's variants."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    # sm90: tiles through TMA tensor descriptors (the forward's Q/K/V/O, the dK/dV's Q and dO, the dQ's K and V)
    tma: bool = False
    # ptxas's register cap per thread (Triton's maxnreg): two 8-warp programs an SM where ptxas would take a few more
    max_registers: int | None = None
    # dK/dV: one loop over each key block's queries (MASK_EVERY_BLOCK) instead of masked loops around an unmasked one
    mask_every_block: bool = False
    # dK/dV: S and dP computed as K Q^T and V dO^T (KEY_ROWS), so a warpgroup feeds dV and dK from its registers
    key_rows: bool = False
    # dK/dV: the causal diagonal's blocks as straight-line code around one unmasked loop (PEEL_DIAGONAL)
    peel_diagonal: bool = False
    # sm90: the Hopper kernels (warp-specialized, in Gluon): forward and dQ take 64 query rows on each consumer
    # warpgroup and a TMA loader warp, K/V in a ring of num_stages; dK/dV block_n keys a program, Q/dO in the ring
    hopper: bool = False
    persistent: bool = False  # Hopper forward, fused dK/dV/dQ: one program per SM walks tiles taken from a counter
    # Hopper forward: three consumer warpgroups (192 rows, 160 registers) instead of two (128 rows, 240 registers)
    three_consumers: bool = False
    key_slices: bool = False  # Hopper dK/dV: each consumer warpgroup owns 64 of 128 keys and their gradients (FA3's)
    rescale_threshold: float | None = None  # Hopper 16-bit forward: O rescaled when a row max grows past it (lazy_max)


@dataclass(frozen=True)
class PhaseTable:
    """One GPU family's tiles for one phase, keyed (head-dim bucket, masked by causal/window).

    ``base`` serves every length; ``short`` (shorter length <= SHORT_SEQLEN), ``shortest`` (<= SHORTEST_SEQLEN, over
    ``short``) and ``long`` (>= LONG_SEQLEN) override it. The ``hopper*`` entries serve the calls the Hopper kernels
    cover and come first (a None entry: the Triton entry; ``hopper_short`` and ``hopper_shortest`` as ``short`` and
    ``shortest``); ``hopper_from`` gives an entry's shortest length.
    """

    base: dict
    short: dict = field(default_factory=dict)
    shortest: dict = field(default_factory=dict)
    long: dict = field(default_factory=dict)
    hopper: dict = field(default_factory=dict)
    hopper_short: dict = field(default_factory=dict)
    hopper_shortest: dict = field(default_factory=dict)
    hopper_long: dict = field(default_factory=dict)
    hopper_from: dict = field(default_factory=dict)


SHORT_SEQLEN = 1024
SHORTEST_SEQLEN = 512
LONG_SEQLEN = 8192

INTERPRETER = TileConfig(32, 32, 1, 1)  # TRITON_INTERPRET=1: an op costs the same at 16 or 32 rows


def _buckets(hdim_64: TileConfig, hdim_128: TileConfig, hdim_256: TileConfig) -> dict:
    """One tile per head-dim bucket, masked or not."""
    return {(bucket, masked): config for bucket, config in ((64, hdim_64), (128, hdim_128), (256, hdim_256))
            for masked in (False, True)}


HOPPER_FORWARD = PhaseTable(
    # every Triton tile loads Q, K and V through host-side TMA descriptors (tma), where the call's layout allows
    base={
        # hdim 64: bound by the exponentials; capped at 128 registers so that two programs share an SM
        (64, False): TileConfig(128, 64, 8, 3, tma=True, max_registers=128),
        (64, True): TileConfig(128, 64, 8, 3, tma=True, max_registers=128),
        (128, False): TileConfig(128, 128, 8, 3, tma=True),
        (128, True): TileConfig(128, 64, 8, 3, tma=True),
        (256, False): TileConfig(128, 64, 8, 2, tma=True),
        (256, True): TileConfig(128, 64, 8, 2, tma=True),
    },
    # short sequences: causal 64 x 64 tiles waste less of the diagonal; 64-key blocks without a mask
    short={(64, True): TileConfig(64, 64, 4, 3, tma=True), (128, True): TileConfig(64, 64, 4, 3, tma=True),
           (128, False): TileConfig(128, 64, 8, 3, tma=True), (256, False): TileConfig(128, 64, 8, 2, tma=True)},
    # causal hdim 128 at <= 512 tokens: 32-key blocks, three programs an SM (the cap keeps the packed build there);
    # causal hdim 64 at <= 512 on pointer loads, 2% faster there than through descriptors
    shortest={(128, True): TileConfig(64, 32, 4, 3, tma=True, max_registers=168), (64, True): TileConfig(64, 64, 4, 3)},
    # causal hdim 128 from 8k: the large tile, once the diagonal's waste is small
    long={(128, True): TileConfig(128, 128, 8, 3, tma=True)},
    hopper={
        (64, False): TileConfig(128, 128, 8, 3, hopper=True, three_consumers=True, persistent=True),
        (64, True): TileConfig(128, 128, 8, 3, hopper=True, three_consumers=True, persistent=True),
        (128, False): TileConfig(128, 128, 8, 2, hopper=True, persistent=True),
        (128, True): TileConfig(128, 128, 8, 2, hopper=True, persistent=True),
        (256, False): TileConfig(128, 64, 8, 2, hopper=True, persistent=True, rescale_threshold=8.0),
        # causal hdim 256: one program a tile (the persistent grid 5-10% slower at 2k-8k); lazy rescale at hdim 256 only
        (256, True): TileConfig(128, 64, 8, 2, hopper=True, rescale_threshold=8.0),
    },
    # short sequences: every head dim on a persistent grid; causal hdim 128 on 64-key blocks; causal hdim 64 on 64-row
    # tiles of one consumer warpgroup, two programs an SM (launch.forward.programs_per_sm)
    hopper_short={
        (64, False): TileConfig(128, 128, 8, 3, hopper=True, three_consumers=True, persistent=True),
        (64, True): TileConfig(64, 128, 4, 2, hopper=True, persistent=True),
        (128, False): TileConfig(128, 128, 8, 2, hopper=True, persistent=True),
        (128, True): TileConfig(128, 64, 8, 3, hopper=True, persistent=True),
        (256, False): TileConfig(128, 64, 8, 2, hopper=True, persistent=True, rescale_threshold=8.0),
        (256, True): TileConfig(128, 64, 8, 2, hopper=True, persistent=True, rescale_threshold=8.0),
    },
    hopper_shortest={(128, True): TileConfig(64, 64, 4, 2, hopper=True, persistent=True)},  # as hdim 64's, to 512
    # causal hdim 128 from 8k: one program a tile on 3 stages (packed calls keep the persistent grid: ``lookup``)
    hopper_long={(128, True): TileConfig(128, 128, 8, 3, hopper=True)},
)

HOPPER_DKDV = PhaseTable(
    base={
        # 64 x 64 on 4 warps: two programs an SM; keys along the rows and a third stage at hdim 64
        (64, False): TileConfig(64, 64, 4, 3, key_rows=True),
        # causal: one loop (the three-loop form made ptxas serialize its wgmma), the diagonal peeled out of it
        (64, True): TileConfig(64, 64, 4, 3, mask_every_block=True, key_rows=True, peel_diagonal=True),
        (128, False): TileConfig(64, 64, 4, 2, tma=True, mask_every_block=True),
        (128, True): TileConfig(64, 64, 4, 2, tma=True, mask_every_block=True),
        # hdim 256: one pass of 128 x 64, 8 warps, 1 stage; causal in one loop (the three-loop build spills)
        (256, False): TileConfig(128, 64, 8, 1),
        (256, True): TileConfig(128, 64, 8, 1, tma=True, mask_every_block=True),
    },
    # causal hdim 128 at <= 1k: no descriptors (the host's time decides there)
    short={(128, True): TileConfig(64, 64, 4, 2, mask_every_block=True)},
    hopper={
        # key slices, non-causal, from 2k tokens (hopper_from); causal stays on the Triton tiles
        (64, False): TileConfig(64, 128, 8, 3, hopper=True, key_slices=True),
        (128, False): TileConfig(32, 128, 8, 3, hopper=True, key_slices=True),
        # hdim 256: 64 keys a program, 64-row query blocks on 2 stages (the only tile that fits)
        (256, False): TileConfig(64, 64, 8, 2, hopper=True),
        (256, True): TileConfig(64, 64, 8, 2, hopper=True),
    },
    hopper_from={(64, False): 2048, (128, False): 2048},
)

HOPPER_DQ = PhaseTable(
    base={
        **{(d, masked): TileConfig(128, 64, 8, 3) for d in (64, 128) for masked in (False, True)},
        # hdim 256: K and V through TMA on 2 stages
        (256, False): TileConfig(64, 64, 4, 2, tma=True),
        (256, True): TileConfig(64, 64, 4, 2, tma=True),
    },
    short={(256, False): TileConfig(128, 64, 8, 1)},  # hdim 256 non-causal at <= 1k: one stage
    hopper={
        # K and V blocks on 3 stages; 32-key blocks at hdim 256, where Q and dO leave 96 KB for them
        (128, False): TileConfig(128, 64, 8, 3, hopper=True),
        (128, True): TileConfig(128, 64, 8, 3, hopper=True),
        (256, False): TileConfig(128, 32, 8, 3, hopper=True),
        (256, True): TileConfig(128, 32, 8, 3, hopper=True),
    },
)

# Other GPUs (Ampere and older, or unknown): smaller tiles that fit 100 KB of shared memory.
PORTABLE_FORWARD = PhaseTable(_buckets(TileConfig(64, 64, 4, 2), TileConfig(64, 32, 4, 2), TileConfig(32, 32, 4, 1)))
PORTABLE_DKDV = PhaseTable(_buckets(TileConfig(32, 64, 4, 1), TileConfig(32, 64, 4, 1), TileConfig(16, 32, 4, 1)))
PORTABLE_DQ = PhaseTable(_buckets(TileConfig(64, 32, 4, 1), TileConfig(64, 32, 4, 1), TileConfig(32, 16, 4, 1)))
# FP8 forward (kernels/forward_fp8.py): BLOCK_N divides fp8.SCALE_BLOCK; swept at 16k tokens on the H200 (docs/fp8.md).
# ``hopper``: the Gluon kernel (forward_fp8_hopper.py), the 16-bit one's consumers; 128-key blocks at every hdim
_FP8_GLUON = dict(hopper=True, persistent=True)
HOPPER_FORWARD_FP8 = PhaseTable({**_buckets(*(TileConfig(128, 128, 8, 3),) * 2, TileConfig(128, 128, 8, 2)),
                                 (128, False): TileConfig(64, 128, 4, 3)},
                                hopper=_buckets(*(TileConfig(128, n, 8, stages, three_consumers=d == 64, **_FP8_GLUON)
                                                  for d, n, stages in ((64, 128, 3), (128, 128, 3), (256, 128, 2)))))
PORTABLE_FORWARD_FP8 = PhaseTable(_buckets(*(TileConfig(64, 64, 4, 2),) * 2, TileConfig(64, 32, 4, 1)))
# dK/dV with dQ (kernels/backward_fused_dq.py), non-deterministic calls from 512 tokens; 2 stages; hdim 64 persistent
# (short tiles leave a tail), on 128-row blocks past 512
_FUSED_DQ = TileConfig(64, 128, 8, 2, hopper=True, key_slices=True)
_FUSED_DQ_64 = {rows: dataclasses.replace(_FUSED_DQ, block_m=rows, persistent=True) for rows in (64, 128)}
HOPPER_DKDV_DQ = PhaseTable({}, hopper={(d, c): _FUSED_DQ_64[128] if d == 64 else _FUSED_DQ for d in (64, 128)
                                        for c in (False, True)},
                            hopper_shortest={(64, c): _FUSED_DQ_64[64] for c in (False, True)},
                            hopper_from={(d, c): 512 for d in (64, 128) for c in (False, True)})
TABLES = {("hopper", "forward"): HOPPER_FORWARD, ("hopper", "dkdv"): HOPPER_DKDV, ("hopper", "dq"): HOPPER_DQ,
          ("hopper", "dkdv_dq"): HOPPER_DKDV_DQ, ("hopper", "forward_fp8"): HOPPER_FORWARD_FP8,
          ("portable", "forward"): PORTABLE_FORWARD, ("portable", "dkdv"): PORTABLE_DKDV,
          ("portable", "dq"): PORTABLE_DQ, ("portable", "forward_fp8"): PORTABLE_FORWARD_FP8}
QUANTIZE_TILES = {32: (64, 32, 4, 1), 64: (64, 64, 4, 1), 128: (64, 128, 4, 1), 256: (64, 64, 8, 1)}  # see fp8.md
# the quantizer's one pass by width: (largest group, padded to a power of 2; rows of S a step, warps, stages)
QUANTIZE_ONE_PASS_TILES = {32: (8, 32, 16, 1), 64: (4, 64, 16, 1), 128: (2, 64, 16, 2), 256: (1, 64, 16, 2)}
TRANSPOSE_V_TILE, SIGNED_HADAMARD_ROWS = (64, 4), 32  # FP8 V^T (keys a program, warps); the rotation's S: rows
# the FP8 backward's passes (kernels/backward_fp8_passes.py): descale blocks a step, e4m3 -> float16 (elements, warps)
DESCALE_BLOCKS_TILE, E4M3_TO_FLOAT16_TILE, ROTATE_BACK_TILE = 128, (4096, 4), (64, 4, 4)  # rotation: rows, tiles, warps
HOPPER_DKDV_FP8_STAGES, HOPPER_DQ_FP8_STAGES, HOPPER_DKDV_DQ_FP8_STAGES = 3, {64: 3, 128: 2}, {64: 3}  # rings
DQ_CONVERSION_ROWS = 64  # query rows a program of the fused backward's dQ pass (float32 -> dq: bandwidth-bound)


def delta_rows(interpret: bool) -> int:
    return 16 if interpret else 64  # rows a program of the backward's delta = rowsum(dO * O) (bandwidth-bound)


def paged_forward(config: TileConfig) -> TileConfig:
    """A forward tile for paged keys: a TMA descriptor cannot follow pages, so paged K/V take pointer loads, where a
    tile sized for TMA spills (hdim 128: 128 x 128, about 650 bytes of stack a thread); 64-key blocks at most."""
    if not config.tma:
        return config
    return dataclasses.replace(config, block_n=min(config.block_n, 64), tma=False)

# -- Budgets of the Hopper kernels --
# registers a thread (setmaxnreg) of the consumer warpgroups by their count and of the loader: the SM's 65,536 over
# its warpgroups; a one-consumer forward, two programs an SM, launches at 128 for (232 + 24) x 128 x 2 = 65,536
HOPPER_CONSUMER_REGISTERS, HOPPER_LOADER_REGISTERS, HOPPER_TWO_PROGRAMS_REGISTERS = {1: 232, 2: 240, 3: 160}, 24, 128
HOPPER_DECODE_LOADER_REGISTERS = 56  # it zeroes V past a sequence; at 24-48 ptxas spilled a two-consumer build
HOPPER_DECODE_CONSUMER_REGISTERS = 152  # the second consumer warpgroup of a two-consumer decode program
HOPPER_SHARED_BYTES = 227 * 1024  # the shared memory one program may take
# bytes that the programs in flight of a sectioned grid read again (launch.forward.l2_section_units): K/V for the
# forward's and the Hopper dQ's query tiles, a GQA group's Q and dO for the fused backward's key tiles; well within L2
HOPPER_L2_SECTION_BYTES = 8 << 20
# ... and for causal query tiles, which are unequal work: sections of a wave or less leave each section's longest
# tiles starting as the last one's short tiles end, a tail on some SMs (docs/perf-notes.md, "L2 head sections")
HOPPER_CAUSAL_L2_SECTION_BYTES = 16 << 20
# backward FLOPs from which dK/dV and dQ take two streams (0.4 ms of kernels): shorter calls lose the fork's host time
CONCURRENT_GRADIENTS_MIN_FLOPS = 2e11

# -- Decode: the attention over a KV cache, its splits, the merge --

MAX_SPLITS = 128
# up to this many new tokens a sequence (and without rotary) the attention launch also appends them
FUSED_APPEND_MAX_TOKENS = 16


@dataclass(frozen=True)
class DecodeConfig:
    block_m: int  # rows of the query tile: (query token, query head of the group) pairs
    block_n: int  # keys per step
    num_warps: int
    num_stages: int
    streaming_stages: int = 0  # stages of a streaming launch (``streaming_launch``); 0: num_stages


def decode_config(rows: int, head_dim: int, dtype: torch.dtype, interpret: bool) -> DecodeConfig:
    """The Triton decode kernel's tiles; ``rows`` = group size x seqlen_q. A query tile just large enough for the
    packed rows (16 at least, the tensor cores' minimum) and 64-key blocks on 3 stages: no other of 8 choices came
    out ahead across the sweep's cases. Streaming launches take 4 stages at 16 bits up to head dim 128."""
    if interpret:
        return DecodeConfig(16, 16, 1, 1)
    width = padded_head_dim(head_dim)
    block_m = min(64 if width <= 128 else 32, max(16, next_power_of_2(rows)))
    block_n = 64 if width <= 128 else 32
    if dtype == torch.float32:
        block_n = max(16, block_n // 2)
    streaming_stages = 4 if width <= 128 and dtype != torch.float32 else 0
    return DecodeConfig(block_m, block_n, 4, 3 if width <= 128 else 2, streaming_stages=streaming_stages)


# From this many programs per SM an unsplit launch with streaming stages beats splits: two 4-stage programs fit an SM
STREAMING_PROGRAMS_PER_PROCESSOR = 1.9
# paged: block-table entries read at once, for splits of at least TABLE_CHUNK_MIN_BLOCKS key blocks (one pipelined
# loop over 16 pages instead of one per page)
TABLE_CHUNK_ENTRIES = 16
TABLE_CHUNK_MIN_BLOCKS = 32


def paged_table_chunk(blocks_per_split: int) -> int:
    """Block-table entries that a paged program reads at once (0: page by page)."""
    return TABLE_CHUNK_ENTRIES if blocks_per_split >= TABLE_CHUNK_MIN_BLOCKS else 0


def streaming_launch(config: DecodeConfig, programs: int, processors: int) -> bool:
    """Whether an unsplit launch of ``programs`` programs takes ``config.streaming_stages``."""
    return config.streaming_stages > 0 and programs >= STREAMING_PROGRAMS_PER_PROCESSOR * processors


def choose_num_splits(programs: int, key_blocks: int, processors: int, streaming: bool = False) -> int:
    """Splits of each program's keys for the Triton decode kernel (flash-decoding). ``programs`` = batch x kv heads x
    query tiles; ``key_blocks`` = key blocks of the longest sequence. Below one program per SM: as many splits as fill
    one wave of two programs per SM (rounded down: a third program on some SMs makes them finish last); one to four
    programs per SM: 3; beyond (or streaming): none. Each split keeps at least 4 key blocks."""
    if streaming and programs >= STREAMING_PROGRAMS_PER_PROCESSOR * processors:
        return 1
    if programs > 4 * processors:
        return 1
    if programs >= processors:
        return max(1, min(3, key_blocks // 4))
    wanted = max(1, 2 * processors // programs)
    return max(1, min(wanted, key_blocks // 4, MAX_SPLITS))


# The Hopper decode kernel. Swapped products (S^T = K Q^T, O^T += V^T P^T) for GQA groups up to this many rows
HOPPER_DECODE_SWAPPED_MAX_GROUP = 16
HOPPER_DECODE_CONSUMERS = 2  # swapped products: two consumer warpgroups take the ring's blocks in turn
# padded rows only: the Triton kernel's two programs an SM stream faster from one (batch, kv head) program per SM
# and past this much K and V per SM
HOPPER_DECODE_MAX_PROGRAMS_PER_PROCESSOR = 1.0
HOPPER_DECODE_MAX_BYTES_PER_PROCESSOR = 4.5 * 2**20
LONG_CACHE_TOKENS = 65536  # from this capacity, steps of more than one wave take two splits
HOPPER_DECODE_PROGRAM_BYTES_PER_S = 60e9  # what one unsplit program streams
HOPPER_DECODE_EARLY_MAX_SPLITS = 5  # the most splits whose partitions read the sequence's length themselves


def hopper_decode_query_rows(group_size: int) -> int:
    """Query rows of a swapped Hopper decode program (wgmma's N: the group padded to a power of two, 8 at least), or
    0: the group's rows padded to wgmma's 64 (groups over HOPPER_DECODE_SWAPPED_MAX_GROUP)."""
    if group_size > HOPPER_DECODE_SWAPPED_MAX_GROUP:
        return 0
    return max(8, next_power_of_2(group_size))


def hopper_decode_tile(programs: int, processors: int, page_size: int | None = None, swapped: bool = False
                       ) -> tuple[int, int]:
    """(keys a block, stages) of a Hopper decode launch of ``programs`` (batch x kv heads) programs. Swapped: 64 x 4.
    Padded rows: 64 x 4 up to a quarter program per SM (many short splits), 128 x 3 above; a page of an odd multiple
    of 64 keys takes 64 x 4 (a block lies in a page)."""
    if swapped:
        return 64, 4
    if 4 * programs <= processors or (page_size is not None and page_size % 128 != 0):
        return 64, 4
    return 128, 3


def hopper_decode_splits(programs: int, capacity: int, processors: int, peak_bandwidth: float | None = None) -> int:
    """Splits of a Hopper decode launch (one program an SM). Below one wave: as many as fill the SMs once, each of 256
    keys or more, unless the unsplit programs already draw the GPU's ``peak_bandwidth`` (bytes/s; None: unknown).
    Past one wave: none, but two over caches of LONG_CACHE_TOKENS or more, whose programs end far apart."""
    if programs >= processors:
        return 2 if programs > processors and capacity >= LONG_CACHE_TOKENS else 1
    if peak_bandwidth is not None and programs * HOPPER_DECODE_PROGRAM_BYTES_PER_S >= peak_bandwidth:
        return 1
    return max(1, min(processors // programs, capacity // 256, MAX_SPLITS))


def hopper_decode_consumers(query_rows: int, stages: int) -> int:
    """Consumer warpgroups: two for swapped products on a ring whose stages they divide; else one."""
    return HOPPER_DECODE_CONSUMERS if query_rows and stages % HOPPER_DECODE_CONSUMERS == 0 else 1


def hopper_decode_early_first_block(num_splits: int) -> bool:
    """Whether the partitions read the sequence's length themselves, split 0 copying block 0 before it arrives: a gain
    up to a few splits; past them many short splits each wait for the length behind the barriers' setup."""
    return num_splits <= HOPPER_DECODE_EARLY_MAX_SPLITS


def append_keys(interpret: bool) -> int:
    return 16 if interpret else 32  # new keys a program of the separate append kernel writes


@dataclass(frozen=True)
class CombineTiles:
    block_m: int  # (token, head) rows per program
    split_block: int  # splits loaded at once
    chunk_d: int  # head-dim columns per program: the grid's third axis covers the padded head dim
    num_warps: int


COMBINE_TILE_ELEMENTS = 8192  # float32 partial values a program holds at once


def combine_tiles(num_splits: int, rows: int, block_d: int, processors: int, interpret: bool) -> CombineTiles:
    """The merge's tiles: (split_block x block_m x chunk_d) float32 partials a step. The splits load together (one wait
    on memory, not one per split); the merge is latency-bound, so rows, then columns, shrink until about two programs
    per SM run, within COMBINE_TILE_ELEMENTS."""
    if interpret:  # small tiles: over 4 splits take several steps, and every head dim two column chunks
        return CombineTiles(16, min(4, next_power_of_2(num_splits)), block_d // 2, 1)
    split_block = min(next_power_of_2(MAX_SPLITS), next_power_of_2(num_splits))
    block_m, chunk_d = 16, block_d
    programs = lambda: -(-rows // block_m) * (block_d // chunk_d)  # of the loop's current tiles
    while split_block * block_m * chunk_d > COMBINE_TILE_ELEMENTS or programs() < 2 * processors:
        if block_m > 1:
            block_m //= 2
        elif chunk_d > 16:
            chunk_d //= 2
        else:
            break
    elements = split_block * block_m * chunk_d
    return CombineTiles(block_m, split_block, chunk_d, 4 if elements >= 2048 else 2)


def combine_backward_tiles(num_splits: int, interpret: bool) -> tuple[int, int]:
    return (16 if interpret else 32), min(4 if interpret else 16, next_power_of_2(num_splits))


# -- Lookup --


def padded_head_dim(head_dim: int) -> int:
    """The tile width along the head dim: a power of two, at least 32 (ptxas crashed on the causal dQ at 16)."""
    return max(32, next_power_of_2(head_dim))


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1): Triton's tile sizes, without importing triton."""
    return 1 << max(0, n - 1).bit_length()


def gpu_family(device: torch.device) -> str:
    if device.type != "cuda":
        return "portable"
    index = device.index if device.index is not None else torch.cuda.current_device()
    return "hopper" if compute_capability(index)[0] == 9 else "portable"


@functools.cache
def compute_capability(index: int) -> tuple[int, int]:
    """Cached: every launch looks its tiles up, and the driver query costs host time on each call."""
    return torch.cuda.get_device_capability(index)


_OVERRIDES: dict[str, TileConfig | None] = {}


@contextlib.contextmanager
def use_config(phase: str, config: TileConfig | None):
    """Force ``config`` for ``phase`` (a key of TABLES: "forward", "dkdv", ...) inside the block: how the tile sweeps
    try candidates; None where a phase may have no tile (``dkdv_dq``: the two passes)."""
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
    """The configs that ``use_config`` forces now, by phase: part of a launch plan's key."""
    return tuple(_OVERRIDES.items())


def lookup(family: str, phase: str, head_dim: int, masked: bool, dtype: torch.dtype, attn_mask: bool = False,
           seqlen: int = 0, hopper: bool = False, packed: bool = False) -> TileConfig | None:
    """The table's config for ``phase`` on a GPU ``family`` ("hopper" or "portable"), without a device; None where
    the phase has no entry (``dkdv_dq``: the two passes).

    ``attn_mask``: an SDPA mask streams beside K and V. ``seqlen``: the shorter of the (longest) query and key
    lengths, which picks the length entries (0: unknown, none). ``hopper``: the call fits the Hopper kernels, whose
    entries then come first. ``packed``: a varlen call, which takes no long-sequence Hopper entry (its persistent grid
    hands out the unequal tiles of sequences shorter than the longest).
    """
    width = padded_head_dim(head_dim)
    key = (min(b for b in (64, 128, 256) if b >= width), masked)
    table = TABLES[(family, phase)]
    if hopper and table.hopper:
        by_length = _for_length(seqlen, table.hopper_short, table.hopper_shortest, {} if packed else table.hopper_long)
        config = None  # below hopper_from, or a None entry: the Triton table's entry
        if not 0 < seqlen < table.hopper_from.get(key, 0):
            config = by_length[key] if key in by_length else table.hopper.get(key)
        if config is not None:
            return config
    config = _for_length(seqlen, table.short, table.shortest, table.long).get(key) or table.base.get(key)
    return None if config is None else fitted(config, dtype, attn_mask, width)  # None: a phase without this entry


def _for_length(seqlen: int, short: dict, shortest: dict, long: dict) -> dict:
    """The length entries that apply at ``seqlen`` (0, unknown: none)."""
    if seqlen >= LONG_SEQLEN:
        return long
    if 0 < seqlen <= SHORTEST_SEQLEN:
        return short | shortest
    if 0 < seqlen <= SHORT_SEQLEN:
        return short
    return {}


def fitted(config: TileConfig, dtype: torch.dtype, attn_mask: bool = False, width: int = 0) -> TileConfig:
    """``config`` (a table entry, for 16-bit inputs and no SDPA mask) cut to fit ``dtype``, a mask and ``width``."""
    if dtype == torch.float32:
        # fp32 tiles take twice the shared memory: halve the tiles that stream. Wider than 128, exact fp32 products
        # are FMA chains holding whole rows in each thread: 32 x 16 tiles on 4 warps spill least (ptxas 3.4x faster)
        config = dataclasses.replace(config, max_registers=None, **(
            dict(block_m=32, block_n=16, num_warps=4, num_stages=1) if width > 128 else
            dict(block_m=max(16, config.block_m // 2), block_n=max(16, config.block_n // 2),
                 num_stages=max(1, config.num_stages - 1))))
    if attn_mask:
        # the mask's (BLOCK_M, BLOCK_N) tile is pipelined beside K and V, 4 bytes a score for a float mask
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
                interpret: bool, attn_mask: bool = False, seqlen: int = 0, hopper: bool = False,
                packed: bool = False) -> TileConfig | None:
    """The config for ``phase`` ("forward", "dkdv", "dq", "dkdv_dq", "forward_fp8") on ``device``: a forced one
    (``use_config``), the interpreter's, or the table's (:func:`lookup`)."""
    if phase in _OVERRIDES:
        return _OVERRIDES[phase]
    if interpret:
        return INTERPRETER
    return lookup(gpu_family(device), phase, head_dim, masked, dtype, attn_mask, seqlen, hopper, packed)
