"""The Triton kernels against the float64 reference.

On a machine without a GPU they run under Triton's interpreter on small shapes; on the GPU machine
the same tests run on CUDA, and the ``gpu``-marked ones add the large shapes.
"""

import contextlib

import pytest
import torch
from cases import (
    DTYPES,
    GPU_SHAPES,
    INTERPRETER_SHAPES,
    OPTIONS,
    assert_unchanged_by_nan,
    covering,
    has_tma,
    heavy_reference,
    make_case,
    one_at_a_time,
    second_sequence_nan,
)

from flashattn import flash_attn_func
from flashattn.configs import TileConfig, use_config
from flashattn.testing import check_against_reference


# Pairwise, not the cartesian product (cases.covering): each option on every shape (head dims padded to 64, 128
# and 256, one query, ragged blocks, GQA) and in every dtype (the float32 compensated sums, fp16, bf16 upcast dots)
@pytest.mark.interpreter
@pytest.mark.parametrize("shape,option_name,dtype", covering(INTERPRETER_SHAPES, list(OPTIONS), DTYPES), ids=str)
def test_kernels_match_reference(triton_backend, shape, option_name, dtype):
    case = make_case(shape, option_name, triton_backend)
    check_against_reference(case, dtype, triton_backend, flash_attn_func)


@pytest.mark.gpu
# float32 over 2^25 scores and more: references of several GB, one at a time
@pytest.mark.parametrize("shape,option_name,dtype", one_at_a_time(
    covering(GPU_SHAPES, list(OPTIONS), DTYPES),
    lambda shape, option_name, dtype: heavy_reference(dtype, shape[3], shape[1], shape[2], batch=shape[0])),
    ids=str)
def test_kernels_match_reference_large(triton_backend, shape, option_name, dtype):
    case = make_case(shape, option_name, "cuda")
    check_against_reference(case, dtype, "cuda", flash_attn_func)
    torch.cuda.synchronize()


# The paths through TMA tensor descriptors: the forward's Q/K/V/O, and the dQ kernel's K and V (the table's hdim-256
# entries; `+tma` in sweeps). The interpreter runs descriptor loads and stores (zero fill past the edges, dropped
# stores), which checks the kernels' indexing and edge handling without a GPU; on the GPU the same tests compile them
# with tiles the hardware takes. One call takes both: the dQ kernel reads O and the LSE, whichever forward made them.
# The dQ kernel's TMA loads are 16-bit only (fp32 keeps pointer loads in the backward, launch_backward.launch_backward):
# the float16 cases check them, each option once, the two shapes taking turns. The dK/dV kernel's TMA forms are in
# test_dkdv_loops.
@pytest.mark.interpreter
@pytest.mark.parametrize("option_name,shape,dtype", covering(
    ["plain", "causal", "window", "dropout", "causal-alibi-softcap"], INTERPRETER_SHAPES[1:3],
    [torch.float32, torch.float16]), ids=str)
def test_tma_forward_and_dq_match_reference(triton_backend, shape, option_name, dtype):
    if not has_tma(triton_backend):
        pytest.skip("TMA needs sm90 or newer")
    forward_tiles, dq_tiles = [(32, 32, 1, 1)] * 2 if triton_backend == "cpu" else [(64, 64, 4, 2), (128, 64, 8, 3)]
    case = make_case(shape, option_name, triton_backend)
    # a float32 call takes the table's dQ tile (its pointer loads do not fit the 16-bit 128 x 64 tile's shared memory)
    dq_tile = use_config("dq", TileConfig(*dq_tiles, tma=True)) if dtype != torch.float32 else contextlib.nullcontext()
    with use_config("forward", TileConfig(*forward_tiles, tma=True)), dq_tile:
        check_against_reference(case, dtype, triton_backend, flash_attn_func)


def _next_sequence_nan_stays_out(device, tile, head_dim, causal):
    """A dense and a packed forward of two sequences whose second holds inf keys and NaN values: the first's output
    is what it is alone. And a dense forward on the first 50 tokens of 63-token buffers whose last 13 hold inf keys
    and NaN values (a batch stride that skips rows, read in place: launch.common.rows_readable): what it is on a
    contiguous copy."""
    from flashattn import flash_attn_varlen_func

    q, k, v = (torch.randn(2, 50, 2, head_dim, device=device, dtype=torch.float16) for _ in range(3))
    k[1], v[1] = float("inf"), float("nan")
    packed = [x.flatten(0, 1)[:87].clone() for x in (q, k, v)]  # sequences of 37 and 50 tokens
    packed[1][37:], packed[2][37:] = float("inf"), float("nan")
    cu = torch.tensor([0, 37, 87], device=device, dtype=torch.int32)
    with use_config("forward", tile) if tile is not None else contextlib.nullcontext():
        dense = flash_attn_func(q, k, v, causal=causal)[0]
        varlen = flash_attn_varlen_func(*packed, cu, cu, 50, 50, causal=causal)[:37]
        alone = flash_attn_func(q[:1], k[:1], v[:1], causal=causal)[0]
        packed_alone = flash_attn_func(*(x[None, :37] for x in packed), causal=causal)[0]
        clean = [torch.randn(2, 50, 2, head_dim, device=device, dtype=torch.float16) for _ in range(3)]
        buffers = [torch.full((2, 63, 2, head_dim), fill, device=device, dtype=torch.float16)
                   for fill in (1.0, float("inf"), float("nan"))]
        for buffer, x in zip(buffers, clean, strict=True):
            buffer[:, :50] = x
        sliced = flash_attn_func(*(buffer[:, :50] for buffer in buffers), causal=causal)
        copied = flash_attn_func(*clean, causal=causal)
    torch.testing.assert_close(sliced, copied, atol=0, rtol=0,
                               msg=f"slices of longer buffers, head dim {head_dim}, tile {tile}, causal {causal}")
    for name, out, expected in (("dense", dense, alone), ("varlen", varlen, packed_alone)):
        assert torch.isfinite(out).all(), f"{name}, head dim {head_dim}, tile {tile}, causal {causal}"
        torch.testing.assert_close(out, expected, atol=0, rtol=0)


