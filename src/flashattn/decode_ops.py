"""Custom ops of the inference entry points: KV-cache append, attention over the cache, combine.

Same pattern as ``ops.py``: each op is a ``torch.library.custom_op`` with a CPU implementation
(``cpu_decode.py``), a CUDA implementation (Triton, ``kernels/decode.py`` and ``kernels/combine.py``) and
a fake implementation for ``torch.compile``; ``FLASHATTN_BACKEND=torch|triton`` overrides the choice.
The tile and split choices for decoding live here too (``decode_config``, ``choose_num_splits``).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch

from . import configs, cpu_decode
from .launcher import launch
from .ops import (
    DECODE_CONSUMER_REGISTERS,
    LOG2E,
    WS_LOADER_REGISTERS,
    _alibi_args,
    _cdiv,
    _dot_flags,
    _kernel_scalars,
    _last_dim_contiguous,
    _plannable,
    _sm_count,
    _tile_layout,
    _tma_loads,
    _token_descriptor,
    backend_for_cpu_tensors,
    backend_override,
    interpreting,
    planned,
)
from .options import AttentionOptions

MAX_SPLITS = 128


@dataclass(frozen=True)
class DecodeConfig:
    block_m: int  # rows of the query tile: (query token, query head of the group) pairs
    block_n: int  # keys per step
    num_warps: int
    num_stages: int
    tma: bool = False  # interior key blocks through TMA descriptors (sm90+; ``tma_decode_loads``)
    table_chunk: int | None = None  # paged: block-table entries read at once (0: page by page; None: the rule
    # of ``paged_table_chunk``)
    streaming_stages: int = 0  # stages of a streaming launch (``streaming_launch``); 0: num_stages


def decode_config(rows: int, head_dim: int, dtype: torch.dtype, interpret: bool) -> DecodeConfig:
    """Tiles for the attention over the cache. ``rows`` = group size x seqlen_q.

    Decoding streams K/V once and does little arithmetic per byte: a query tile just large enough for
    the packed rows (16, the tensor cores' minimum, for a GQA group of up to 16 heads at one token),
    and key blocks that keep a few loads in flight. Swept at hdim 128 bf16 on an H200 (64 keys x 4 warps
    x 3 stages against 7 other key-tile / warp / stage choices, each with its best split count;
    ``benchmarks/decode_splits.py --configs``, docs/perf-notes.md version 6): no other choice came out
    more than 4% ahead on any case, nor ahead across cases. hdim 64 and 256 are not swept.

    A streaming launch (unsplit, about two programs per processor or more) takes 4 stages at 16 bits and
    head dims up to 128 (``streaming_launch``). TMA loads of the key blocks (``tma``) lost to the pointer
    loads by 0-9% on the same sweep's cases (H200, docs/perf-notes.md, version 15), so they stay off.
    """
    if interpret:
        return DecodeConfig(16, 16, 1, 1)
    width = configs.padded_head_dim(head_dim)
    block_m = min(64 if width <= 128 else 32, max(16, configs.next_power_of_2(rows)))
    block_n = 64 if width <= 128 else 32
    if dtype == torch.float32:
        block_n = max(16, block_n // 2)
    streaming_stages = 4 if width <= 128 and dtype != torch.float32 else 0
    return DecodeConfig(block_m, block_n, 4, 3 if width <= 128 else 2, streaming_stages=streaming_stages)


STREAMING_PROGRAMS_PER_PROCESSOR = 1.9
"""From this many programs per processor, a decode launch whose tiles have ``streaming_stages`` runs
unsplit with that many stages: two 4-stage programs fit an SM's shared memory (104 KB each), and each
keeps three key blocks in flight over the whole sequence instead of a third of it, with no merge
after it. H200, GQA 32/8, hdim 128, bf16 (docs/perf-notes.md, version 15): 4k batch 64, 250-258 us
against 265-270 for 3 splits of 3 stages; 16k batch 64, 948 against 972. Below about two programs per SM
an unsplit launch leaves SMs with one program where others run two, and splits win."""


TABLE_CHUNK_ENTRIES = 16
TABLE_CHUNK_MIN_BLOCKS = 32


def paged_table_chunk(config: DecodeConfig, blocks_per_split: int) -> int:
    """Block-table entries that a paged program reads at once (0: page by page), for a split of about
    ``blocks_per_split`` key blocks (from the capacity: the lengths are on the GPU).

    Page by page, each page's few blocks (4 of 64 keys in a 256-key page) form a loop of their own, whose
    pipeline fills and drains on every page. Reading TABLE_CHUNK_ENTRIES entries at once puts 16 pages'
    blocks in one pipelined loop. H200, GQA 32/8, hdim 128, bf16, 256-key pages (docs/perf-notes.md, version
    15): 64-128 blocks a split ran 3-4% faster (8k batch 16: 133.2 against 138.6 us; 16k batch 8: 132.4
    against 136.2; 64k batch 4: 251.3 against 259.4), 16 blocks a split 1-3% slower (4k batch 8: 43.3
    against 42.2), so splits from TABLE_CHUNK_MIN_BLOCKS blocks take the chunks.
    """
    if config.table_chunk is not None:
        return config.table_chunk
    return TABLE_CHUNK_ENTRIES if blocks_per_split >= TABLE_CHUNK_MIN_BLOCKS else 0


def streaming_launch(config: DecodeConfig, programs: int, processors: int) -> bool:
    """Whether an unsplit launch of ``programs`` programs takes ``config.streaming_stages``."""
    return config.streaming_stages > 0 and programs >= STREAMING_PROGRAMS_PER_PROCESSOR * processors


PROGRAMMATIC_LAUNCH = True
"""Chain a decode step's attention and merge kernels with programmatic dependent launch where the GPU
has it (sm90+): each starts while its predecessor drains, instead of after the launch gap. False
launches them one after the other, for measuring what the chaining saves.

The separate append (rotary, or more than FUSED_APPEND_MAX_TOKENS new tokens) is launched plainly:
chained, it made the steps after it slower on the H200 (bf16, hdim 128, GQA 32/8, unsplit 64k batch
16: 1607 against 995 us; split 64k batch 1: 82 against 73 us)."""


@functools.cache
def _compute_capability(device_index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device_index)


def _cuda_index(device: torch.device) -> int:
    """The CUDA device's index (the current device for a bare "cuda")."""
    return device.index if device.index is not None else torch.cuda.current_device()


def chained_launch(device: torch.device) -> bool:
    """Whether the decode kernels on ``device`` launch chained (``kernels/common.chain_launch``)."""
    if not PROGRAMMATIC_LAUNCH or device.type != "cuda" or interpreting():
        return False
    return _compute_capability(_cuda_index(device))[0] >= 9


def processor_count(device: torch.device) -> int:
    """Streaming multiprocessors of the GPU; under the interpreter a small stand-in, so that the
    default heuristic splits there too and the tests exercise it."""
    if device.type != "cuda":
        return 4
    return _sm_count(_cuda_index(device))


def peak_memory_bandwidth(device: torch.device) -> float | None:
    """The GPU's peak memory bandwidth in bytes/s (double data rate: 2 x memory clock x bus width), or None where torch
    does not report the two (and off the GPU)."""
    if device.type != "cuda":
        return None
    return _peak_memory_bandwidth(_cuda_index(device))


@functools.cache
def _peak_memory_bandwidth(index: int) -> float | None:
    properties = torch.cuda.get_device_properties(index)
    clock_khz, bus_bits = getattr(properties, "memory_clock_rate", 0), getattr(properties, "memory_bus_width", 0)
    return 2 * clock_khz * 1e3 * bus_bits / 8 if clock_khz and bus_bits else None


def choose_num_splits(programs: int, key_blocks: int, processors: int, streaming: bool = False) -> int:
    """How many chunks to split each program's keys into (flash-decoding).

    ``programs`` = batch x kv heads x query tiles; ``key_blocks`` = key blocks of the longest sequence.
    Below one program per processor: as many splits as fit one wave of two programs per processor
    (rounded down). From one to four programs per processor: 3 splits. Beyond: no split. Each split
    keeps at least 4 key blocks, so that the loads are still pipelined and the merge stays cheap next
    to the attention.

    Measured on an H200 (132 SMs; ``benchmarks/decode_splits.py``, GQA 32/8, hdim 128, 8k-64k, batch
    1-16, contiguous and paged, kernel version 6): the best split count put 256-264 programs in the
    launch in 23 of 25 cases, and the other two were within 1.3% of that choice. Rounding up (a third
    program on some SMs, which then finish last) cost up to 11% (64k batch 2: 147 against 131 us).
    Version 4's kernel, with a two-stage paged loop, had measured the opposite. Batches that fill the
    GPU alone (batch 32 and 64 there, 4k-128k keys): unsplit steps ran at 81-91% of the copy bandwidth
    and 3 splits came within 3.3% of the best of 1-4 splits in all 10 cases (128k batch 64: 8843 us
    unsplit, 7592 with 3 splits, 7351 with 4; cuDNN 7466). Not measured beyond 4 programs per SM.

    ``streaming``: the tiles have streaming stages, so from STREAMING_PROGRAMS_PER_PROCESSOR programs per
    processor the launch is not split (``streaming_launch``).
    """
    if streaming and programs >= STREAMING_PROGRAMS_PER_PROCESSOR * processors:
        return 1
    if programs > 4 * processors:
        return 1
    if programs >= processors:
        return max(1, min(3, key_blocks // 4))
    wanted = max(1, 2 * processors // programs)
    return max(1, min(wanted, key_blocks // 4, MAX_SPLITS))


# ---------------------------------------------------------------------------------------------
# Launchers
# ---------------------------------------------------------------------------------------------


def _paged_geometry(k_cache: torch.Tensor, block_table: torch.Tensor | None) -> dict:
    """capacity (keys a sequence can hold), rows that the batch index addresses, blocks, page size."""
    if block_table is None:
        return dict(capacity=k_cache.shape[1], batch_cache=k_cache.shape[0], num_blocks=0, page_size=1)
    return dict(capacity=block_table.shape[1] * k_cache.shape[1], batch_cache=block_table.shape[0],
                num_blocks=k_cache.shape[0], page_size=k_cache.shape[1])


def _rotary_args(rotary_cos: torch.Tensor | None) -> tuple[int, int]:
    """(rotary_dim, seqlen_ro); (0, 0) without rotary."""
    if rotary_cos is None:
        return 0, 0
    return 2 * rotary_cos.shape[1], rotary_cos.shape[0]


def _triton_append(k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, block_table, rotary_cos, rotary_sin,
                   rotary_interleaved: bool) -> None:
    from .kernels.decode import kvcache_append_kernel

    batch, seqlen_new, nheads_k, head_dim = k.shape
    geometry = _paged_geometry(k_cache, block_table)
    rotary_dim, seqlen_ro = _rotary_args(rotary_cos)
    block_n = 16 if interpreting() else 32
    placeholder = cache_seqlens  # any pointer will do where a constexpr flag says it is never read
    cos = rotary_cos if rotary_cos is not None else k
    sin = rotary_sin if rotary_sin is not None else k
    grid = (_cdiv(seqlen_new, block_n), batch * nheads_k)
    launch(
        kvcache_append_kernel, grid,
        k, v, k_cache, v_cache, cache_seqlens,
        cache_batch_idx if cache_batch_idx is not None else placeholder,
        block_table if block_table is not None else placeholder, cos, sin,
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_table.stride(0) if block_table is not None else 0,
        cos.stride(0), sin.stride(0),
        seqlen_new, nheads_k, geometry["capacity"], geometry["batch_cache"], geometry["num_blocks"],
        geometry["page_size"], rotary_dim, seqlen_ro,
        HEAD_DIM=head_dim, BLOCK_D=configs.padded_head_dim(head_dim), BLOCK_N=block_n,
        PAGED=block_table is not None, HAS_BATCH_IDX=cache_batch_idx is not None,
        HAS_ROTARY=rotary_cos is not None, INTERLEAVED=rotary_interleaved,
    )


def tma_decode_loads(config: DecodeConfig, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     block_table: torch.Tensor | None, one_page: bool) -> bool:
    """Whether the attention over these caches takes ``config``'s TMA loads. The descriptors need 16-byte
    aligned rows; a paged pool is addressed as one run of rows (pages one after the other, so the page
    stride must be page_size rows, and the rows must fit TMA's int32 coordinates), with the key blocks
    inside pages (``one_page``)."""
    if not config.tma:
        return False
    if block_table is not None:
        for cache in (k_cache, v_cache):
            num_pages, page_size = cache.shape[:2]
            if cache.stride(0) != page_size * cache.stride(1) or num_pages * page_size >= 2**31:
                return False
        if not one_page:
            return False
    elif k_cache.shape[1] >= 2**31:
        return False
    if k_cache.is_cuda and _compute_capability(k_cache.device.index)[0] < 9:
        return False
    return _tma_loads(True, k_cache, v_cache)


def _chain_arguments(device: torch.device, enabled: bool = True) -> dict:
    chained = enabled and chained_launch(device)
    return dict(CHAINED=chained, launch_pdl=chained)


def _triton_combine(out_partial, lse_partial, out=None, lse=None, chained: bool = True):
    """The merge of the splits' partials, launched chained (``chained_launch``) unless ``chained`` is False: after a
    split Gluon decode step it is launched plainly (GLUON_DECODE_MERGE_CHAINED)."""
    from .kernels.combine import combine_kernel

    out_partial = _last_dim_contiguous(out_partial)
    num_splits, batch, seqlen, nheads, head_dim = out_partial.shape
    if out is None:
        out = torch.empty(out_partial.shape[1:], dtype=out_partial.dtype, device=out_partial.device)
    if lse is None:
        lse = torch.empty(batch, nheads, seqlen, dtype=lse_partial.dtype, device=lse_partial.device)
    block_d = configs.padded_head_dim(head_dim)
    tiles = combine_tiles(num_splits, batch * seqlen * nheads, block_d, processor_count(out_partial.device),
                          interpreting())
    grid = (_cdiv(seqlen * nheads, tiles.block_m), batch, block_d // tiles.chunk_d)
    launch(
        combine_kernel, grid,
        out_partial, lse_partial, out, lse,
        *out_partial.stride()[:4], *lse_partial.stride(),
        *out.stride()[:3], *lse.stride(),
        num_splits, seqlen, nheads,
        HEAD_DIM=head_dim, CHUNK_D=tiles.chunk_d, BLOCK_M=tiles.block_m, SPLIT_BLOCK=tiles.split_block,
        ROUND_TO_NEAREST=out.dtype == torch.float32, num_warps=tiles.num_warps,
        **_chain_arguments(out.device, chained),
    )
    return out, lse


@dataclass(frozen=True)
class CombineTiles:
    block_m: int  # (token, head) rows per program
    split_block: int  # splits loaded at once
    chunk_d: int  # head-dim columns per program: the grid's third axis covers the padded head dim
    num_warps: int


COMBINE_TILE_ELEMENTS = 8192  # float32 partial values a program holds at once


def combine_tiles(num_splits: int, rows: int, block_d: int, processors: int, interpret: bool) -> CombineTiles:
    """The combine's tiles: (split_block x block_m x chunk_d) float32 partials per step.

    Loading the splits of a decode step (up to ~40) together makes the merge wait on memory once
    instead of once per split (a loop over single splits cost ~55 us at 33 splits on an H200). The
    merge reads a few MB at most, so what bounds it is latency, not bandwidth: a batch-1 step has only
    32 rows, and whole-row tiles of 4 rows gave 8 programs that took 8.7-16.8 us (H200, run efcc6a4).
    So the rows per program, then the head-dim columns, shrink until about two programs per processor
    run (or the tile is one row by 16 columns), and the tile stays within COMBINE_TILE_ELEMENTS.
    """
    if interpret:  # small tiles: over 4 splits take several steps, and every head dim two column chunks
        return CombineTiles(16, min(4, configs.next_power_of_2(num_splits)), block_d // 2, 1)
    split_block = min(configs.next_power_of_2(MAX_SPLITS), configs.next_power_of_2(num_splits))
    block_m, chunk_d = 16, block_d

    def programs() -> int:
        return _cdiv(rows, block_m) * (block_d // chunk_d)

    while split_block * block_m * chunk_d > COMBINE_TILE_ELEMENTS or programs() < 2 * processors:
        if block_m > 1:
            block_m //= 2
        elif chunk_d > 16:
            chunk_d //= 2
        else:
            break
    elements = split_block * block_m * chunk_d
    return CombineTiles(block_m, split_block, chunk_d, 4 if elements >= 2048 else 2)


def _triton_combine_backward(dout, dlse, out_partial, lse_partial):
    from .kernels.combine import combine_backward_kernel

    dout, out_partial = _last_dim_contiguous(dout), _last_dim_contiguous(out_partial)
    num_splits, batch, seqlen, nheads, head_dim = out_partial.shape
    dout_partial = torch.empty_like(out_partial, memory_format=torch.contiguous_format)
    dlse_partial = torch.empty_like(lse_partial, memory_format=torch.contiguous_format)
    block_m = 16 if interpreting() else 32
    launch(
        combine_backward_kernel, (_cdiv(seqlen * nheads, block_m), batch),
        dout, dlse, out_partial, lse_partial, dout_partial, dlse_partial,
        *dout.stride()[:3], *dlse.stride(),
        *out_partial.stride()[:4], *lse_partial.stride(),
        *dout_partial.stride()[:4], *dlse_partial.stride(),
        num_splits, seqlen, nheads,
        HEAD_DIM=head_dim, BLOCK_D=configs.padded_head_dim(head_dim), BLOCK_M=block_m,
        SPLIT_BLOCK=min(4 if interpreting() else 16, configs.next_power_of_2(num_splits)),
    )
    return dout_partial, dlse_partial


def _split_targets(q: torch.Tensor, num_splits: int) -> tuple:
    """(out, lse) of a decode step (``_decode_outputs_like``), where its attention launch writes (the outputs
    themselves when unsplit, float32 partials per split to merge after it), and those targets' strides over (split,
    batch, token, head) and (split, batch, head, token); split stride 0 when unsplit (no view of the outputs: a
    launch plan could not make it)."""
    out, lse = _decode_outputs_like(q)
    if num_splits == 1:
        return out, lse, out, lse, (0, *out.stride()[:3]), (0, *lse.stride())
    out_target = torch.empty((num_splits, *q.shape), dtype=torch.float32, device=q.device)
    lse_target = torch.empty((num_splits, *lse.shape), dtype=torch.float32, device=q.device)
    return out, lse, out_target, lse_target, out_target.stride()[:4], lse_target.stride()


GLUON_DECODE = True
"""Decode steps go through the Gluon kernel (``kernels/decode_hopper.py``) on sm90 where it fits
(``_gluon_decode_fits``). H200, GQA 32/8, hdim 128, bf16, with the one-token append (docs/perf-notes.md, version 25,
calls H and I): 1-8% faster than the Triton kernel from 4k to 128k tokens and batch 1 to 64 (4k batch 16: 65.2
against 69.9 us; 8k batch 64: 472.1 against 479.7). False: the Triton kernel everywhere."""
GLUON_DECODE_PAGED = True
"""Paged caches through the Gluon kernel too: one descriptor over the page pool, each block's page looked up by the
loader a block ahead. H200, GQA 32/8, hdim 128, bf16, 256-key pages, with the append (docs/perf-notes.md, version 25,
calls H and I): 2-12% faster than the Triton kernel (4k batch 16: 65.6 against 73.5 us; 16k batch 32: 476.3 against
485.4). False: paged caches on the Triton kernel."""
GLUON_DECODE_SWAPPED = True
"""The Gluon kernel's products swapped for GQA groups of up to SWAPPED_MAX_GROUP query rows: S^T = K Q^T and O^T +=
V^T P^T, the keys and head dims along wgmma's 64 rows and the group's rows along its N (8 or 16), instead of the
group's rows padded to 64. H200, GQA 32/8, hdim 128, bf16 (docs/perf-notes.md, version 25, call H): 1.5-4% shorter
steps than the padded rows (4k batch 2: 16.4 against 17.1 us; 8k batch 16: 122.5 against 124.4), which also lose
1-2% to the Triton kernel past one program an SM (call E) and so keep the gates below. False: the padded rows."""
GLUON_DECODE_CONSUMERS = 2
"""Swapped products: consumer warpgroups taking the ring's blocks in turn (1 or 2; the second hands its state to the
first at the end; two only on a ring of an even stage count, ``gluon_decode_consumers``). H200 (docs/perf-notes.md,
version 25, call M): two 0.5-2.5% faster than one at batch 1-64 (4k batch 16: 65.3 against 66.1 us; 64k batch 64:
3770 against 3864)."""
GLUON_DECODE_MERGE_CHAINED = False
"""The merge after a split Gluon step launched chained (programmatic dependent launch), as after the Triton kernel.
H200 (docs/perf-notes.md, version 26, call K): plainly 0.1-0.3 us shorter at every split step timed (4k batch 1: 11.5
against 11.7 us; 8k batch 4: 37.8 against 38.1). Releasing the merge at the attention's start was 1-1.4 us longer
(call J), and the attention chained itself up to 7% (call A)."""
GLUON_DECODE_EARLY_FIRST_BLOCK: bool | None = None
"""The Gluon kernel's partitions read the sequence's length themselves, and split 0 copies block 0 before it arrives
(``kernels/decode_hopper.py``, EARLY_FIRST_BLOCK); None: by ``gluon_decode_early_first_block``."""
GLUON_DECODE_EARLY_MAX_SPLITS = 5
"""The most splits of a launch whose partitions read the length themselves. H200, GQA 32/8 (docs/perf-notes.md,
version 28, calls B-C): 0.3-1.3% shorter steps at 1-5 splits (paged 4k batch 32: 126.4 against 127.1 us; 4k batch 4:
23.3 against 23.6; 4k batch 3, 5 splits: 19.9 against 20.1), 0.1-0.2 us longer at 8 and 16 (4k batch 2: 16.1
against 15.9), where many short splits each wait for the length behind the barriers' setup instead of during it."""
SWAPPED_MAX_GROUP = 16  # larger groups' S^T, sums and O^T (query rows x 64 keys or head dims) outgrow the registers
# padded rows only: from one (batch, kv head) program per SM, and past this much K and V (at capacity) a step reads
# per SM, the Triton kernel
GLUON_DECODE_MAX_PROGRAMS_PER_PROCESSOR = 1.0
GLUON_DECODE_MAX_BYTES_PER_PROCESSOR = 4.5 * 2**20
GLUON_DECODE_TILE: tuple[int, int] | None = None  # (keys a block, stages) for every launch; None: gluon_decode_tile
GLUON_DECODE_SPLITS: int | None = None  # the split count of every automatic launch; None: gluon_decode_splits
LONG_CACHE_TOKENS = 65536  # gluon_decode_splits: from this capacity, steps of more than one wave take two splits
GLUON_DECODE_PROGRAM_BYTES_PER_S = 60e9
"""What one unsplit Gluon decode program streams (H200: 64 of them read 3.86 TB/s at 16k batch 8, docs/perf-notes.md,
version 27). gluon_decode_splits splits a launch of fewer programs than SMs only where its programs at this rate fall
short of the GPU's peak memory bandwidth: on an H100 (3.35 TB/s) batch 8's 64 programs (GQA 32/8) are not split,
2-5.5% faster than in two splits with their merge (call H); on an H200 (4.8 TB/s) they are."""


def gluon_query_rows(group_size: int) -> int:
    """The query rows of a swapped Gluon decode program (wgmma's N: the group's rows padded to a power of two, 8 at
    least), or 0: the group's rows padded to wgmma's 64 (GLUON_DECODE_SWAPPED off, or a group of more than
    SWAPPED_MAX_GROUP)."""
    if not GLUON_DECODE_SWAPPED or group_size > SWAPPED_MAX_GROUP:
        return 0
    return max(8, configs.next_power_of_2(group_size))


def gluon_decode_tile(programs: int, processors: int, page_size: int | None = None, swapped: bool = False
                      ) -> tuple[int, int]:
    """(keys a block, stages) of a Gluon decode launch of ``programs`` (batch x kv heads) programs before splits.
    ``swapped`` (``gluon_query_rows``): 64-key blocks on 4 stages (H200, call H of version 25: 6 stages no faster;
    128-key blocks faulted on the GPU). Padded rows: both tiles hold one program an SM (a 16 KB Q tile beside 128-144 KB
    or 192 KB of K/V; Gluon sizes a warp-specialized program's registers for 8 warps): 64-key blocks on 4 stages up to a
    quarter program per processor, where the splits are many and short, 128-key blocks on 3 stages above. H200, GQA
    32/8, hdim 128, bf16 (docs/perf-notes.md, version 24): batch 1-4 ran fastest on 64 x 4 (8k batch 1: 16.2 us, against
    16.6 on 128 x 3), batch 8-16 on 128 x 3 (4k batch 16: 64.7 against 65.7). A paged cache's blocks must lie in a page:
    64 x 4 for pages of an odd multiple of 64 keys."""
    if GLUON_DECODE_TILE is not None:
        return GLUON_DECODE_TILE
    if swapped:
        return 64, 4
    if 4 * programs <= processors or (page_size is not None and page_size % 128 != 0):
        return 64, 4
    return 128, 3


def gluon_decode_splits(programs: int, capacity: int, processors: int, peak_bandwidth: float | None = None) -> int:
    """Splits of a Gluon decode launch: one program an SM, so below one program per processor as many splits as fill the
    processors once, each of 256 keys or more, unless the unsplit programs already draw the GPU's ``peak_bandwidth``
    (bytes/s; None: unknown) at GLUON_DECODE_PROGRAM_BYTES_PER_S each. Past one wave, none; but two over caches of
    LONG_CACHE_TOKENS or more, whose programs end far apart (their SMs draw unequal shares of the bandwidth): halved
    programs let the SMs that finish first take more of the work. H200, GQA 32/8, hdim 128, bf16, with the append
    (docs/perf-notes.md, version 26, calls M-N): 0.5-0.9% shorter at batch 32 on 64k / 128k caches (128k: 3773.6 against
    3807.6 us), 0.1-0.3% at batch 64; 0.6-2.4% longer at one wave (batch 16), 0.5-5.8% on caches of 16k or less, whose
    programs end closer together than the merge launch costs."""
    if GLUON_DECODE_SPLITS is not None:
        return GLUON_DECODE_SPLITS
    if programs >= processors:
        return 2 if programs > processors and capacity >= LONG_CACHE_TOKENS else 1
    if peak_bandwidth is not None and programs * GLUON_DECODE_PROGRAM_BYTES_PER_S >= peak_bandwidth:
        return 1
    return max(1, min(processors // programs, capacity // 256, MAX_SPLITS))


def _gluon_decode_fits(q, k_cache, v_cache, cache_batch_idx, cache_leftpad, block_table, rotary_cos, alibi_slopes,
                       opts: AttentionOptions, k_new) -> bool:
    """Whether a step takes the Gluon kernel: GLUON_DECODE, an sm90 GPU, one query token (with padded rows, not swapped
    ones: fewer programs than SMs, GLUON_DECODE_MAX_PROGRAMS_PER_PROCESSOR, and a cache of at most
    GLUON_DECODE_MAX_BYTES_PER_PROCESSOR an SM; beyond, the Triton kernel's two programs an SM stream faster), caches of
    whole 16-byte-aligned rows, one run of rows (a contiguous cache's sequences, or a paged pool's pages, one after the
    other; pages of a multiple of 64 keys), 16-bit inputs, head dim 64 or 128, up to FUSED_APPEND_MAX_TOKENS new keys,
    and none of the options it lacks (ALiBi, softcap, a left window, rotary, left padding, a batch index)."""
    if not GLUON_DECODE or interpreting() or not q.is_cuda or _compute_capability(q.device.index)[0] != 9:
        return False
    batch, seqlen_q, nheads, head_dim = q.shape
    nheads_k = k_cache.shape[2]
    if seqlen_q != 1 or head_dim not in (64, 128) or nheads // nheads_k > 64:
        return False
    capacity = _paged_geometry(k_cache, block_table)["capacity"]
    processors = processor_count(q.device)
    if not gluon_query_rows(nheads // nheads_k) and (
            batch * nheads_k >= GLUON_DECODE_MAX_PROGRAMS_PER_PROCESSOR * processors
            or 2 * batch * capacity * nheads_k * head_dim * k_cache.element_size()
            > GLUON_DECODE_MAX_BYTES_PER_PROCESSOR * processors):
        return False
    if k_new is not None and k_new.shape[1] > FUSED_APPEND_MAX_TOKENS:
        return False
    if any(x is not None for x in (cache_batch_idx, cache_leftpad, rotary_cos, alibi_slopes)):
        return False
    if q.dtype not in (torch.bfloat16, torch.float16) or opts.softcap != 0.0 or opts.window_left >= 0:
        return False
    if block_table is not None and (not GLUON_DECODE_PAGED or k_cache.shape[1] % 64 != 0 or block_table.stride(1) != 1):
        return False
    if k_cache.shape[0] * k_cache.shape[1] >= 2**31:  # the descriptors' rows are TMA's int32 coordinates
        return False
    one_run = all(c.stride(3) == 1 and c.stride(2) == head_dim and c.stride(1) == nheads_k * head_dim
                  and c.stride(0) == c.shape[1] * c.stride(1) and c.data_ptr() % 16 == 0 for c in (k_cache, v_cache))
    return one_run and q.is_contiguous() and q.data_ptr() % 16 == 0


def gluon_decode_consumers(query_rows: int, stages: int) -> int:
    """Consumer warpgroups of a Gluon decode launch: GLUON_DECODE_CONSUMERS for swapped products (``query_rows`` > 0)
    on a ring whose stages they divide, so that each keeps its own (the kernel's assertion says why), else one."""
    return GLUON_DECODE_CONSUMERS if query_rows and stages % GLUON_DECODE_CONSUMERS == 0 else 1


def gluon_decode_early_first_block(num_splits: int) -> bool:
    """Whether a Gluon decode launch of ``num_splits`` splits reads the sequence's length in its partitions, its split
    0 copying block 0 before the length arrives (GLUON_DECODE_EARLY_FIRST_BLOCK, else GLUON_DECODE_EARLY_MAX_SPLITS)."""
    if GLUON_DECODE_EARLY_FIRST_BLOCK is not None:
        return GLUON_DECODE_EARLY_FIRST_BLOCK
    return num_splits <= GLUON_DECODE_EARLY_MAX_SPLITS


def _gluon_attention(q, k_cache, v_cache, cache_seqlens, block_table, seqlen_new: int, opts: AttentionOptions,
                     num_splits: int, k_new=None, v_new=None):
    """(out, lse) of a decode step through the Gluon kernel (``_gluon_decode_fits``), which also appends
    ``k_new``/``v_new`` when given; without them, over the keys up to cache_seqlens + ``seqlen_new`` (appended by a
    launch before)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from .kernels.decode_hopper import kvcache_decode_hopper_kernel

    batch, _, nheads, head_dim = q.shape
    nheads_k = k_cache.shape[2]
    geometry = _paged_geometry(k_cache, block_table)
    capacity = geometry["capacity"]
    programs, processors = batch * nheads_k, processor_count(q.device)
    query_rows = gluon_query_rows(nheads // nheads_k)
    block_n, stages = gluon_decode_tile(programs, processors, None if block_table is None else geometry["page_size"],
                                        query_rows > 0)
    if block_n != 64:  # the swapped products take 64-key blocks only (a tile forced by GLUON_DECODE_TILE)
        query_rows = 0
    if num_splits <= 0:
        num_splits = gluon_decode_splits(programs, capacity, processors, peak_memory_bandwidth(q.device))
    num_splits = min(num_splits, MAX_SPLITS)
    out, lse, out_target, lse_target, out_strides, lse_strides = _split_targets(q, num_splits)
    out_strides, lse_strides = (out_strides[0], out_strides[1], out_strides[3]), lse_strides[:3]  # one token: no m
    # the queries as (batch x heads) rows: a GQA group's rows are consecutive
    q_desc = TensorDescriptor(q, [batch * nheads, head_dim], [head_dim, 1], [query_rows or 64, head_dim],
                              _tile_layout(query_rows or 64, head_dim, q.dtype))
    k_desc, v_desc = _token_descriptor(k_cache, block_n), _token_descriptor(v_cache, block_n)
    if k_new is not None:
        k_new, v_new = k_new.contiguous(), v_new.contiguous()  # whole rows for their descriptors
        kn_desc, vn_desc = _token_descriptor(k_new, block_n), _token_descriptor(v_new, block_n)
        new_keys, extra_keys = k_new.shape[1], 0
    else:
        k_new, v_new, kn_desc, vn_desc, new_keys = k_cache, v_cache, k_desc, v_desc, 0  # never read
        extra_keys = seqlen_new
    launch(
        kvcache_decode_hopper_kernel, (batch * nheads_k, num_splits),
        q_desc, k_desc, v_desc, kn_desc, vn_desc, out_target, lse_target, cache_seqlens, k_cache, v_cache, k_new,
        v_new, block_table if block_table is not None else cache_seqlens,
        *out_strides, *lse_strides, *k_cache.stride()[1:3], *k_new.stride()[:3],
        block_table.stride(0) if block_table is not None else 0,
        nheads, nheads_k, capacity, num_splits, new_keys, extra_keys, geometry["page_size"], geometry["num_blocks"],
        opts.softmax_scale * LOG2E,
        HEAD_DIM=head_dim, BLOCK_N=block_n, NUM_STAGES=stages, LOADER_REGISTERS=WS_LOADER_REGISTERS,
        NEW_KEYS=configs.next_power_of_2(new_keys) if new_keys else 0, PAGED=block_table is not None,
        QUERY_ROWS=query_rows, CONSUMERS=gluon_decode_consumers(query_rows, stages),
        CONSUMER_REGISTERS=DECODE_CONSUMER_REGISTERS,
        EARLY_FIRST_BLOCK=gluon_decode_early_first_block(num_splits),
        num_warps=4,
    )
    if num_splits > 1:
        _triton_combine(out_target, lse_target, out, lse, chained=GLUON_DECODE_MERGE_CHAINED)
    return out, lse


def _triton_attention(q, k_cache, v_cache, cache_seqlens, cache_batch_idx, cache_leftpad, block_table, rotary_cos,
                      rotary_sin, alibi_slopes, seqlen_new: int, opts: AttentionOptions, rotary_interleaved: bool,
                      num_splits: int, k_new=None, v_new=None):
    """The attention over the caches, after appending ``k_new``/``v_new`` when given: in the same launch
    (FUSE_APPEND) up to FUSED_APPEND_MAX_TOKENS new tokens per sequence, else in a launch before it. Steps that the
    Gluon kernel fits (``_gluon_decode_fits``) go there instead."""
    from .kernels.decode import kvcache_attention_kernel

    q = _last_dim_contiguous(q)
    if _gluon_decode_fits(q, k_cache, v_cache, cache_batch_idx, cache_leftpad, block_table, rotary_cos, alibi_slopes,
                          opts, k_new):
        return _gluon_attention(q, k_cache, v_cache, cache_seqlens, block_table, seqlen_new, opts, num_splits, k_new,
                                v_new)
    batch, seqlen_q, nheads, head_dim = q.shape
    nheads_k = k_cache.shape[2]
    group_size = nheads // nheads_k
    interpret = interpreting()
    config = decode_config(group_size * seqlen_q, head_dim, q.dtype, interpret)
    # with rotary the new keys would be rotated inside the attention's key loop (a first design that
    # rotated them in the attention launch reached 255 registers and spilled): those steps keep the
    # append's own launch
    fused = k_new is not None and seqlen_new <= FUSED_APPEND_MAX_TOKENS and rotary_cos is None
    if fused:
        k_new, v_new = _last_dim_contiguous(k_new), _last_dim_contiguous(v_new)
    elif k_new is not None:  # a long chunk: appended by a launch of its own first
        _triton_append(k_cache, v_cache, k_new, v_new, cache_seqlens, cache_batch_idx, block_table, rotary_cos,
                       rotary_sin, rotary_interleaved)
    geometry = _paged_geometry(k_cache, block_table)
    row_blocks = _cdiv(group_size * seqlen_q, config.block_m)
    programs, processors = batch * nheads_k * row_blocks, processor_count(q.device)
    key_blocks = _cdiv(geometry["capacity"], config.block_n)
    if num_splits <= 0:
        num_splits = choose_num_splits(programs, key_blocks, processors, config.streaming_stages > 0)
    num_splits = min(num_splits, MAX_SPLITS)
    if num_splits == 1 and streaming_launch(config, programs, processors):
        config = dataclasses.replace(config, num_stages=config.streaming_stages)

    out, lse, out_target, lse_target, out_strides, lse_strides = _split_targets(q, num_splits)

    rotary_dim, seqlen_ro = _rotary_args(rotary_cos)
    slopes, stride_alibi_b, has_alibi = _alibi_args(alibi_slopes, q)
    placeholder = cache_seqlens
    cos = rotary_cos if rotary_cos is not None else q
    sin = rotary_sin if rotary_sin is not None else q
    scalars = _kernel_scalars(opts, None)
    for unused in ("dropout_p", "rng_seed", "rng_offset", "HAS_DROPOUT"):
        scalars.pop(unused)
    one_page = block_table is not None and cache_leftpad is None and geometry["page_size"] % config.block_n == 0
    use_tma = tma_decode_loads(config, k_cache, v_cache, block_table, one_page)
    grid = (row_blocks, batch * nheads_k, num_splits)
    launch(
        kvcache_attention_kernel, grid,
        q, k_cache, v_cache, out_target, lse_target, cache_seqlens,
        cache_batch_idx if cache_batch_idx is not None else placeholder,
        cache_leftpad if cache_leftpad is not None else placeholder,
        block_table if block_table is not None else placeholder, cos, sin, slopes,
        k_new if fused else q, v_new if fused else q,
        q.stride(0), q.stride(1), q.stride(2),
        *(k_new.stride()[:3] if fused else (0, 0, 0)), *(v_new.stride()[:3] if fused else (0, 0, 0)),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        *out_strides, *lse_strides,
        block_table.stride(0) if block_table is not None else 0, cos.stride(0), sin.stride(0), stride_alibi_b,
        seqlen_q, seqlen_new, nheads_k, group_size, geometry["capacity"], geometry["batch_cache"],
        geometry["num_blocks"], geometry["page_size"], rotary_dim, seqlen_ro, num_splits,
        HEAD_DIM=head_dim, BLOCK_D=configs.padded_head_dim(head_dim), BLOCK_M=config.block_m,
        BLOCK_N=config.block_n, PAGED=block_table is not None, ONE_PAGE=one_page, USE_TMA=use_tma,
        TABLE_CHUNK=paged_table_chunk(config, key_blocks // num_splits) if one_page else 0,
        HAS_BATCH_IDX=cache_batch_idx is not None,
        HAS_LEFTPAD=cache_leftpad is not None, HAS_ROTARY=rotary_cos is not None,
        INTERLEAVED=rotary_interleaved, ROTARY_PER_TOKEN=opts.masked, HAS_ALIBI=has_alibi,
        num_warps=config.num_warps, num_stages=config.num_stages, **scalars, **_dot_flags(q.dtype),
        FUSE_APPEND=fused, NEW_KEYS=configs.next_power_of_2(seqlen_new) if fused else 1,
        **_chain_arguments(q.device),
    )
    if num_splits > 1:
        _triton_combine(out_target, lse_target, out, lse)
    return out, lse


# ---------------------------------------------------------------------------------------------
# The custom ops
# ---------------------------------------------------------------------------------------------


def _decode_outputs_like(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Empty (out, lse) of a decode step's shapes: out like q (B, Sq, H, D), lse float32 (B, H, Sq)."""
    batch, seqlen_q, nheads, _ = q.shape
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    return out, q.new_empty((batch, nheads, seqlen_q), dtype=torch.float32)


FUSED_APPEND_MAX_TOKENS = 16
"""Up to this many new tokens per sequence, and without rotary, the attention launch also appends them
(FUSE_APPEND): one launch less per decode step. The kernel's tile of new keys is the next power of two of
their count. The blocks that hold the new keys take the masked path, which reads their rows from k/v: a
longer chunk would put more blocks on that slower path, so it is appended by a launch of its own."""


def _cpu_append_attention(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
                          rotary_cos, rotary_sin, alibi_slopes, opts: AttentionOptions, rotary_interleaved: bool):
    cpu_decode.append(k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, block_table, rotary_cos, rotary_sin,
                      rotary_interleaved)
    return cpu_decode.attention(q, k_cache, v_cache, cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
                                rotary_cos, rotary_sin, alibi_slopes, k.shape[1], opts, rotary_interleaved)


@torch.library.custom_op("flashattn::kvcache_append_attention", mutates_args=("k_cache", "v_cache"),
                         device_types="cpu")
def kvcache_append_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cache_seqlens: torch.Tensor,
    cache_batch_idx: torch.Tensor | None,
    cache_leftpad: torch.Tensor | None,
    block_table: torch.Tensor | None,
    rotary_cos: torch.Tensor | None,
    rotary_sin: torch.Tensor | None,
    alibi_slopes: torch.Tensor | None,
    softmax_scale: float,
    window_left: int,
    window_right: int,
    softcap: float,
    rotary_interleaved: bool,
    num_splits: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A decode step: write k (rotated at positions cache_seqlens[b] + t) and v into the caches, then
    (out, lse) of q over the keys [cache_leftpad, cache_seqlens + k.shape[1]), as :func:`kvcache_attention`."""
    opts = AttentionOptions(softmax_scale, window_left, window_right, softcap)
    if backend_for_cpu_tensors() == "triton":
        return _triton_attention(q, k_cache, v_cache, cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
                                 rotary_cos, rotary_sin, alibi_slopes, k.shape[1], opts, rotary_interleaved,
                                 num_splits, k_new=k, v_new=v)
    return _cpu_append_attention(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, cache_leftpad,
                                 block_table, rotary_cos, rotary_sin, alibi_slopes, opts, rotary_interleaved)


def plan_switches() -> tuple:
    """The switches of this module that decide a decode step's launches: part of its launch plan's key."""
    return (PROGRAMMATIC_LAUNCH, FUSED_APPEND_MAX_TOKENS, GLUON_DECODE, GLUON_DECODE_PAGED,
            GLUON_DECODE_MAX_PROGRAMS_PER_PROCESSOR, GLUON_DECODE_MAX_BYTES_PER_PROCESSOR, GLUON_DECODE_TILE,
            GLUON_DECODE_SPLITS, GLUON_DECODE_SWAPPED, SWAPPED_MAX_GROUP, GLUON_DECODE_CONSUMERS,
            GLUON_DECODE_MERGE_CHAINED, LONG_CACHE_TOKENS, GLUON_DECODE_PROGRAM_BYTES_PER_S, MAX_SPLITS,
            STREAMING_PROGRAMS_PER_PROCESSOR, TABLE_CHUNK_ENTRIES, TABLE_CHUNK_MIN_BLOCKS)


def _planned_attention(phase: str, inputs: tuple, scalars: tuple, call):
    """``call()`` through its launch plan (``ops.planned``) when every input is read in place."""
    if not _plannable(inputs, None, None):
        return call()
    return planned(phase, inputs, scalars, call, plan_switches())


@kvcache_append_attention.register_kernel("cuda")
def kvcache_append_attention_cuda(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, cache_leftpad,
                                  block_table, rotary_cos, rotary_sin, alibi_slopes, softmax_scale, window_left,
                                  window_right, softcap, rotary_interleaved, num_splits):
    opts = AttentionOptions(softmax_scale, window_left, window_right, softcap)
    if backend_override() == "torch":
        return _cpu_append_attention(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, cache_leftpad,
                                     block_table, rotary_cos, rotary_sin, alibi_slopes, opts, rotary_interleaved)
    return _planned_attention(
        "kvcache_append_attention", (q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, cache_leftpad,
                                     block_table, rotary_cos, rotary_sin, alibi_slopes),
        (opts, rotary_interleaved, num_splits),
        lambda: _triton_attention(q, k_cache, v_cache, cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
                                  rotary_cos, rotary_sin, alibi_slopes, k.shape[1], opts, rotary_interleaved,
                                  num_splits, k_new=k, v_new=v))


@kvcache_append_attention.register_fake
def _kvcache_append_attention_fake(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, cache_leftpad,
                                   block_table, rotary_cos, rotary_sin, alibi_slopes, softmax_scale, window_left,
                                   window_right, softcap, rotary_interleaved, num_splits):
    return _decode_outputs_like(q)


@torch.library.custom_op("flashattn::kvcache_attention", mutates_args=(), device_types="cpu")
def kvcache_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    cache_batch_idx: torch.Tensor | None,
    cache_leftpad: torch.Tensor | None,
    block_table: torch.Tensor | None,
    rotary_cos: torch.Tensor | None,
    rotary_sin: torch.Tensor | None,
    alibi_slopes: torch.Tensor | None,
    seqlen_new: int,
    softmax_scale: float,
    window_left: int,
    window_right: int,
    softcap: float,
    rotary_interleaved: bool,
    num_splits: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of q (B, Sq, H, D) over the keys [cache_leftpad, cache_seqlens + seqlen_new) of each
    batch element's cache; lse is float32 (B, H, Sq), natural log, +inf for a row that sees no key."""
    opts = AttentionOptions(softmax_scale, window_left, window_right, softcap)
    if backend_for_cpu_tensors() == "triton":
        return _triton_attention(q, k_cache, v_cache, cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
                                 rotary_cos, rotary_sin, alibi_slopes, seqlen_new, opts, rotary_interleaved,
                                 num_splits)
    return cpu_decode.attention(q, k_cache, v_cache, cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
                                rotary_cos, rotary_sin, alibi_slopes, seqlen_new, opts, rotary_interleaved)


@kvcache_attention.register_kernel("cuda")
def kvcache_attention_cuda(q, k_cache, v_cache, cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
                           rotary_cos, rotary_sin, alibi_slopes, seqlen_new, softmax_scale, window_left,
                           window_right, softcap, rotary_interleaved, num_splits):
    opts = AttentionOptions(softmax_scale, window_left, window_right, softcap)
    if backend_override() == "torch":
        return cpu_decode.attention(q, k_cache, v_cache, cache_seqlens, cache_batch_idx, cache_leftpad,
                                    block_table, rotary_cos, rotary_sin, alibi_slopes, seqlen_new, opts,
                                    rotary_interleaved)
    return _planned_attention(
        "kvcache_attention", (q, k_cache, v_cache, cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
                              rotary_cos, rotary_sin, alibi_slopes),
        (opts, seqlen_new, rotary_interleaved, num_splits),
        lambda: _triton_attention(q, k_cache, v_cache, cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
                                  rotary_cos, rotary_sin, alibi_slopes, seqlen_new, opts, rotary_interleaved,
                                  num_splits))


@kvcache_attention.register_fake
def _kvcache_attention_fake(q, k_cache, v_cache, cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
                            rotary_cos, rotary_sin, alibi_slopes, seqlen_new, softmax_scale, window_left,
                            window_right, softcap, rotary_interleaved, num_splits):
    return _decode_outputs_like(q)


@torch.library.custom_op("flashattn::attention_combine", mutates_args=(), device_types="cpu")
def attention_combine(out_partial: torch.Tensor, lse_partial: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """out_partial (S, B, Sq, H, D), lse_partial (S, B, H, Sq) -> out (B, Sq, H, D), lse (B, H, Sq)."""
    if backend_for_cpu_tensors() == "triton":
        return _triton_combine(out_partial, lse_partial)
    return cpu_decode.combine(out_partial, lse_partial)


@attention_combine.register_kernel("cuda")
def _attention_combine_cuda(out_partial, lse_partial):
    if backend_override() == "torch":
        return cpu_decode.combine(out_partial, lse_partial)
    return _triton_combine(out_partial, lse_partial)


@attention_combine.register_fake
def _attention_combine_fake(out_partial, lse_partial):
    _, batch, seqlen, nheads, _ = out_partial.shape
    return out_partial.new_empty(out_partial.shape[1:]), lse_partial.new_empty((batch, nheads, seqlen))


@torch.library.custom_op("flashattn::attention_combine_backward", mutates_args=(), device_types="cpu")
def attention_combine_backward(
    dout: torch.Tensor, dlse: torch.Tensor, out_partial: torch.Tensor, lse_partial: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(d out_partial, d lse_partial) of :func:`attention_combine`."""
    if backend_for_cpu_tensors() == "triton":
        return _triton_combine_backward(dout, dlse, out_partial, lse_partial)
    return cpu_decode.combine_backward(dout, dlse, out_partial, lse_partial)


@attention_combine_backward.register_kernel("cuda")
def _attention_combine_backward_cuda(dout, dlse, out_partial, lse_partial):
    if backend_override() == "torch":
        return cpu_decode.combine_backward(dout, dlse, out_partial, lse_partial)
    return _triton_combine_backward(dout, dlse, out_partial, lse_partial)


@attention_combine_backward.register_fake
def _attention_combine_backward_fake(dout, dlse, out_partial, lse_partial):
    return (torch.empty_like(out_partial, memory_format=torch.contiguous_format),
            torch.empty_like(lse_partial, memory_format=torch.contiguous_format))
