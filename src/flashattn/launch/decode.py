"""The KV-cache launches: the append, the attention over the cache (the Triton kernel, or the Hopper kernel for the
steps it covers on sm90) with its split-KV partials, and the merge by log-sum-exp."""

from __future__ import annotations

import dataclasses

import torch

from .. import configs
from ..backend import interpreting
from ..faults import fault_buffer
from ..options import AttentionOptions
from .common import (
    LOG2E,
    alibi_arguments,
    cdiv,
    cuda_index,
    dot_flags,
    kernel_scalars,
    last_dim_contiguous,
    peak_memory_bandwidth,
    processor_count,
    sequence_descriptor,
    tile_layout,
    token_descriptor,
)
from .launcher import launch


def chained_launch(device: torch.device) -> bool:
    """Whether the decode kernels on ``device`` launch chained by programmatic dependent launch (sm90+): each starts
    while its predecessor drains (``kernels/common.chain_launch``)."""
    if device.type != "cuda" or interpreting():
        return False
    return configs.compute_capability(cuda_index(device))[0] >= 9


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


def launch_append(k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, block_table, rotary_cos, rotary_sin,
                  rotary_interleaved: bool, record_faults: bool) -> None:
    """Write k (rotated) and v into the caches at cache_seqlens[b] + t: a launch of its own, for chunks too long to
    append inside the attention's launch, or with rotary. It launches plainly: chained, it slowed the steps after
    it. ``record_faults``: indices out of range are recorded (``flashattn.faults``)."""
    from ..kernels.decode import kvcache_append_kernel

    batch, seqlen_new, nheads_k, head_dim = k.shape
    geometry = _paged_geometry(k_cache, block_table)
    rotary_dim, seqlen_ro = _rotary_args(rotary_cos)
    block_n = configs.append_keys(interpreting())
    placeholder = cache_seqlens  # any pointer will do where a constexpr flag says it is never read
    cos = rotary_cos if rotary_cos is not None else k
    sin = rotary_sin if rotary_sin is not None else k
    grid = (cdiv(seqlen_new, block_n), batch * nheads_k)
    launch(
        kvcache_append_kernel, grid,
        k, v, k_cache, v_cache, cache_seqlens,
        cache_batch_idx if cache_batch_idx is not None else placeholder,
        block_table if block_table is not None else placeholder, cos, sin, fault_buffer(k.device),
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
        HAS_ROTARY=rotary_cos is not None, INTERLEAVED=rotary_interleaved, RECORD_FAULTS=record_faults,
    )


def _chain_arguments(device: torch.device, enabled: bool = True) -> dict:
    chained = enabled and chained_launch(device)
    return dict(CHAINED=chained, launch_pdl=chained)


def _split_targets(q: torch.Tensor, num_splits: int) -> tuple:
    """(out, lse) of a decode step (``decode_outputs_like``), where its attention launch writes (the outputs
    themselves when unsplit, float32 partials per split to merge after it), and those targets' strides over (split,
    batch, token, head) and (split, batch, head, token); split stride 0 when unsplit (no view of the outputs: a
    launch plan could not make it)."""
    out, lse = decode_outputs_like(q)
    if num_splits == 1:
        return out, lse, out, lse, (0, *out.stride()[:3]), (0, *lse.stride())
    out_target = torch.empty((num_splits, *q.shape), dtype=torch.float32, device=q.device)
    lse_target = torch.empty((num_splits, *lse.shape), dtype=torch.float32, device=q.device)
    return out, lse, out_target, lse_target, out_target.stride()[:4], lse_target.stride()