# A tile at a sequence's end reaches past it: a NaN in the next sequence (an uninitialized buffer, a diverged sample)
# must stay out of this sequence's output through the TMA tiles, dense and packed, head dims with and without padding.
@pytest.mark.interpreter
def test_forward_keeps_the_next_sequences_nan_out(triton_backend):
    tile = TileConfig(32, 32, 1, 1, tma=True) if triton_backend == "cpu" else TileConfig(64, 64, 4, 2, tma=True)
    for head_dim in (64, 40, 128):
        for causal in (False, True):
            _next_sequence_nan_stays_out(triton_backend, tile, head_dim, causal)


# The Hopper forward reads dense K and V through (batch, seqlen, heads x head dim) descriptors, whose copies read zeros
# past the sequence, and packed ones over the tokens: there its loader zeroes the values past the sequence in a block
# that runs over its end (kernels/forward_hopper.py, load_key_block_within).
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                    reason="the Hopper forward needs sm90")
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_hopper_forward_keeps_the_next_sequences_nan_out(head_dim):
    for causal in (False, True):
        _next_sequence_nan_stays_out("cuda", None, head_dim, causal)


# The backward's tiles reach past a sequence too (the key tiles' query rows, the dQ's keys): a NaN in the next
# sequence's inputs or output gradient must leave this sequence's gradients as they are with finite neighbours.
# Dense calls at hdim 256 below 1k and from 1k at every head dim take the Hopper dK/dV kernels; from 1k the
# non-deterministic calls take the fused dK/dV/dQ kernel, whose dQ adds float32 partial sums in whatever order the key
# tiles finish: between two calls that dQ may differ by a bf16 unit of its largest values.
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("head_dim, seqlen", [(64, 300), (128, 300), (256, 300), (64, 1000), (128, 1000)])
@pytest.mark.parametrize("deterministic", [False, True])
def test_backward_keeps_the_next_sequences_nan_out(head_dim, seqlen, deterministic):
    from flashattn import flash_attn_varlen_func

    first = seqlen - 63  # packed: sequences of seqlen - 63 and seqlen + 63
    for causal in (False, True):
        q, k, v, dout = (torch.randn(2, seqlen, 2, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        cu = torch.tensor([0, first, 2 * seqlen], device="cuda", dtype=torch.int32)
        grads = {}
        for poisoned in (False, True):
            inputs = second_sequence_nan((q, k, v, dout), poisoned)
            leaves = [x.clone().requires_grad_() for x in inputs[:3]]
            dense = flash_attn_func(*leaves, causal=causal, deterministic=deterministic)
            dense_grads = torch.autograd.grad(dense, leaves, inputs[3])
            packed = [x.flatten(0, 1).clone() for x in inputs]
            if poisoned:
                for x in packed:
                    x[first:] = float("nan")
            leaves = [x.clone().requires_grad_() for x in packed[:3]]
            varlen = flash_attn_varlen_func(*leaves, cu, cu, seqlen + 63, seqlen + 63, causal=causal,
                                            deterministic=deterministic)
            varlen_grads = torch.autograd.grad(varlen, leaves, packed[3])
            grads[poisoned] = ([g[0] for g in dense_grads], [g[:first] for g in varlen_grads])
        for form, index in (("dense", 0), ("varlen", 1)):
            for name, clean, poisoned in zip(("dq", "dk", "dv"), grads[False][index], grads[True][index], strict=True):
                assert_unchanged_by_nan(f"{form} {name}, head dim {head_dim}, causal {causal}", clean, poisoned,
                                        exact=deterministic or name != "dq")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_one_query_causal_backward_at_hdim_64():
    """One query row, causal: Triton makes seqlen_q a constant, on which ptxas died compiling the peeled hdim-64
    dK/dV kernel (launch_backward.dkdv_compilable)."""
    check_against_reference(make_case((1, 1, 700, 4, 4, 64), "causal", "cuda"), torch.bfloat16, "cuda",
                            flash_attn_func)
