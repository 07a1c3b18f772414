"""Hopper forward in Gluon: warp-specialized, FlashAttention-3's structure.

One program computes 128 query rows of one (sequence, head) (192 with ``NUM_CONSUMERS`` = 3), in partitions:

- two (or three) consumer warpgroups, 64 rows each. A warpgroup's wgmma keeps its accumulator in that warpgroup's
  registers, so each consumer issues its own products: S = Q K^T from shared memory, O += P V with P from
  registers. Block j's Q K^T runs while block j-1's P V is in flight, and block j's softmax runs while
  that P V finishes (FA3's intra-warpgroup overlap);
- a loader warp: the tile's Q, then K and V through TMA into a ring of ``NUM_STAGES`` shared-memory
  stages. A stage's K is released as soon as every consumer's Q K^T has read it, its V once their P V
  have: the overlapped loop holds block j's K and block j-1's V at once, so a ring that freed K and V
  together would hold two stages and leave a 2-stage ring nothing to prefetch into.

A program computes one tile, or (persistent grid) several: the loader then fetches the next tile's Q into a free Q
buffer (``Q_BUFFERS``; with one, once every consumer has released it: after its last Q K^T of the tile before, or
after its store where O is staged in Q, ``STORE_THROUGH_Q``), and its K and V as stages free up, while the consumers
still work on the tile before. The loader picks each tile and hands its number to the consumers (``_publish_tile``):
with ``DYNAMIC_TILES`` (every persistent grid) the next one not yet taken, from a counter in global memory, so that
a program that drew short tiles takes more of them (FA3's dynamic persistent scheduler; p, p + grid, ... left the
busiest SM 30% above the average at causal 1k, and was 0-3.5% behind the counter on non-causal calls too:
docs/perf-notes.md).

Triton's own warp specialization (``tl.range(..., warp_specialize=True)``) does not split our loop this way
(docs/perf-notes.md); Gluon states the partitions, barriers and waits explicitly.

A dense call reads Q, K and V through 3-D descriptors over (batch, seqlen, heads * head_dim), whose boxes read
zeros past a sequence's end (``copy_rows``). A packed call's descriptors span (tokens, heads * head_dim), so a tile
may run into a neighbouring sequence's rows: query rows outside the sequence are never stored, scores of keys past
it are masked, and the loader zeroes the values past it (``load_key_block_within``), whose NaN or inf would
otherwise reach P V as 0 x NaN.
Limits, checked by the launcher: head dims 64, 128 and 256 with no padding; causal or no mask; no dropout,
softcap, ALiBi or SDPA mask; 16-bit inputs.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

LOG2E = gl.constexpr(1.4426950408889634)
ROWS_PER_WARPGROUP = gl.constexpr(64)  # wgmma's M per warpgroup


@gluon.constexpr_function
def counts_sequences(block_shape):
    """Whether a descriptor of this box reads a dense tensor as (batch, seqlen, columns): a (1, rows, columns) box
    (``launch.common.sequence_descriptor``), not a (rows, columns) one over the tokens."""
    return len(block_shape) == 3


@gluon.constexpr_function
def tile_layout_of(layout):
    """The (rows, columns) shared layout of a descriptor's tiles: a sequence descriptor's (1, rows, columns) box
    lands in a 2-D tile of the same swizzle, which wgmma reads."""
    if layout.rank == 2:
        return layout
    return gl.NVMMASharedLayout(layout.swizzle_byte_width, layout.element_bitwidth, 2, layout.transposed,
                                layout.fp4_padded)


@gluon.jit
def copy_rows(desc, sequence, start, row, column, barrier, dst):
    """A TMA copy of a sequence's rows [row, row + dst's rows) at ``column`` into the 2-D tile ``dst``, counted on
    ``barrier``: from a sequence descriptor at (``sequence``, ``row``), rows outside the sequence reading zeros;
    from a token descriptor at token ``start + row``, rows outside the sequence reading its neighbours' tokens."""
    if counts_sequences(desc.block_type.shape):
        tma.async_copy_global_to_shared(desc, [sequence, row, column], barrier,
                                        dst.reshape([1, dst.shape[0], dst.shape[1]]))
    else:
        tma.async_copy_global_to_shared(desc, [start + row, column], barrier, dst)


@gluon.constexpr_function
def wgmma_layout(columns):
    """A consumer warpgroup's wgmma result in registers: ROWS_PER_WARPGROUP rows x ``columns`` (scores, or an
    accumulator). Shared by the Hopper forward, dQ and dK/dV kernels."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, columns, 16])


@gluon.constexpr_function
def register_operand_layout(columns):
    """A tile in registers as the A operand of a wgmma into a ``columns``-wide accumulator (P, dS, P^T, dS^T)."""
    return gl.DotOperandLayout(operand_index=0, parent=wgmma_layout(columns), k_width=2)


@gluon.constexpr_function
def _store_layout(head_dim, wide):
    """How a consumer's 64 x head_dim result is laid out for its store. Wide: 8 consecutive elements a thread, so
    each store writes 16 bytes and a warp's stores cover whole rows; the conversion from the wgmma layout goes through
    shared memory. Otherwise the wgmma result's own layout: 2 elements a thread, 4-byte stores, a warp writing
    16-byte pieces of 8 rows (docs/perf-notes.md)."""
    if wide:
        return gl.BlockedLayout([1, 8], [32 // (head_dim // 8), head_dim // 8], [4, 1], [1, 0])
    return wgmma_layout(head_dim)


@gluon.jit
def rows_in_sequence(rows, seqlen):
    """Which of a tile's rows (numbered within the sequence) lie in it: a causal call's short tile starts before row 0,
    and a tile may run past the end; those rows belong to a neighbouring sequence, which its own tiles write."""
    return (rows >= 0) & (rows < seqlen)


@gluon.jit
def store_rows(Ptr, tile, row_start, first_row, column, stride_m, seqlen, HEAD_DIM: gl.constexpr,
               WIDE: gl.constexpr):
    """A consumer's 64 x HEAD_DIM result (float32, the wgmma layout) rounded to Ptr's type and stored at token rows
    row_start + first_row + i, from ``column`` on; its rows outside the sequence are not stored. The forward's O and
    the dQ kernel's dQ."""
    layout: gl.constexpr = _store_layout(HEAD_DIM, WIDE)
    values = gl.convert_layout(tile.to(Ptr.dtype.element_ty), layout)
    rows = first_row + gl.arange(0, ROWS_PER_WARPGROUP, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, layout))
    offsets = (row_start + rows).to(gl.int64)[:, None] * stride_m + column + cols[None, :]
    gl.store(Ptr + offsets, values, mask=rows_in_sequence(rows, seqlen)[:, None])


@gluon.jit
def store_rows_through(Ptr, tile, buffer, row_start, first_row, column, stride_m, seqlen, HEAD_DIM: gl.constexpr):
    """``store_rows``' 16-byte stores, the layout converted through ``buffer`` (a 64 x HEAD_DIM tile of Ptr's type
    that the caller owns: the forward consumer's own Q tile once its last Q K^T has completed) rather than through
    scratch shared memory beside the kernel's own. The buffer is free again when this returns (its reads fenced
    against a later TMA copy into it)."""
    buffer.store(tile.to(Ptr.dtype.element_ty))
    gl.thread_barrier()  # every warp's rows are in shared memory before any warp reads another's
    layout: gl.constexpr = _store_layout(HEAD_DIM, True)
    values = buffer.load(layout)
    rows = first_row + gl.arange(0, ROWS_PER_WARPGROUP, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, layout))
    offsets = (row_start + rows).to(gl.int64)[:, None] * stride_m + column + cols[None, :]
    gl.store(Ptr + offsets, values, mask=rows_in_sequence(rows, seqlen)[:, None])
    fence_async_shared()
    gl.thread_barrier()  # every warp has read its rows before the caller hands the buffer back