def hopper_decode_fits(q, k_cache, v_cache, cache_batch_idx, cache_leftpad, block_table, rotary_cos, alibi_slopes,
                       opts: AttentionOptions, k_new) -> bool:
    """Whether a step takes the Hopper decode kernel: an sm90 GPU, one query token (with padded rows, not swapped ones:
    fewer programs than HOPPER_DECODE_MAX_PROGRAMS_PER_PROCESSOR, and at most HOPPER_DECODE_MAX_BYTES_PER_PROCESSOR of
    cache an SM; beyond, the Triton kernel's two programs an SM stream faster), caches of whole 16-byte-aligned rows,
    one run of rows (a contiguous cache's sequences, or a paged pool's pages, one after the other; pages of a multiple
    of 64 keys), 16-bit inputs and caches, head dim 64 or 128, up to FUSED_APPEND_MAX_TOKENS new keys, and none of
    the options it lacks (ALiBi, softcap, a left window, rotary, left padding, a batch index)."""
    if interpreting() or not q.is_cuda or configs.compute_capability(q.device.index)[0] != 9:
        return False
    batch, seqlen_q, nheads, head_dim = q.shape
    nheads_k = k_cache.shape[2]
    if seqlen_q != 1 or head_dim not in (64, 128) or nheads // nheads_k > 64:
        return False
    capacity = _paged_geometry(k_cache, block_table)["capacity"]
    processors = processor_count(q.device)
    if not configs.hopper_decode_query_rows(nheads // nheads_k) and (
            batch * nheads_k >= configs.HOPPER_DECODE_MAX_PROGRAMS_PER_PROCESSOR * processors
            or 2 * batch * capacity * nheads_k * head_dim * k_cache.element_size()
            > configs.HOPPER_DECODE_MAX_BYTES_PER_PROCESSOR * processors):
        return False
    if k_new is not None and k_new.shape[1] > configs.FUSED_APPEND_MAX_TOKENS:
        return False
    if any(x is not None for x in (cache_batch_idx, cache_leftpad, rotary_cos, alibi_slopes)):
        return False
    if q.dtype not in (torch.bfloat16, torch.float16) or k_cache.dtype != q.dtype or opts.softcap != 0.0 \
            or opts.window_left >= 0:
        return False
    if block_table is not None and (k_cache.shape[1] % 64 != 0 or block_table.stride(1) != 1):
        return False
    if k_cache.shape[0] * k_cache.shape[1] >= 2**31:  # the descriptors' rows are TMA's int32 coordinates
        return False
    one_run = all(c.stride(3) == 1 and c.stride(2) == head_dim and c.stride(1) == nheads_k * head_dim
                  and c.stride(0) == c.shape[1] * c.stride(1) and c.data_ptr() % 16 == 0 for c in (k_cache, v_cache))
    return one_run and q.is_contiguous() and q.data_ptr() % 16 == 0


