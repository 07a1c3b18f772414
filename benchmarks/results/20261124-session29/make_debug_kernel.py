"""Writes scratch/forward_hopper_debug.py: the tree's Gluon forward with a ``Debug`` float32 buffer (programs x
ROUNDS x 5 records x 16) in which every consumer records, for each of its program's tiles, the tile number, Q
slot, ring position, key blocks and a checksum of the Q, K and V tiles it sees before its first block (records 0,
1), the loader what it copied where (record 2), and each consumer what it computed before its store: the sums of
its normalized output and of l, the largest m, its product issues before and after each key-block call, the
lengths it used (records 3, 4). q_tiles_debug.py compares them with the inputs
(calls B-D)."""
from pathlib import Path

ROUNDS = 32
source = Path("src/flashattn/kernels/forward_hopper.py").read_text()


def swap(old: str, new: str, count: int = 1) -> None:
    global source
    assert source.count(old) == count, (old, source.count(old))
    source = source.replace(old, new)


# the buffer: one more argument, after qk_scale_log2, passed to every partition
swap("heads_per_section, qk_scale_log2,\n    HEAD_DIM: gl.constexpr,",
     "heads_per_section, qk_scale_log2, Debug,\n    HEAD_DIM: gl.constexpr,")
swap("heads_per_section, total_tiles, qk_scale_log2, 0,", "heads_per_section, total_tiles, qk_scale_log2, Debug, 0,", 2)
swap("heads_per_section, total_tiles, qk_scale_log2, 1,", "heads_per_section, total_tiles, qk_scale_log2, Debug, 1,", 2)
swap("heads_per_section, total_tiles, qk_scale_log2, 2,", "heads_per_section, total_tiles, qk_scale_log2, Debug, 2,")
LOADER_INDENT = " " * 31
swap(f"nheads, group_size, row_tiles, batch_heads, heads_per_section, total_tiles,\n{LOADER_INDENT}HEAD_DIM,",
     f"nheads, group_size, row_tiles, batch_heads, heads_per_section, total_tiles, Debug,\n{LOADER_INDENT}HEAD_DIM,", 2)
swap("                        qk_scale_log2,\n                        WARP_GROUP: gl.constexpr,",
     "                        qk_scale_log2, Debug,\n                        WARP_GROUP: gl.constexpr,")
swap("row_tiles, batch_heads, heads_per_section, total_tiles, HEAD_DIM: gl.constexpr,",
     "row_tiles, batch_heads, heads_per_section, total_tiles, Debug, HEAD_DIM: gl.constexpr,")

HELPERS = f'''

@gluon.jit
def _debug_record(Debug, rounds, partition, values):
    """values: a [16] float32 tensor in _DEBUG_LAYOUT, stored at (program, rounds, partition)."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    offsets = ((gl.program_id(0) * {ROUNDS} + rounds) * 5 + partition) * 16 + gl.arange(0, 16, layout=layout)
    gl.store(Debug + offsets, gl.convert_layout(values, layout), mask=rounds < {ROUNDS})


@gluon.jit
def _debug_values(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9):
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    index = gl.arange(0, 16, layout=layout)
    v = gl.zeros([16], gl.float32, layout)
    v = gl.where(index == 0, a0.to(gl.float32), v)
    v = gl.where(index == 1, a1.to(gl.float32), v)
    v = gl.where(index == 2, a2.to(gl.float32), v)
    v = gl.where(index == 3, a3.to(gl.float32), v)
    v = gl.where(index == 4, a4.to(gl.float32), v)
    v = gl.where(index == 5, a5.to(gl.float32), v)
    v = gl.where(index == 6, a6.to(gl.float32), v)
    v = gl.where(index == 7, a7.to(gl.float32), v)
    v = gl.where(index == 8, a8.to(gl.float32), v)
    v = gl.where(index == 9, a9.to(gl.float32), v)
    return v


@gluon.jit
def _tile_sum(tile, ROWS: gl.constexpr, HEAD_DIM: gl.constexpr):
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [gl.num_warps(), 1], [1, 0])
    return gl.sum(gl.sum(tile.load(layout).to(gl.float32), axis=1), axis=0)
'''
swap("\n\n@gluon.jit\ndef _tile_plan(", HELPERS + "\n\n@gluon.jit\ndef _tile_plan(")

# the consumer: before its first block, wait for block 0's K and V too, and record checksums
swap('''        own_full, own_blocks = _consumer_key_blocks(first_row, tile_seqlen_q, tile_seqlen_k, n_full, n_blocks,
                                                    BLOCK_N, CAUSAL, PINGPONG)
''', '''        own_full, own_blocks = _consumer_key_blocks(first_row, tile_seqlen_q, tile_seqlen_k, n_full, n_blocks,
                                                    BLOCK_N, CAUSAL, PINGPONG)
        q_sum = _tile_sum(q, ROWS_PER_WARPGROUP, HEAD_DIM)
        k_sum = q_sum * 0.0
        v_sum = q_sum * 0.0
        if own_blocks > 0:
            mbarrier.wait(k_ready.index(ring % NUM_STAGES), (ring // NUM_STAGES) & 1)
            mbarrier.wait(v_ready.index(ring % NUM_STAGES), (ring // NUM_STAGES) & 1)
            k_sum = _tile_sum(k_bufs.index(ring % NUM_STAGES), BLOCK_N, HEAD_DIM)
            v_sum = _tile_sum(v_bufs.index(ring % NUM_STAGES), BLOCK_N, HEAD_DIM)
        _debug_record(Debug, rounds, WARP_GROUP, _debug_values(tile_id, slot, ring, n_blocks, own_full, own_blocks,
                                                               q_sum, k_sum, v_sum, first_row))
''')
# the consumer: what it computed, before its store
swap('''        acc = acc / gl.convert_layout(l_safe, gl.SliceLayout(1, o_layout))[:, None]
''', '''        acc = acc / gl.convert_layout(l_safe, gl.SliceLayout(1, o_layout))[:, None]
        o_sum = gl.sum(gl.sum(acc, axis=1), axis=0)
        o_abs = gl.sum(gl.sum(gl.abs(acc), axis=1), axis=0)
        _debug_record(Debug, rounds, 3 + WARP_GROUP,
                      _debug_values(o_sum, o_abs, gl.sum(l_i, axis=0), gl.max(m_i, axis=0), t_before, t_first, t,
                                    tile_seqlen_q, tile_seqlen_k, tile_id))
''')
# the consumer: its product issues before and after each key-block call (which path ran)
swap('''        q_release = q_free.index(slot)
        m_i, l_i, acc, t = _key_blocks(''', '''        q_release = q_free.index(slot)
        t_before = t
        m_i, l_i, acc, t = _key_blocks(''')
swap('''                                       WARP_GROUP, PINGPONG)
        m_i, l_i, acc, t = _key_blocks(''', '''                                       WARP_GROUP, PINGPONG)
        t_first = t
        m_i, l_i, acc, t = _key_blocks(''')
# the loader: what it copied where
swap('''            ring += n_blocks
            rounds += 1
        tile_id = next_tile''', '''            _debug_record(Debug, rounds, 2,
                          _debug_values(tile_id, slot, ring, n_blocks, q_start, tile_row, head, head_k, ring * 0,
                                        ring * 0))
            ring += n_blocks
            rounds += 1
        tile_id = next_tile''')
Path("scratch/forward_hopper_debug.py").write_text(source)
print("written scratch/forward_hopper_debug.py")