@gluon.jit
def to_16_bits(x, dtype: gl.constexpr):
    """Float32 ``x`` rounded to ``dtype`` (bfloat16 or float16), two elements an instruction (a thread's consecutive
    elements: two columns of one row in a wgmma result, one register of the A operand). Gluon's own conversion
    rounds one element at a time and leaves the pairing to ptxas, which in some partitions of one kernel paired them
    with their halves swapped and swapped them back: 32 PRMT a key block in two of the three hdim-64 forward
    consumers' loops (443 instructions against 413; docs/perf-notes.md). The backward kernels keep
    Gluon's conversion: there the pairs are not always a register of the operand (the key-slice dK/dV, whose P^T
    and dS^T come from S^T, gained 32 PRMT with this one) and the dQ's loops came out no shorter."""
    if dtype == gl.bfloat16:
        return gl.inline_asm_elementwise("cvt.rn.bf16x2.f32 $0, $2, $1;", "=r,r,r", [x], dtype=gl.bfloat16,
                                         is_pure=True, pack=2)
    else:
        return gl.inline_asm_elementwise("cvt.rn.f16x2.f32 $0, $2, $1;", "=r,r,r", [x], dtype=gl.float16,
                                         is_pure=True, pack=2)


@gluon.jit
def section_tile(tile_id, tiles_per_pair, pairs, pairs_per_section):
    """(pair, tile of the pair) of ``tile_id`` when the tiles run in sections of ``pairs_per_section`` pairs, the
    pair fastest inside a section, so that a section's tiles of rank 0 come first (the last section may be short)."""
    section_tiles = pairs_per_section * tiles_per_pair
    first_pair = tile_id // section_tiles * pairs_per_section
    section_pairs = gl.minimum(pairs_per_section, pairs - first_pair)
    in_section = tile_id - first_pair * tiles_per_pair
    return first_pair + in_section % section_pairs, in_section // section_pairs