def _hopper_attention(q, k_cache, v_cache, cache_seqlens, block_table, seqlen_new: int, opts: AttentionOptions,
                      num_splits: int, record_faults: bool, k_new=None, v_new=None):
    """(out, lse) of a decode step through the Hopper kernel (``hopper_decode_fits``), which also appends
    ``k_new``/``v_new`` when given; without them, over the keys up to cache_seqlens + ``seqlen_new`` (appended by a
    launch before)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from ..kernels.decode_hopper import kvcache_decode_hopper_kernel

    batch, _, nheads, head_dim = q.shape
    nheads_k = k_cache.shape[2]
    geometry = _paged_geometry(k_cache, block_table)
    capacity = geometry["capacity"]
    programs, processors = batch * nheads_k, processor_count(q.device)
    query_rows = configs.hopper_decode_query_rows(nheads // nheads_k)
    page_size = None if block_table is None else geometry["page_size"]
    block_n, stages = configs.hopper_decode_tile(programs, processors, page_size, query_rows > 0)
    if num_splits <= 0:
        num_splits = configs.hopper_decode_splits(programs, capacity, processors, peak_memory_bandwidth(q.device))
    num_splits = min(num_splits, configs.MAX_SPLITS)
    out, lse, out_target, lse_target, out_strides, lse_strides = _split_targets(q, num_splits)
    out_strides, lse_strides = (out_strides[0], out_strides[1], out_strides[3]), lse_strides[:3]  # one token: no m
    # the queries as (batch x heads) rows: a GQA group's rows are consecutive
    q_desc = TensorDescriptor(q, [batch * nheads, head_dim], [head_dim, 1], [query_rows or 64, head_dim],
                              tile_layout(query_rows or 64, head_dim, q.dtype))
    k_desc, v_desc = token_descriptor(k_cache, block_n), token_descriptor(v_cache, block_n)
    if k_new is not None:
        k_new, v_new = k_new.contiguous(), v_new.contiguous()  # whole rows for their descriptors
        kn_desc, vn_desc = sequence_descriptor(k_new, block_n), sequence_descriptor(v_new, block_n)
        new_keys, extra_keys = k_new.shape[1], 0
    else:
        k_new, v_new, kn_desc, vn_desc, new_keys = k_cache, v_cache, k_desc, v_desc, 0  # never read
        extra_keys = seqlen_new
    launch(
        kvcache_decode_hopper_kernel, (batch * nheads_k, num_splits),
        q_desc, k_desc, v_desc, kn_desc, vn_desc, out_target, lse_target, cache_seqlens, k_cache, v_cache, k_new,
        v_new, block_table if block_table is not None else cache_seqlens, fault_buffer(q.device),
        *out_strides, *lse_strides, *k_cache.stride()[1:3], *k_new.stride()[:3],
        block_table.stride(0) if block_table is not None else 0,
        nheads, nheads_k, capacity, num_splits, new_keys, extra_keys, geometry["page_size"], geometry["num_blocks"],
        int(record_faults), opts.softmax_scale * LOG2E,
        HEAD_DIM=head_dim, BLOCK_N=block_n, NUM_STAGES=stages, LOADER_REGISTERS=configs.HOPPER_DECODE_LOADER_REGISTERS,
        NEW_KEYS=configs.next_power_of_2(new_keys) if new_keys else 0, PAGED=block_table is not None,
        QUERY_ROWS=query_rows, CONSUMERS=configs.hopper_decode_consumers(query_rows, stages),
        CONSUMER_REGISTERS=configs.HOPPER_DECODE_CONSUMER_REGISTERS,
        EARLY_FIRST_BLOCK=configs.hopper_decode_early_first_block(num_splits),
        num_warps=4,
    )
    if num_splits > 1:
        # launched plainly: chained after the Hopper kernel it started later, not sooner
        launch_combine(out_target, lse_target, out, lse, chained=False)
    return out, lse


def launch_decode(q, k_cache, v_cache, cache_seqlens, cache_batch_idx, cache_leftpad, block_table, rotary_cos,
                  rotary_sin, alibi_slopes, seqlen_new: int, opts: AttentionOptions, rotary_interleaved: bool,
                  num_splits: int, record_faults: bool, k_new=None, v_new=None):
    """(out, lse) of the attention over the caches, after appending ``k_new``/``v_new`` when given: in the same launch
    (FUSE_APPEND) up to FUSED_APPEND_MAX_TOKENS new tokens per sequence, else in a launch before it. Steps that the
    Hopper kernel fits (``hopper_decode_fits``) go there instead. Indices are clamped into the caches; with
    ``record_faults`` those out of range are recorded (``flashattn.faults``)."""
    from ..kernels.decode import kvcache_attention_kernel

    q = last_dim_contiguous(q)
    if hopper_decode_fits(q, k_cache, v_cache, cache_batch_idx, cache_leftpad, block_table, rotary_cos, alibi_slopes,
                          opts, k_new):
        return _hopper_attention(q, k_cache, v_cache, cache_seqlens, block_table, seqlen_new, opts, num_splits,
                                 record_faults, k_new, v_new)
    batch, seqlen_q, nheads, head_dim = q.shape
    nheads_k = k_cache.shape[2]
    group_size = nheads // nheads_k
    interpret = interpreting()
    config = configs.decode_config(group_size * seqlen_q, head_dim, q.dtype, interpret)
    # with rotary the new keys would be rotated inside the attention's key loop (a first design that
    # rotated them in the attention launch reached 255 registers and spilled): those steps keep the
    # append's own launch
    fused = k_new is not None and seqlen_new <= configs.FUSED_APPEND_MAX_TOKENS and rotary_cos is None
    if fused:
        k_new, v_new = last_dim_contiguous(k_new), last_dim_contiguous(v_new)
    elif k_new is not None:  # a long chunk: appended by a launch of its own first
        launch_append(k_cache, v_cache, k_new, v_new, cache_seqlens, cache_batch_idx, block_table, rotary_cos,
                      rotary_sin, rotary_interleaved, record_faults)
    geometry = _paged_geometry(k_cache, block_table)
    row_blocks = cdiv(group_size * seqlen_q, config.block_m)
    programs, processors = batch * nheads_k * row_blocks, processor_count(q.device)
    key_blocks = cdiv(geometry["capacity"], config.block_n)
    if num_splits <= 0:
        num_splits = configs.choose_num_splits(programs, key_blocks, processors, config.streaming_stages > 0)
    num_splits = min(num_splits, configs.MAX_SPLITS)
    if num_splits == 1 and configs.streaming_launch(config, programs, processors):
        config = dataclasses.replace(config, num_stages=config.streaming_stages)

    out, lse, out_target, lse_target, out_strides, lse_strides = _split_targets(q, num_splits)

    rotary_dim, seqlen_ro = _rotary_args(rotary_cos)
    slopes, stride_alibi_b, has_alibi = alibi_arguments(alibi_slopes, q)
    placeholder = cache_seqlens
    cos = rotary_cos if rotary_cos is not None else q
    sin = rotary_sin if rotary_sin is not None else q
    scalars = kernel_scalars(opts, None)
    for unused in ("dropout_p", "rng_seed", "rng_offset", "HAS_DROPOUT"):
        scalars.pop(unused)
    one_page = block_table is not None and cache_leftpad is None and geometry["page_size"] % config.block_n == 0
    grid = (row_blocks, batch * nheads_k, num_splits)
    launch(
        kvcache_attention_kernel, grid,
        q, k_cache, v_cache, out_target, lse_target, cache_seqlens,
        cache_batch_idx if cache_batch_idx is not None else placeholder,
        cache_leftpad if cache_leftpad is not None else placeholder,
        block_table if block_table is not None else placeholder, cos, sin, slopes,
        k_new if fused else q, v_new if fused else q, fault_buffer(q.device),
        q.stride(0), q.stride(1), q.stride(2),
        *(k_new.stride()[:3] if fused else (0, 0, 0)), *(v_new.stride()[:3] if fused else (0, 0, 0)),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        *out_strides, *lse_strides,
        block_table.stride(0) if block_table is not None else 0, cos.stride(0), sin.stride(0), stride_alibi_b,
        seqlen_q, seqlen_new, nheads_k, group_size, geometry["capacity"], geometry["batch_cache"],
        geometry["num_blocks"], geometry["page_size"], rotary_dim, seqlen_ro, num_splits,
        HEAD_DIM=head_dim, BLOCK_D=configs.padded_head_dim(head_dim), BLOCK_M=config.block_m,
        BLOCK_N=config.block_n, PAGED=block_table is not None, ONE_PAGE=one_page,
        TABLE_CHUNK=configs.paged_table_chunk(key_blocks // num_splits) if one_page else 0,
        HAS_BATCH_IDX=cache_batch_idx is not None,
        HAS_LEFTPAD=cache_leftpad is not None, HAS_ROTARY=rotary_cos is not None,
        INTERLEAVED=rotary_interleaved, ROTARY_PER_TOKEN=opts.masked, HAS_ALIBI=has_alibi,
        num_warps=config.num_warps, num_stages=config.num_stages, **scalars, **dot_flags(q.dtype),
        FUSE_APPEND=fused, NEW_KEYS=configs.next_power_of_2(seqlen_new) if fused else 1, RECORD_FAULTS=record_faults,
        **_chain_arguments(q.device),
    )
    if num_splits > 1:
        launch_combine(out_target, lse_target, out, lse)
    return out, lse


def decode_outputs_like(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Empty (out, lse) of a decode step's shapes: out like q (B, Sq, H, D), lse float32 (B, H, Sq)."""
    batch, seqlen_q, nheads, _ = q.shape
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    return out, q.new_empty((batch, nheads, seqlen_q), dtype=torch.float32)



