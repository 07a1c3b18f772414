"""The block map of a mask's tile summary, one program per map row (see ``mask_blocks.py``).

Built in torch it took about ten small ops per map (cumsum, pad, a stable argsort, casts, a concat),
and an SDPA call with a mask builds three maps (forward, dK/dV, dQ): on the GPU their launches cost as
much as a forward pass at 4k tokens. Here each map is one launch.
"""

import triton
import triton.language as tl


@triton.jit
def block_map_kernel(
    Summary, Map,
    stride_sb, stride_sh, stride_srow, stride_scol,
    stride_mb, stride_mh, stride_mrow,
    nheads, columns,
    BLOCK: tl.constexpr,
):
    """Grid (Bm x Hm, rows): the larger count on the grid's first dim, which has no 65535 limit.

    Summary[b, h, row, :columns] are the row's flags (any int dtype, 0 = hidden); strides are 0
    along the dims the summary broadcasts. Map[b, h, row] gets the visible blocks before each block
    (columns + 1 counts), then the visible blocks in increasing order, then the hidden ones (a
    stable partition: the kernels read only the visible part)."""
    row = tl.program_id(1)
    b = tl.program_id(0) // nheads
    h = tl.program_id(0) % nheads
    offs = tl.arange(0, BLOCK)
    in_row = offs < columns
    flags = tl.load(Summary + b * stride_sb + h * stride_sh + row * stride_srow + offs * stride_scol,
                    mask=in_row, other=0)
    visible = (flags != 0).to(tl.int32)
    before = tl.cumsum(visible, 0) - visible
    total = tl.sum(visible, 0)
    map_row = Map + b * stride_mb + h * stride_mh + row * stride_mrow
    tl.store(map_row + offs, before, mask=in_row)
    tl.store(map_row + columns, total)
    listed = map_row + columns + 1
    position = tl.where(visible != 0, before, total + offs - before)
    tl.store(listed + position, offs, mask=in_row)