@gluon.jit
def _tile_plan(tile_id, row_tiles, batch_heads, heads_per_section, nheads, group_size, CuSeqlensQ, CuSeqlensK,
               seqlen_q, seqlen_k, stride_lb, stride_lh, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
               IS_VARLEN: gl.constexpr, NUM_CONSUMERS: gl.constexpr):
    """Where tile ``tile_id`` reads and writes (its sequence, head, the sequence's first rows in the tokens and
    its lengths), and its key blocks: every partition derives the same plan.

    The (sequence, head) pairs are cut into sections of ``heads_per_section``, whose K and V fit in L2
    together (the launcher sizes them). Tiles run section by section, so the programs in flight read the K and
    V of a few heads, each from HBM about once; with the heads as the fastest index over the whole launch, the
    programs in flight would stream every head's K and V at once, more than L2 holds. Inside a section, tiles
    are numbered row tile major, so that causal calls run their longest rows first (no tail wave of
    full-length tiles).

    Causal tiles are counted back from the sequence's end (rounded up to a consumer's 64 rows), so the tile that
    a length not divisible by the tile's rows leaves short is the first one, which sees the fewest keys; counted
    from row 0 it would be the last one, which sees them all (4k rows in 192-row tiles: 5.7% of the consumers'
    block products went to rows past the end). ``tile_row`` may then be negative: rows before 0 are not stored.
    The rounding keeps every consumer's rows on a 64-row boundary, as counting from row 0 does: counted from the
    end itself, a length that is not a multiple of 64 would give half the consumers two masked (diagonal) blocks of
    128 keys instead of one (docs/perf-notes.md)."""
    tile_rows = NUM_CONSUMERS * ROWS_PER_WARPGROUP
    batch_head, row_tile = section_tile(tile_id, row_tiles, batch_heads, heads_per_section)
    batch = batch_head // nheads
    head = batch_head % nheads
    if IS_VARLEN:
        # clamped into the packed tokens (seqlen_q, seqlen_k: the totals), as ``common.sequence_bounds`` does
        q_start = gl.minimum(gl.maximum(gl.load(CuSeqlensQ + batch), 0), seqlen_q)
        k_start = gl.minimum(gl.maximum(gl.load(CuSeqlensK + batch), 0), seqlen_k)
        seqlen_q = gl.minimum(gl.maximum(gl.load(CuSeqlensQ + batch + 1), q_start), seqlen_q) - q_start
        seqlen_k = gl.minimum(gl.maximum(gl.load(CuSeqlensK + batch + 1), k_start), seqlen_k) - k_start
        lse_row = head.to(gl.int64) * stride_lh + q_start
    else:
        q_start = batch * seqlen_q
        k_start = batch * seqlen_k
        lse_row = batch.to(gl.int64) * stride_lb + head.to(gl.int64) * stride_lh
    tile_row = row_tile * tile_rows
    key_end = seqlen_k
    full_end = seqlen_k
    if CAUSAL:
        # row tile 0 ends at the last row: the longest rows
        tile_row = gl.cdiv(seqlen_q, ROWS_PER_WARPGROUP) * ROWS_PER_WARPGROUP - (row_tile + 1) * tile_rows
        # bottom-right aligned: query i sees keys up to i + seqlen_k - seqlen_q
        key_end = gl.minimum(seqlen_k, tile_row + tile_rows + seqlen_k - seqlen_q)
        full_end = gl.minimum(seqlen_k, tile_row + 1 + seqlen_k - seqlen_q)
    # a tile with no row in its sequence (varlen: a shorter sequence) computes nothing (the forward's loader skips it)
    has_rows = (tile_row < seqlen_q) & (tile_row + tile_rows > 0)
    n_blocks = gl.where(has_rows, gl.cdiv(gl.maximum(key_end, 0), BLOCK_N), 0)
    n_full = gl.minimum(gl.maximum(full_end, 0) // BLOCK_N, n_blocks)
    return batch, head, head // group_size, q_start, k_start, seqlen_q, seqlen_k, lse_row, tile_row, n_full, n_blocks


@gluon.jit
def tile_has_rows(tile_row, seqlen_q, NUM_CONSUMERS: gl.constexpr, IS_VARLEN: gl.constexpr):
    """Whether a tile holds a row of its sequence. Only packed calls have tiles without (a grid sized by the longest
    sequence leaves the shorter ones' last row tiles empty: 44% of the tiles at the bench's 512-token mean); the
    loader skips them, so that they cost no Q copy, hand-off or epilogue."""
    if IS_VARLEN:
        tile_rows = NUM_CONSUMERS * ROWS_PER_WARPGROUP
        return (tile_row < seqlen_q) & (tile_row + tile_rows > 0)
    else:
        return True


@gluon.jit
def _consumer_key_blocks(first_row, seqlen_q, seqlen_k, n_full, n_blocks, BLOCK_N: gl.constexpr,
                         CAUSAL: gl.constexpr):
    """The key blocks one consumer's 64 rows (from ``first_row``) see whole and at all, within the tile's
    (``_tile_plan``: ``n_full`` seen whole by the tile's first row, ``n_blocks`` by its last). With a causal mask
    a later consumer sees more blocks whole, and an earlier one may see none of the tile's last blocks: with three
    consumers (192 rows) and 128-key blocks, about 3% of a 4k causal call's block products, and as many more go
    from masked to unmasked. A consumer whose rows all lie outside the sequence (the short tile's, before row 0
    when causal, past the end otherwise) sees no block."""
    own_full = n_full
    own_blocks = n_blocks
    if (first_row >= seqlen_q) | (first_row + ROWS_PER_WARPGROUP <= 0):
        own_full = 0
        own_blocks = 0
    elif CAUSAL:
        full_end = gl.minimum(seqlen_k, first_row + 1 + seqlen_k - seqlen_q)
        own_full = gl.maximum(gl.minimum(gl.maximum(full_end, 0) // BLOCK_N, n_blocks), n_full)
        key_end = gl.minimum(seqlen_k, first_row + ROWS_PER_WARPGROUP + seqlen_k - seqlen_q)
        own_blocks = gl.maximum(gl.minimum(gl.cdiv(gl.maximum(key_end, 0), BLOCK_N), n_blocks), own_full)
    return own_full, own_blocks


@gluon.jit
def _next_tile(tile_id, TileCounter, DYNAMIC_TILES: gl.constexpr):
    """The tile the loader takes after ``tile_id``: the next untaken one (``TileCounter`` counts the tiles taken
    beyond each program's first, which is its program id), or ``tile_id`` + grid. Past the last tile: no more."""
    if DYNAMIC_TILES:
        return gl.num_programs(0) + gl.atomic_add(TileCounter, 1, sem="relaxed")
    else:
        return tile_id + gl.num_programs(0)


@gluon.jit
def _publish_tile(tile_slot, tile_id):
    """The loader's hand-off of its next tile (a number past the last: no more) to the consumers. The store
    precedes the loader's arrival on ``q_ready``, which releases it to every consumer that waits on that phase."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    tile_slot.store(gl.full([1], tile_id, gl.int32, layout))


@gluon.jit
def read_tile(tile_slot):
    """The tile number ``_publish_tile`` left, read by a consumer after its wait on ``q_ready``."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    return gl.max(tile_slot.load(layout), axis=0)


@gluon.jit
def _load_partition(q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_ready, q_free, k_ready, v_ready, k_free,
                    v_free, landed, tile_slot, TileCounter, CuSeqlensQ, CuSeqlensK, seqlen_q, seqlen_k, nheads,
                    group_size, row_tiles, batch_heads, heads_per_section, total_tiles, HEAD_DIM: gl.constexpr,
                    BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr, CAUSAL: gl.constexpr, IS_VARLEN: gl.constexpr,
                    NUM_CONSUMERS: gl.constexpr, DYNAMIC_TILES: gl.constexpr, Q_BUFFERS: gl.constexpr):
    ring = 0  # key blocks loaded so far: the ring's position
    rounds = 0  # tiles handed to the consumers so far
    partial_blocks = 0  # blocks that ran past their sequence: the phase of ``landed``
    tile_id = gl.program_id(0)
    while tile_id < total_tiles:
        # taken now, read after this tile's loads are issued: the counter's round trip hides behind them
        next_tile = _next_tile(tile_id, TileCounter, DYNAMIC_TILES)
        batch, head, head_k, q_start, k_start, tile_seqlen_q, tile_seqlen_k, _, tile_row, _, n_blocks = _tile_plan(
            tile_id, row_tiles, batch_heads, heads_per_section, nheads, group_size, CuSeqlensQ, CuSeqlensK, seqlen_q,
            seqlen_k, 0, 0, BLOCK_N, CAUSAL, IS_VARLEN, NUM_CONSUMERS)
        if tile_has_rows(tile_row, tile_seqlen_q, NUM_CONSUMERS, IS_VARLEN):
            # a fresh barrier passes a wait on the phase before its first: the first tiles do not wait
            slot = rounds % Q_BUFFERS
            mbarrier.wait(q_free.index(slot), ((rounds // Q_BUFFERS) & 1) ^ 1)
            _publish_tile(tile_slot.index(slot), tile_id)
            mbarrier.expect(q_ready.index(slot), NUM_CONSUMERS * q_desc.block_type.nbytes)
            for c in gl.static_range(NUM_CONSUMERS):
                copy_rows(q_desc, batch, q_start, tile_row + c * ROWS_PER_WARPGROUP, head * HEAD_DIM,
                          q_ready.index(slot), q_smem.index(slot * NUM_CONSUMERS + c))
            # blocks inside the sequence, then at most one that runs past its last key: a token descriptor's needs
            # its rows past the sequence zeroed, a sequence descriptor's reads zeros there
            bounded: gl.constexpr = counts_sequences(k_desc.block_type.shape)
            n_inside = n_blocks if bounded else gl.minimum(n_blocks, tile_seqlen_k // BLOCK_N)
            for j in range(n_inside):
                load_key_block(k_desc, v_desc, k_bufs, v_bufs, k_ready, v_ready, k_free, v_free, ring + j, batch,
                               k_start, j * BLOCK_N, head_k * HEAD_DIM, NUM_STAGES)
            if not bounded and n_blocks > n_inside:
                load_key_block_within(k_desc, v_desc, k_bufs, v_bufs, k_ready, v_ready, k_free, v_free,
                                      ring + n_inside, k_start + n_inside * BLOCK_N, head_k * HEAD_DIM,
                                      tile_seqlen_k - n_inside * BLOCK_N, landed, partial_blocks & 1,
                                      NUM_STAGES, False)
                partial_blocks += 1
            ring += n_blocks
            rounds += 1
        tile_id = next_tile
    # no tile left: the consumers read a number past the last one and stop
    slot = rounds % Q_BUFFERS
    mbarrier.wait(q_free.index(slot), ((rounds // Q_BUFFERS) & 1) ^ 1)
    _publish_tile(tile_slot.index(slot), tile_id)
    mbarrier.arrive(q_ready.index(slot), count=1)


@gluon.jit
def q_ring(q_desc, HEAD_DIM: gl.constexpr, Q_BUFFERS: gl.constexpr, CONSUMERS: gl.constexpr):
    """The forwards' Q buffers (each consumer's 64 rows, ``Q_BUFFERS`` tiles), their ready and free barriers (every
    consumer releases Q) and the slots through which the loader hands each buffer's tile number to the consumers."""
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [Q_BUFFERS * CONSUMERS, ROWS_PER_WARPGROUP, HEAD_DIM],
                                       tile_layout_of(q_desc.layout))
    q_ready = gl.allocate_shared_memory(gl.int64, [Q_BUFFERS, 1], mbarrier.MBarrierLayout())
    q_free = gl.allocate_shared_memory(gl.int64, [Q_BUFFERS, 1], mbarrier.MBarrierLayout())
    tile_slot = gl.allocate_shared_memory(gl.int32, [Q_BUFFERS, 1], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    for i in gl.static_range(Q_BUFFERS):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(q_free.index(i), count=CONSUMERS)
    return q_smem, q_ready, q_free, tile_slot


@gluon.jit
def key_ring(k_desc, v_desc, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
             CONSUMERS: gl.constexpr):
    """The ring of K and V stages and their barriers, the forward's and the dQ kernel's: a stage's K and V each land
    behind a ready barrier (the loader's expect) and are refilled once every consumer has arrived on its free one.
    A V stage takes v_desc's tile: (BLOCK_N, HEAD_DIM), or the FP8 forward's V^T tile (HEAD_DIM, BLOCK_N)."""
    k_bufs = gl.allocate_shared_memory(k_desc.dtype, [NUM_STAGES, BLOCK_N, HEAD_DIM], tile_layout_of(k_desc.layout))
    v_bufs = gl.allocate_shared_memory(v_desc.dtype, [NUM_STAGES, v_desc.block_type.shape[-2],
                                                      v_desc.block_type.shape[-1]], tile_layout_of(v_desc.layout))
    k_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    k_free = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_free = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_free.index(i), count=CONSUMERS)
        mbarrier.init(v_free.index(i), count=CONSUMERS)
    return k_bufs, v_bufs, k_ready, v_ready, k_free, v_free


@gluon.jit
def zeroing_barrier(k_desc):
    """The loader's own barrier behind the blocks it zeroes past a sequence's end (``load_key_block_within``),
    initialized only where the loader uses it: with token descriptors. A sequence descriptor's build never touches
    it, so the compiler gives its memory to other shared memory (the epilogue's staging of O), and an initialized
    barrier's memory must not be read or written as data (PTX: ``mbarrier.inval`` first): there, 8 bytes of the
    staged O read back as the barrier's state on grids of one program a tile (docs/perf-notes.md)."""
    landed = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    if not counts_sequences(k_desc.block_type.shape):
        mbarrier.init(landed, count=1)
    return landed


@gluon.jit
def load_key_block(k_desc, v_desc, k_bufs, v_bufs, k_ready, v_ready, k_free, v_free, position, sequence, start, row,
                   column, NUM_STAGES: gl.constexpr):
    """A sequence's K and V rows [row, row + block) at ``column`` (``copy_rows``) into the ring's stage of key block
    ``position`` (the blocks loaded so far), each once the consumers have released that stage's last K or V. The
    forward's and the dQ kernel's loaders."""
    stage = position % NUM_STAGES
    phase = (position // NUM_STAGES) & 1
    # a fresh barrier passes a wait on the phase before its first: the first round does not wait
    mbarrier.wait(k_free.index(stage), phase ^ 1)
    mbarrier.expect(k_ready.index(stage), k_desc.block_type.nbytes)
    copy_rows(k_desc, sequence, start, row, column, k_ready.index(stage), k_bufs.index(stage))
    mbarrier.wait(v_free.index(stage), phase ^ 1)
    mbarrier.expect(v_ready.index(stage), v_desc.block_type.nbytes)
    copy_rows(v_desc, sequence, start, row, column, v_ready.index(stage), v_bufs.index(stage))


@gluon.jit
def load_key_block_within(k_desc, v_desc, k_bufs, v_bufs, k_ready, v_ready, k_free, v_free, position, row, column,
                          keys, landed, landed_phase, NUM_STAGES: gl.constexpr, ZERO_KEYS: gl.constexpr):
    """``load_key_block`` through token descriptors for a block of which only the first ``keys`` rows belong to the
    sequence: the rest of the TMA box holds the next sequence's rows, whose NaN or inf would reach a product as
    0 x NaN however the scores are masked: P V in the forward (V), dS K and dO V^T in the dQ kernel (K too:
    ``ZERO_KEYS``). Those tiles land behind the loader's own barrier ``landed`` (``landed_phase``: its uses so far,
    mod 2); the loader zeroes their rows past ``keys`` and then releases them to the consumers through their ready
    barriers. Its wait costs the loader one copy's latency, once a sequence's last block."""
    stage = position % NUM_STAGES
    phase = (position // NUM_STAGES) & 1
    mbarrier.wait(k_free.index(stage), phase ^ 1)
    if ZERO_KEYS:
        mbarrier.wait(v_free.index(stage), phase ^ 1)
        mbarrier.expect(landed, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [row, column], landed, k_bufs.index(stage))
    else:
        mbarrier.expect(k_ready.index(stage), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [row, column], k_ready.index(stage), k_bufs.index(stage))
        mbarrier.wait(v_free.index(stage), phase ^ 1)
        mbarrier.expect(landed, v_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(v_desc, [row, column], landed, v_bufs.index(stage))
    mbarrier.wait(landed, landed_phase)
    if ZERO_KEYS:
        zero_rows_from(k_bufs.index(stage), keys, 64)
    zero_rows_from(v_bufs.index(stage), keys, 64)
    fence_async_shared()  # the stores, made through the generic proxy, before wgmma reads them
    gl.thread_barrier()  # every lane's stores before the arrivals (issued by the partition's first thread)
    if ZERO_KEYS:
        mbarrier.arrive(k_ready.index(stage), count=1)
    mbarrier.arrive(v_ready.index(stage), count=1)


@gluon.jit
def zero_rows_from(tile, first, CHUNK_COLUMNS: gl.constexpr):
    """Rows [first, rows) of a (rows, columns) shared-memory tile set to zero by one warp, 8 rows by at most
    ``CHUNK_COLUMNS`` columns at a time (what the loader's registers hold). Chunks wholly past ``first`` are stored
    zeros, with no load to wait for; the one that ``first`` cuts keeps its rows before it; those wholly before are left
    alone."""
    ROWS: gl.constexpr = tile.shape[0]
    COLUMNS: gl.constexpr = tile.shape[1]
    CHUNK: gl.constexpr = CHUNK_COLUMNS if COLUMNS > CHUNK_COLUMNS else COLUMNS
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [1, 1], [1, 0])
    zeros = gl.zeros([8, CHUNK], tile.dtype, layout)
    for r in gl.static_range(0, ROWS, 8):
        if r >= first:
            for c in gl.static_range(0, COLUMNS, CHUNK):
                tile.slice(r, 8, dim=0).slice(c, CHUNK, dim=1).store(zeros)
        elif r + 8 > first:
            past = (r + gl.arange(0, 8, gl.SliceLayout(1, layout)) >= first)[:, None]
            for c in gl.static_range(0, COLUMNS, CHUNK):
                chunk = tile.slice(r, 8, dim=0).slice(c, CHUNK, dim=1)
                chunk.store(gl.where(past, zeros, chunk.load(layout)))


@gluon.jit
def _softmax_step(s, m_i, l_i, j, rows, seqlen_q, seqlen_k, qk_scale_log2, BLOCK_N: gl.constexpr,
                  CAUSAL: gl.constexpr, MASKED: gl.constexpr, s_layout: gl.constexpr, THRESHOLD: gl.constexpr):
    """Online softmax of one score block in base 2: (the max used, new sums (``scaled_row_sums``), P, the old
    accumulator's factor, whether the accumulator needs it: ``lazy_max``)."""
    if MASKED:
        s = masked_scores(s, j, rows, seqlen_q, seqlen_k, BLOCK_N, CAUSAL, s_layout)
    m_new, rescale = lazy_max(m_i, row_max(s) * qk_scale_log2, THRESHOLD)
    m_use = subtracted_max(m_new, MASKED)
    p = gl.exp2(s * qk_scale_log2 - m_use[:, None])
    alpha = gl.exp2(m_i - m_use)
    return m_new, scaled_row_sums(l_i, alpha, p), p, alpha, rescale


@gluon.jit
def row_max(s):
    """The row maxima of a wgmma-layout tile, in four chains a row (FlashAttention-4's ``fmax_reduce`` on sm90). A
    thread holds two columns of each of its rows in every 8, so four in every 16: grouped as (rows, cols / 16, 16),
    the first reduction runs across the groups, one chain for each of those four columns, where ``gl.max(s, axis=1)``
    folds a row's values one after another, each maximum waiting for the last. The second reduces the 16 across the
    thread and its quad as before; the layouts agree, so the reshape and the conversion move nothing."""
    grouped = gl.reshape(s, [s.shape[0], s.shape[1] // 16, 16])
    return gl.convert_layout(gl.max(gl.max(grouped, axis=1), axis=1), gl.SliceLayout(1, s.type.layout))


@gluon.jit
def row_sum(p):
    """The row sums of a wgmma-layout tile, in four chains a row (``row_max``)."""
    grouped = gl.reshape(p, [p.shape[0], p.shape[1] // 16, 16])
    return gl.convert_layout(gl.sum(gl.sum(grouped, axis=1), axis=1), gl.SliceLayout(1, p.type.layout))


@gluon.jit
def row_partial_sums(p):
    """Each thread's part of its rows' sums in a wgmma-layout tile, (rows, 4): a row's columns lie on the four threads
    of a quad, and this sums only the thread's own (in four chains, as ``row_max``), not across the quad. Grouped as
    (rows, cols / 16, 2, 4, 2): a column is 16 g + 8 h + 2 t + e, t the thread in the quad."""
    grouped = gl.reshape(p, [p.shape[0], p.shape[1] // 16, 2, 4, 2])
    return gl.sum(gl.sum(gl.sum(grouped, axis=1), axis=3), axis=1)


@gluon.constexpr_function
def partial_row_sums(head_dim):
    """Whether the online softmax carries each thread's part of its row sums (``row_partial_sums``) and adds the
    quad's parts once, in the epilogue (FlashAttention-3's and -4's way): two shuffles and two adds a row and block
    fewer, 8 of a block's 412-467 loop instructions. Taken at head dims 64 and 128 (H200: +0.1-1.8%); at 256 the
    non-causal 16k loop ran 3% slower with it (docs/perf-notes.md)."""
    return head_dim <= 128


@gluon.constexpr_function
def _is_partial(shape):
    """Whether row sums of this shape are thread parts ((rows, 4): ``zero_row_sums``), not a row vector."""
    return len(shape) == 2


@gluon.jit
def zero_row_sums(ROWS: gl.constexpr, COLUMNS: gl.constexpr, layout: gl.constexpr, PARTIAL: gl.constexpr):
    """The row sums before a run's first block of a ``layout`` tile ``COLUMNS`` wide: (ROWS, 4) thread parts with
    PARTIAL (``partial_row_sums``), else a row vector."""
    if PARTIAL:
        return row_partial_sums(gl.zeros([ROWS, COLUMNS], gl.float32, layout))
    else:
        return gl.zeros([ROWS], gl.float32, gl.SliceLayout(1, layout))


@gluon.jit
def scaled_row_sums(l_i, alpha, p):
    """The online softmax's row sums (whole, or thread parts: ``zero_row_sums``) times ``alpha`` a row, plus P's. A
    whole and a half-width block's layouts place the same values alike, so the conversions move nothing."""
    if _is_partial(l_i.shape):
        partial = row_partial_sums(p)
        layout: gl.constexpr = partial.type.layout
        return gl.convert_layout(l_i, layout) * gl.convert_layout(alpha, gl.SliceLayout(1, layout))[:, None] + partial
    else:
        return gl.convert_layout(l_i, gl.SliceLayout(1, p.type.layout)) * alpha + row_sum(p)


@gluon.jit
def row_sums(l_i, layout: gl.constexpr):
    """The whole row sums (``zero_row_sums``' form), as a row vector of the ``layout`` tile."""
    if _is_partial(l_i.shape):
        return gl.convert_layout(gl.sum(l_i, axis=1), gl.SliceLayout(1, layout))
    else:
        return gl.convert_layout(l_i, gl.SliceLayout(1, layout))


@gluon.jit
def masked_scores(s, j, rows, seqlen_q, seqlen_k, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
                  s_layout: gl.constexpr, COLUMN_BOUND: gl.constexpr = True):
    """Key block ``j``'s scores (``s_layout``) with -inf where a row may not see the key (``visible_keys``)."""
    visible = visible_keys(j, rows, seqlen_q, seqlen_k, BLOCK_N, CAUSAL, s_layout, COLUMN_BOUND)
    return gl.where(visible, s, float("-inf"))


@gluon.jit
def visible_keys(j, rows, seqlen_q, seqlen_k, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, s_layout: gl.constexpr,
                 COLUMN_BOUND: gl.constexpr = True):
    """Whether each of ``rows`` (a query a row of a ``s_layout`` tile) sees each key of block ``j``: not past
    seqlen_k, and with CAUSAL not past the diagonal, both bounds folded into one last visible column a row
    (``columns_at_most``). Without CAUSAL, COLUMN_BOUND False keeps the plain comparison of each key with seqlen_k:
    an add more a column, but no bound held across a persistent program's tiles, which pushed the FP8 kernel's
    three 160-register consumers (hdim 64) into spills."""
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    if CAUSAL or COLUMN_BOUND:
        last = seqlen_k - 1 - j * BLOCK_N
        if CAUSAL:
            # bottom-right aligned: query i sees keys up to i + seqlen_k - seqlen_q
            last = gl.minimum(rows + (seqlen_k - seqlen_q - j * BLOCK_N), last)
        else:
            # (rows only give the count: a half-width block's caller passes the whole block's)
            last = gl.full(rows.shape, 0, gl.int32, gl.SliceLayout(1, s_layout)) + last
        visible = columns_at_most(cols, last)
    else:
        visible = (j * BLOCK_N + cols < seqlen_k)[None, :]
    return visible


@gluon.jit
def columns_at_most(cols, last):
    """``cols[None, :] <= last[:, None]`` for a wgmma-layout tile's column indices ``cols`` (from 0) and a bound a
    row, at one comparison against an immediate a score. A thread holds the columns 8i + 2 (lane % 4) + {0, 1}: with
    the lane's part (``cols & 6``) moved to the bound's side, which it changes once a row, every column's side is a
    constant of the compiled code. (Tested as written, each score took an add as well; two bounds tested apart,
    two comparisons and two selects.)"""
    lane = cols & 6
    return (cols - lane)[None, :] <= (last[:, None] - lane[None, :])


@gluon.jit
def columns_within(cols, first, last, BOUNDED_BELOW: gl.constexpr, ROW_LAST: gl.constexpr):
    """``first[:, None] <= cols[None, :] <= last`` for ``columns_at_most``'s column indices, one comparison a bound
    and score: ``last`` one a row (ROW_LAST) or one for all, ``first`` one a row (none without BOUNDED_BELOW)."""
    lane = cols & 6
    if ROW_LAST:
        seen = columns_at_most(cols, last)
    else:
        seen = ((cols - lane) <= (last - lane))[None, :]
    if BOUNDED_BELOW:
        seen = seen & ~columns_at_most(cols, first - 1)
    return seen


@gluon.jit
def subtracted_max(m_new, MASKED: gl.constexpr):
    """The row max that P's exponent subtracts: with MASKED a row that has seen no key keeps max -inf and subtracts
    0 instead, so that exp2 gives 0, not NaN."""
    if MASKED:
        m_new = gl.where(m_new == float("-inf"), 0.0, m_new)
    return m_new


@gluon.jit
def lazy_max(m_i, block_max, THRESHOLD: gl.constexpr):
    """(The max a block's P takes, whether the accumulator is rescaled to it.) THRESHOLD None: the running max. Else
    FlashAttention-4's lazy rescale: a warpgroup's maxes move only when one of its 64 rows' would grow by more than
    THRESHOLD (log2 units); otherwise P = exp2(s - stale max) < 2^THRESHOLD and the accumulator's factor is 1, so its
    multiply (64-128 FMUL a thread) is skipped, on a branch uniform over the warpgroup. The lse takes the max used."""
    m_new = gl.maximum(m_i, block_max)
    if THRESHOLD is None:
        return m_new, True
    else:
        # -inf grows past any threshold to a finite max; a row still without keys (-inf to -inf) does not. Each warp's
        # 16 rows are reduced by shuffles, the four warps' results through shared memory (a store, barrier and load)
        grown = gl.max(gl.reshape((m_new > m_i + THRESHOLD).to(gl.int32), [4, ROWS_PER_WARPGROUP // 4]), axis=1)
        rescale = gl.max(gl.convert_layout(grown, gl.BlockedLayout([4], [32], [4], [0])), axis=0) > 0
        return gl.where(rescale, m_new, m_i), rescale


@gluon.jit
def rescaled(acc, alpha, rescale, layout: gl.constexpr):
    """The accumulator (``layout``) times ``alpha`` a row, where ``lazy_max`` asks for it (alpha is 1 elsewhere)."""
    if rescale:
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, layout))[:, None]
    return acc


@gluon.jit
def _block_scores(q, k_bufs, stage, s_zero, HALF: gl.constexpr):
    """Issues Q K^T over the stage's key block: all of it, or with ``HALF`` its first half (``s_zero``'s width; the
    keys past it lie outside the sequence)."""
    if HALF:
        keys = k_bufs.index(stage).slice(0, s_zero.shape[1], dim=0)
    else:
        keys = k_bufs.index(stage)
    return warpgroup_mma(q, keys.permute((1, 0)), s_zero, use_acc=False, is_async=True)


@gluon.jit
def _block_softmax(s, m_i, l_i, j, rows, seqlen_q, seqlen_k, qk_scale_log2, BLOCK_N: gl.constexpr,
                   CAUSAL: gl.constexpr, MASKED: gl.constexpr, HALF: gl.constexpr, THRESHOLD: gl.constexpr):
    """``_softmax_step`` of key block ``j``'s scores; with ``HALF`` of its first half's (non-causal, masked), the
    softmax state taken from and returned in the whole block's layout."""
    s_layout: gl.constexpr = wgmma_layout(BLOCK_N)
    if HALF:
        half_layout: gl.constexpr = wgmma_layout(BLOCK_N // 2)
        # the half's columns numbered as block 2j of half-width blocks: keys j * BLOCK_N + c
        m_half, l_half, p, alpha, rescale = _softmax_step(
            s, gl.convert_layout(m_i, gl.SliceLayout(1, half_layout)), l_i, j * 2, rows, seqlen_q, seqlen_k,
            qk_scale_log2, BLOCK_N // 2, False, True, half_layout, THRESHOLD)
        m_i = gl.convert_layout(m_half, gl.SliceLayout(1, s_layout))
        l_i = gl.convert_layout(l_half, l_i.type.layout)
    else:
        m_i, l_i, p, alpha, rescale = _softmax_step(s, m_i, l_i, j, rows, seqlen_q, seqlen_k, qk_scale_log2,
                                                    BLOCK_N, CAUSAL, MASKED, s_layout, THRESHOLD)
    return m_i, l_i, p, alpha, rescale


@gluon.jit
def _first_block(q, k_bufs, k_ready, k_free, ring, j, m_i, l_i, acc, s_zero, rows, seqlen_q, seqlen_k,
                 qk_scale_log2, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr,
                 CAUSAL: gl.constexpr, MASKED: gl.constexpr, HALF: gl.constexpr, THRESHOLD: gl.constexpr):
    """Key block ``j`` (the ring's block ``ring + j``: ``ring`` counts earlier runs' blocks) as a run's first: its
    scores and softmax, with no P V to overlap. Returns the ring stage and phase it read, the softmax state and P as
    the next P V's operand. ``HALF``: the block's first half only (``_block_scores``; P half as wide)."""
    o_layout: gl.constexpr = wgmma_layout(HEAD_DIM)
    stage = (ring + j) % NUM_STAGES
    phase = ((ring + j) // NUM_STAGES) & 1
    mbarrier.wait(k_ready.index(stage), phase)
    s = _block_scores(q, k_bufs, stage, s_zero, HALF)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
    mbarrier.arrive(k_free.index(stage), count=1)
    m_i, l_i, p, alpha, rescale = _block_softmax(s, m_i, l_i, j, rows, seqlen_q, seqlen_k, qk_scale_log2, BLOCK_N,
                                                 CAUSAL, MASKED, HALF, THRESHOLD)
    acc = rescaled(acc, alpha, rescale, o_layout)
    p_op = gl.convert_layout(to_16_bits(p, q.dtype), register_operand_layout(HEAD_DIM))
    return stage, phase, m_i, l_i, acc, p_op


@gluon.jit
def _next_block(q, k_bufs, v_bufs, k_ready, v_ready, k_free, v_free, ring, j, stage, phase, m_i, l_i, acc, p_op,
                s_zero, rows, seqlen_q, seqlen_k, qk_scale_log2, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                NUM_STAGES: gl.constexpr, CAUSAL: gl.constexpr, MASKED: gl.constexpr, HALF: gl.constexpr,
                THRESHOLD: gl.constexpr):
    """Key block ``j`` (the ring's block ``ring + j``) after another: its Q K^T and the block before's P V
    (``p_op``, V in ``stage``; always a whole block) in flight together, then its softmax (FA3's intra-warpgroup
    overlap). Returns as ``_first_block``."""
    o_layout: gl.constexpr = wgmma_layout(HEAD_DIM)
    prev_stage = stage
    prev_phase = phase
    stage = (ring + j) % NUM_STAGES
    phase = ((ring + j) // NUM_STAGES) & 1
    mbarrier.wait(k_ready.index(stage), phase)
    mbarrier.wait(v_ready.index(prev_stage), prev_phase)
    s = _block_scores(q, k_bufs, stage, s_zero, HALF)
    acc = warpgroup_mma(p_op, v_bufs.index(prev_stage), acc, is_async=True)
    s = warpgroup_mma_wait(num_outstanding=1, deps=(s, ))
    mbarrier.arrive(k_free.index(stage), count=1)  # K is read by Q K^T alone: the loader may refill it
    m_i, l_i, p, alpha, rescale = _block_softmax(s, m_i, l_i, j, rows, seqlen_q, seqlen_k, qk_scale_log2, BLOCK_N,
                                                 CAUSAL, MASKED, HALF, THRESHOLD)
    # P V reads p_op from registers until it completes: keep it alive to here
    acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p_op))
    mbarrier.arrive(v_free.index(prev_stage), count=1)
    acc = rescaled(acc, alpha, rescale, o_layout)
    p_op = gl.convert_layout(to_16_bits(p, q.dtype), register_operand_layout(HEAD_DIM))
    return stage, phase, m_i, l_i, acc, p_op


@gluon.jit
def _last_product(v_bufs, v_ready, v_free, stage, phase, acc, p_op, HALF: gl.constexpr):
    """A run's last P V (V in ``stage``), with no Q K^T to overlap; with ``HALF`` over the first half of the stage's
    values (``p_op`` half as wide)."""
    mbarrier.wait(v_ready.index(stage), phase)
    if HALF:
        values = v_bufs.index(stage).slice(0, p_op.shape[1], dim=0)
    else:
        values = v_bufs.index(stage)
    acc = warpgroup_mma(p_op, values, acc, is_async=True)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    mbarrier.arrive(v_free.index(stage), count=1)
    return acc


@gluon.constexpr_function
def half_tails(is_varlen, causal, block_n, num_consumers):
    """Whether a build computes a last key block that holds at most half a block of keys at half its width
    (``_tile_key_blocks``): packed non-causal calls, whose sequences end anywhere in a block (the bench's mixed
    lengths: 0.886 of the products useful at a 512 mean with whole last blocks, 0.921 with half ones), on two
    consumers (hdim 128: +1.6% / +2.6% / +1.9% at a 512 / 1k / 2k mean; hdim 64's three consumers lost 3% at 512;
    H200, docs/perf-notes.md)."""
    return is_varlen and not causal and block_n == 128 and num_consumers == 2


@gluon.jit
def _key_blocks(q, k_bufs, v_bufs, k_ready, v_ready, k_free, v_free, q_free, ring, m_i, l_i, acc, rows, lo, hi,
                release_q, seqlen_q, seqlen_k, qk_scale_log2, zeroed,
                BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                MASKED: gl.constexpr, ZEROED: gl.constexpr):
    """Key blocks [lo, hi) of one consumer's 64 rows as one run (the decode kernel's loop). ``ring``: the blocks of
    earlier runs (the ring's position). ``release_q``: these are the consumer's last blocks, so it releases Q once
    their last Q K^T has completed, before the last P V. ``ZEROED``: the run's last block is a sequence's partly
    filled one, whose P V waits for the loader's zeroing of the values past the sequence (barrier ``zeroed``)."""
    s_zero = gl.zeros([ROWS_PER_WARPGROUP, BLOCK_N], gl.float32, wgmma_layout(BLOCK_N))
    if hi > lo:
        stage, phase, m_i, l_i, acc, p_op = _first_block(
            q, k_bufs, k_ready, k_free, ring, lo, m_i, l_i, acc, s_zero, rows, seqlen_q, seqlen_k, qk_scale_log2,
            BLOCK_N, HEAD_DIM, NUM_STAGES, CAUSAL, MASKED, False, None)
        for j in range(lo + 1, hi):
            stage, phase, m_i, l_i, acc, p_op = _next_block(
                q, k_bufs, v_bufs, k_ready, v_ready, k_free, v_free, ring, j, stage, phase, m_i, l_i, acc, p_op,
                s_zero, rows, seqlen_q, seqlen_k, qk_scale_log2, BLOCK_N, HEAD_DIM, NUM_STAGES, CAUSAL, MASKED,
                False, None)
        if release_q:
            mbarrier.arrive(q_free, count=1)
        if ZEROED:
            mbarrier.wait(zeroed, 0)
        acc = _last_product(v_bufs, v_ready, v_free, stage, phase, acc, p_op, False)
    elif release_q:
        mbarrier.arrive(q_free, count=1)  # no block at all: Q was never read
    return m_i, l_i, acc


@gluon.jit
def _tile_key_blocks(q, k_bufs, v_bufs, k_ready, v_ready, k_free, v_free, q_free, ring, m_i, l_i, acc, rows, n_full,
                     n_blocks, seqlen_q, seqlen_k, qk_scale_log2,
                     BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                     HALF_TAILS: gl.constexpr, THRESHOLD: gl.constexpr, RELEASE_Q: gl.constexpr):
    """A forward tile's key blocks for one consumer's 64 rows, as one run: [0, n_full) seen whole, then
    [n_full, n_blocks) through the mask (the diagonal, the sequence's end); with ``RELEASE_Q`` Q released after the
    last Q K^T (else the caller releases it). With ``HALF_TAILS`` (``half_tails``) a last block with at most half its
    keys in the sequence runs at half width.

    One run, not a run of whole blocks and a run of masked ones: the second run's first Q K^T would wait for nothing
    to overlap, as would the first run's last P V; and with two runs ptxas 12.8 (Triton 3.6) reused, in the masked
    run's first product, Q descriptors that it had computed only inside the whole-block run's first product, so that
    a tile with no whole block (fewer keys than one block, non-causal) read Q through another tile's descriptors:
    wrong rows wherever a program's Q tile moves between tiles (two Q buffers; docs/perf-notes.md)."""
    s_zero = gl.zeros([ROWS_PER_WARPGROUP, BLOCK_N], gl.float32, wgmma_layout(BLOCK_N))
    n_wide = n_blocks
    if HALF_TAILS:
        # a last block with at most half its keys in the sequence: computed at half width
        half_zero = gl.zeros([ROWS_PER_WARPGROUP, BLOCK_N // 2], gl.float32, wgmma_layout(BLOCK_N // 2))
        n_wide = n_blocks - ((n_blocks > n_full) & (seqlen_k - n_full * BLOCK_N <= BLOCK_N // 2)).to(gl.int32)
    if n_wide > 0:
        # the first block through the mask whether or not it needs it: once a tile, and an if between the two forms
        # would carry the loop's state in another order (the frontend sorts an if's names), whose hdim-64 loop ptxas
        # scheduled 3-4% slower than the two-run kernel's (2-3% without it; docs/perf-notes.md)
        stage, phase, m_i, l_i, acc, p_op = _first_block(
            q, k_bufs, k_ready, k_free, ring, 0, m_i, l_i, acc, s_zero, rows, seqlen_q, seqlen_k, qk_scale_log2,
            BLOCK_N, HEAD_DIM, NUM_STAGES, CAUSAL, True, False, THRESHOLD)
        for j in range(1, n_full):
            stage, phase, m_i, l_i, acc, p_op = _next_block(
                q, k_bufs, v_bufs, k_ready, v_ready, k_free, v_free, ring, j, stage, phase, m_i, l_i, acc, p_op,
                s_zero, rows, seqlen_q, seqlen_k, qk_scale_log2, BLOCK_N, HEAD_DIM, NUM_STAGES, CAUSAL, False, False,
                THRESHOLD)
        for j in range(gl.maximum(n_full, 1), n_wide):
            stage, phase, m_i, l_i, acc, p_op = _next_block(
                q, k_bufs, v_bufs, k_ready, v_ready, k_free, v_free, ring, j, stage, phase, m_i, l_i, acc, p_op,
                s_zero, rows, seqlen_q, seqlen_k, qk_scale_log2, BLOCK_N, HEAD_DIM, NUM_STAGES, CAUSAL, True, False,
                THRESHOLD)
        if HALF_TAILS and n_wide < n_blocks:
            stage, phase, m_i, l_i, acc, p_half = _next_block(
                q, k_bufs, v_bufs, k_ready, v_ready, k_free, v_free, ring, n_wide, stage, phase, m_i, l_i, acc, p_op,
                half_zero, rows, seqlen_q, seqlen_k, qk_scale_log2, BLOCK_N, HEAD_DIM, NUM_STAGES, CAUSAL, True, True,
                THRESHOLD)
            _release(q_free, RELEASE_Q)
            acc = _last_product(v_bufs, v_ready, v_free, stage, phase, acc, p_half, True)
        else:
            _release(q_free, RELEASE_Q)
            acc = _last_product(v_bufs, v_ready, v_free, stage, phase, acc, p_op, False)
    elif HALF_TAILS and n_blocks > 0:
        # one block, at most half of it in the sequence
        stage, phase, m_i, l_i, acc, p_half = _first_block(
            q, k_bufs, k_ready, k_free, ring, 0, m_i, l_i, acc, half_zero, rows, seqlen_q, seqlen_k, qk_scale_log2,
            BLOCK_N, HEAD_DIM, NUM_STAGES, CAUSAL, True, True, THRESHOLD)
        _release(q_free, RELEASE_Q)
        acc = _last_product(v_bufs, v_ready, v_free, stage, phase, acc, p_half, True)
    else:
        _release(q_free, RELEASE_Q)  # no block at all: Q was never read
    return m_i, l_i, acc


@gluon.jit
def _release(q_free, RELEASE: gl.constexpr):
    """The consumer's release of its Q tile, or none where it releases Q after its store (``STORE_THROUGH_Q``)."""
    if RELEASE:
        mbarrier.arrive(q_free, count=1)


@gluon.jit
def _consumer_partition(q_smem, k_bufs, v_bufs, q_ready, q_free, k_ready, v_ready, k_free, v_free, tile_slot, Out,
                        Lse, CuSeqlensQ, CuSeqlensK, stride_om, stride_oh, stride_lb, stride_lh, seqlen_q, seqlen_k,
                        nheads, group_size, row_tiles, batch_heads, heads_per_section, total_tiles, qk_scale_log2,
                        WARP_GROUP: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr,
                        NUM_STAGES: gl.constexpr, CAUSAL: gl.constexpr, IS_VARLEN: gl.constexpr,
                        NUM_CONSUMERS: gl.constexpr, STORE_THROUGH_Q: gl.constexpr, Q_BUFFERS: gl.constexpr,
                        THRESHOLD: gl.constexpr):
    s_layout: gl.constexpr = wgmma_layout(BLOCK_N)
    o_layout: gl.constexpr = wgmma_layout(HEAD_DIM)
    ring = 0
    rounds = 0  # this program's tiles so far
    mbarrier.wait(q_ready.index(0), 0)
    tile_id = read_tile(tile_slot.index(0))
    while tile_id < total_tiles:
        _, head, _, q_start, _, tile_seqlen_q, tile_seqlen_k, lse_row, tile_row, n_full, n_blocks = _tile_plan(
            tile_id, row_tiles, batch_heads, heads_per_section, nheads, group_size, CuSeqlensQ, CuSeqlensK, seqlen_q,
            seqlen_k, stride_lb, stride_lh, BLOCK_N, CAUSAL, IS_VARLEN, NUM_CONSUMERS)
        slot = rounds % Q_BUFFERS
        q = q_smem.index(slot * NUM_CONSUMERS + WARP_GROUP)
        first_row = tile_row + WARP_GROUP * ROWS_PER_WARPGROUP  # within the sequence
        rows = first_row + gl.arange(0, ROWS_PER_WARPGROUP, layout=gl.SliceLayout(1, s_layout))
        m_i = gl.full([ROWS_PER_WARPGROUP], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
        l_i = zero_row_sums(ROWS_PER_WARPGROUP, BLOCK_N, s_layout, partial_row_sums(HEAD_DIM))
        acc = gl.zeros([ROWS_PER_WARPGROUP, HEAD_DIM], gl.float32, o_layout)
        own_full, own_blocks = _consumer_key_blocks(first_row, tile_seqlen_q, tile_seqlen_k, n_full, n_blocks,
                                                    BLOCK_N, CAUSAL)
        # -- blocks every row of this consumer sees whole, then the masked ones (diagonal, sequence end) --
        m_i, l_i, acc = _tile_key_blocks(q, k_bufs, v_bufs, k_ready, v_ready, k_free, v_free, q_free.index(slot), ring,
                                         m_i, l_i, acc, rows, own_full, own_blocks, tile_seqlen_q, tile_seqlen_k,
                                         qk_scale_log2, BLOCK_N, HEAD_DIM, NUM_STAGES, CAUSAL,
                                         half_tails(IS_VARLEN, CAUSAL, BLOCK_N, NUM_CONSUMERS), THRESHOLD,
                                         not STORE_THROUGH_Q)
        # -- the tile's blocks past this consumer's last row: released as they arrive, never read --
        for j in range(own_blocks, n_blocks):
            stage = (ring + j) % NUM_STAGES
            phase = ((ring + j) // NUM_STAGES) & 1
            mbarrier.wait(k_ready.index(stage), phase)  # a release before the block is in would free the last one
            mbarrier.arrive(k_free.index(stage), count=1)
            mbarrier.wait(v_ready.index(stage), phase)
            mbarrier.arrive(v_free.index(stage), count=1)
        ring += n_blocks

        # -- epilogue: normalize; a row that saw no key gives 0 and lse = +inf, as the Triton kernel --
        l_i = row_sums(l_i, s_layout)
        empty = l_i == 0.0
        l_safe = gl.where(empty, 1.0, l_i)
        acc = acc / gl.convert_layout(l_safe, gl.SliceLayout(1, o_layout))[:, None]
        lse = gl.where(empty, float("inf"), (m_i + gl.log2(l_safe)) / LOG2E)
        gl.store(Lse + lse_row + rows, lse, mask=rows_in_sequence(rows, tile_seqlen_q))
        if STORE_THROUGH_Q:
            store_rows_through(Out, acc, q, q_start, first_row, head * stride_oh, stride_om, tile_seqlen_q, HEAD_DIM)
            mbarrier.arrive(q_free.index(slot), count=1)
        else:
            store_rows(Out, acc, q_start, first_row, head * stride_oh, stride_om, tile_seqlen_q, HEAD_DIM, True)
        rounds += 1
        mbarrier.wait(q_ready.index(rounds % Q_BUFFERS), (rounds // Q_BUFFERS) & 1)
        tile_id = read_tile(tile_slot.index(rounds % Q_BUFFERS))


@gluon.jit
def attention_forward_hopper_kernel(
    q_desc, k_desc, v_desc, Out, Lse, CuSeqlensQ, CuSeqlensK, TileCounter,
    stride_om, stride_oh, stride_lb, stride_lh,
    seqlen_q, seqlen_k, nheads, group_size, row_tiles, batch_heads, heads_per_section, qk_scale_log2,
    HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr, CAUSAL: gl.constexpr,
    IS_VARLEN: gl.constexpr, NUM_CONSUMERS: gl.constexpr,
    CONSUMER_REGISTERS: gl.constexpr, LOADER_REGISTERS: gl.constexpr, DYNAMIC_TILES: gl.constexpr,
    STORE_THROUGH_Q: gl.constexpr, Q_BUFFERS: gl.constexpr, RESCALE_THRESHOLD: gl.constexpr,
):
    """Tiles of NUM_CONSUMERS x 64 query rows (2 or 3 consumer warpgroups), ``row_tiles`` per (sequence, head)
    and ``batch_heads`` of those; program p computes tile p first, then (persistent, when the grid is smaller than
    the tiles) the ones its loader takes (``_next_tile``). Dense: q_desc spans (batch, seqlen_q, nheads *
    HEAD_DIM), k/v_desc (batch, seqlen_k, nheads_k * HEAD_DIM); varlen: (tokens, heads * HEAD_DIM) over the packed
    tokens, sequence b's rows from CuSeqlens[b].
    Lse: (batch, nheads, seqlen_q) dense, (nheads, total_q) varlen. TileCounter: one int32, zero at launch, with
    ``DYNAMIC_TILES`` (``_next_tile``). O is stored 16 bytes a thread, its layout converted through
    scratch shared memory (``store_rows``) or, with ``STORE_THROUGH_Q`` (tiles whose shared memory leaves no room for
    the scratch), through each consumer's own Q tile (``store_rows_through``), which the consumer then releases after
    its store rather than after its last Q K^T.
    ``Q_BUFFERS``: 2 gives a persistent program a second Q tile, so that the loader copies the next tile's Q, and
    then its first K/V blocks, while the consumers still work on this one; with 1 the copy waits for every
    consumer's release of Q. ``RESCALE_THRESHOLD``: ``lazy_max``'s (None: every block)."""
    gl.static_assert(NUM_CONSUMERS >= 1 and NUM_CONSUMERS <= 3, "one to three consumer warpgroups")
    total_tiles = row_tiles * batch_heads
    q_smem, q_ready, q_free, tile_slot = q_ring(q_desc, HEAD_DIM, Q_BUFFERS, NUM_CONSUMERS)
    k_bufs, v_bufs, k_ready, v_ready, k_free, v_free = key_ring(k_desc, v_desc, HEAD_DIM, BLOCK_N, NUM_STAGES,
                                                                NUM_CONSUMERS)
    landed = zeroing_barrier(k_desc)

    # each consumer's partition spelled out: warp_specialize takes a literal list, one entry per partition, and an
    # argument tuple built once (joined with +, or nested in each entry's) loses its constexprs in Triton 3.6's Gluon
    if NUM_CONSUMERS == 1:
        gl.warp_specialize([
            (_consumer_partition, (q_smem, k_bufs, v_bufs, q_ready, q_free, k_ready, v_ready, k_free, v_free, tile_slot,
                                   Out, Lse, CuSeqlensQ, CuSeqlensK, stride_om, stride_oh, stride_lb, stride_lh,
                                   seqlen_q, seqlen_k, nheads, group_size, row_tiles, batch_heads, heads_per_section,
                                   total_tiles, qk_scale_log2, 0, HEAD_DIM, BLOCK_N, NUM_STAGES, CAUSAL, IS_VARLEN,
                                   NUM_CONSUMERS, STORE_THROUGH_Q, Q_BUFFERS, RESCALE_THRESHOLD)),
            (_load_partition, (q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_ready, q_free, k_ready, v_ready,
                               k_free, v_free, landed, tile_slot, TileCounter, CuSeqlensQ, CuSeqlensK, seqlen_q,
                               seqlen_k, nheads, group_size, row_tiles, batch_heads, heads_per_section, total_tiles,
                               HEAD_DIM, BLOCK_N, NUM_STAGES, CAUSAL, IS_VARLEN, NUM_CONSUMERS, DYNAMIC_TILES,
                               Q_BUFFERS)),
        ], [1], [LOADER_REGISTERS])
    elif NUM_CONSUMERS == 2:
        gl.warp_specialize([
            (_consumer_partition, (q_smem, k_bufs, v_bufs, q_ready, q_free, k_ready, v_ready, k_free, v_free, tile_slot,
                                   Out, Lse, CuSeqlensQ, CuSeqlensK, stride_om, stride_oh, stride_lb, stride_lh,
                                   seqlen_q, seqlen_k, nheads, group_size, row_tiles, batch_heads, heads_per_section,
                                   total_tiles, qk_scale_log2, 0, HEAD_DIM, BLOCK_N, NUM_STAGES, CAUSAL, IS_VARLEN,
                                   NUM_CONSUMERS, STORE_THROUGH_Q, Q_BUFFERS, RESCALE_THRESHOLD)),
            (_consumer_partition, (q_smem, k_bufs, v_bufs, q_ready, q_free, k_ready, v_ready, k_free, v_free, tile_slot,
                                   Out, Lse, CuSeqlensQ, CuSeqlensK, stride_om, stride_oh, stride_lb, stride_lh,
                                   seqlen_q, seqlen_k, nheads, group_size, row_tiles, batch_heads, heads_per_section,
                                   total_tiles, qk_scale_log2, 1, HEAD_DIM, BLOCK_N, NUM_STAGES, CAUSAL, IS_VARLEN,
                                   NUM_CONSUMERS, STORE_THROUGH_Q, Q_BUFFERS, RESCALE_THRESHOLD)),
            (_load_partition, (q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_ready, q_free, k_ready, v_ready,
                               k_free, v_free, landed, tile_slot, TileCounter, CuSeqlensQ, CuSeqlensK, seqlen_q,
                               seqlen_k, nheads, group_size, row_tiles, batch_heads, heads_per_section, total_tiles,
                               HEAD_DIM, BLOCK_N, NUM_STAGES, CAUSAL, IS_VARLEN, NUM_CONSUMERS, DYNAMIC_TILES,
                               Q_BUFFERS)),
        ], [4, 1], [CONSUMER_REGISTERS, LOADER_REGISTERS])
    else:
        gl.warp_specialize([
            (_consumer_partition, (q_smem, k_bufs, v_bufs, q_ready, q_free, k_ready, v_ready, k_free, v_free, tile_slot,
                                   Out, Lse, CuSeqlensQ, CuSeqlensK, stride_om, stride_oh, stride_lb, stride_lh,
                                   seqlen_q, seqlen_k, nheads, group_size, row_tiles, batch_heads, heads_per_section,
                                   total_tiles, qk_scale_log2, 0, HEAD_DIM, BLOCK_N, NUM_STAGES, CAUSAL, IS_VARLEN,
                                   NUM_CONSUMERS, STORE_THROUGH_Q, Q_BUFFERS, RESCALE_THRESHOLD)),
            (_consumer_partition, (q_smem, k_bufs, v_bufs, q_ready, q_free, k_ready, v_ready, k_free, v_free, tile_slot,
                                   Out, Lse, CuSeqlensQ, CuSeqlensK, stride_om, stride_oh, stride_lb, stride_lh,
                                   seqlen_q, seqlen_k, nheads, group_size, row_tiles, batch_heads, heads_per_section,
                                   total_tiles, qk_scale_log2, 1, HEAD_DIM, BLOCK_N, NUM_STAGES, CAUSAL, IS_VARLEN,
                                   NUM_CONSUMERS, STORE_THROUGH_Q, Q_BUFFERS, RESCALE_THRESHOLD)),
            (_consumer_partition, (q_smem, k_bufs, v_bufs, q_ready, q_free, k_ready, v_ready, k_free, v_free, tile_slot,
                                   Out, Lse, CuSeqlensQ, CuSeqlensK, stride_om, stride_oh, stride_lb, stride_lh,
                                   seqlen_q, seqlen_k, nheads, group_size, row_tiles, batch_heads, heads_per_section,
                                   total_tiles, qk_scale_log2, 2, HEAD_DIM, BLOCK_N, NUM_STAGES, CAUSAL, IS_VARLEN,
                                   NUM_CONSUMERS, STORE_THROUGH_Q, Q_BUFFERS, RESCALE_THRESHOLD)),
            (_load_partition, (q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_ready, q_free, k_ready, v_ready,
                               k_free, v_free, landed, tile_slot, TileCounter, CuSeqlensQ, CuSeqlensK, seqlen_q,
                               seqlen_k, nheads, group_size, row_tiles, batch_heads, heads_per_section, total_tiles,
                               HEAD_DIM, BLOCK_N, NUM_STAGES, CAUSAL, IS_VARLEN, NUM_CONSUMERS, DYNAMIC_TILES,
                               Q_BUFFERS)),
        ], [4, 4, 1], [CONSUMER_REGISTERS, CONSUMER_REGISTERS, LOADER_REGISTERS])