def launch_combine(out_partial, lse_partial, out=None, lse=None, chained: bool = True):
    """(out, lse) merged from the splits' partials by their log-sum-exps, launched chained (``chained_launch``) unless
    ``chained`` is False."""
    from ..kernels.combine import combine_kernel

    out_partial = last_dim_contiguous(out_partial)
    num_splits, batch, seqlen, nheads, head_dim = out_partial.shape
    if out is None:
        out = torch.empty(out_partial.shape[1:], dtype=out_partial.dtype, device=out_partial.device)
    if lse is None:
        lse = torch.empty(batch, nheads, seqlen, dtype=lse_partial.dtype, device=lse_partial.device)
    block_d = configs.padded_head_dim(head_dim)
    tiles = configs.combine_tiles(num_splits, batch * seqlen * nheads, block_d, processor_count(out_partial.device),
                          interpreting())
    grid = (cdiv(seqlen * nheads, tiles.block_m), batch, block_d // tiles.chunk_d)
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


def launch_combine_backward(dout, dlse, out_partial, lse_partial):
    """(dout_partial, dlse_partial): the merge's gradient, from the weights recomputed out of lse_partial."""
    from ..kernels.combine import combine_backward_kernel

    dout, out_partial = last_dim_contiguous(dout), last_dim_contiguous(out_partial)
    num_splits, batch, seqlen, nheads, head_dim = out_partial.shape
    dout_partial = torch.empty_like(out_partial, memory_format=torch.contiguous_format)
    dlse_partial = torch.empty_like(lse_partial, memory_format=torch.contiguous_format)
    block_m, split_block = configs.combine_backward_tiles(num_splits, interpreting())
    launch(
        combine_backward_kernel, (cdiv(seqlen * nheads, block_m), batch),
        dout, dlse, out_partial, lse_partial, dout_partial, dlse_partial,
        *dout.stride()[:3], *dlse.stride(),
        *out_partial.stride()[:4], *lse_partial.stride(),
        *dout_partial.stride()[:4], *dlse_partial.stride(),
        num_splits, seqlen, nheads,
        HEAD_DIM=head_dim, BLOCK_D=configs.padded_head_dim(head_dim), BLOCK_M=block_m,
        SPLIT_BLOCK=split_block,
    )
    return dout_partial, dlse_partial

