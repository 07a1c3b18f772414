"""Packed (varlen) attention against the per-sequence float64 reference, and its API.

The CPU path (torch backend) and the Triton kernels (the interpreter without a GPU) run small cases;
the ``gpu``-marked grid adds long sequences. Sequence lengths include 0 and 1 on either side.
"""

import numpy as np
import pytest
import torch
from cases import COMPILE_BACKEND, DTYPES, OPTIONS, covering, heavy_varlen_reference, make_varlen_case, one_at_a_time

from flashattn import (
    flash_attn_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
)
from flashattn.reference import varlen_attention_ref
from flashattn.testing import VarlenCase, check_varlen_against_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# (seqlens_q, seqlens_k, nheads, nheads_k, head_dim): empty and one-token sequences on both sides,
# queries that see no key, keys that no query sees, Sq > Sk and Sq < Sk within one batch
CPU_SHAPES = [
    ((0, 1, 37, 113), (5, 1, 0, 203), 4, 2, 40),
    ((64, 64, 64), (64, 64, 64), 2, 2, 64),
    ((1, 1, 1), (1, 7, 130), 2, 1, 96),
    ((200, 3, 77), (150, 90, 77), 3, 1, 128),
]
INTERPRETER_SHAPES = [
    ((0, 1, 20, 33), (7, 0, 20, 17), 2, 1, 40),
]
GPU_SHAPES = [
    ((0, 1, 2048, 517, 1000, 1, 64, 1999), (0, 1, 2048, 517, 1000, 1, 64, 1999), 8, 2, 128),
    ((113, 0, 1023, 1024, 7), (203, 50, 1024, 1023, 0), 4, 4, 64),
    ((1, 333, 1500, 2047), (1700, 1, 1500, 900), 6, 2, 96),
    ((256, 129, 0, 77), (256, 300, 5, 40), 2, 1, 256),
]


# ---------------------------------------------------------------------------------------------
# Against the per-sequence reference
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape,option_name,dtype", covering(CPU_SHAPES, list(OPTIONS), DTYPES), ids=str)
def test_torch_path_matches_reference(torch_backend, shape, option_name, dtype):
    check_varlen_against_reference(make_varlen_case(shape, option_name, "cpu"), dtype, "cpu")


# Each option once, the dtypes taking turns: the packed kernels are the dense ones with IS_VARLEN, and
# tests/test_kernels.py meets every option in every dtype; this pairs IS_VARLEN with each option and each dtype.
@pytest.mark.interpreter
@pytest.mark.parametrize("shape,option_name,dtype", [
    (shape, option_name, DTYPES[i % len(DTYPES)])
    for shape in INTERPRETER_SHAPES for i, option_name in enumerate(OPTIONS)], ids=str)
def test_kernels_match_reference(triton_backend, shape, option_name, dtype):
    check_varlen_against_reference(make_varlen_case(shape, option_name, triton_backend), dtype, triton_backend)


@pytest.mark.interpreter
@pytest.mark.parametrize("option_name", ["plain", "causal", "window-dropout-scale"])
def test_kernels_tile_aligned_sequences(triton_backend, option_name):
    # sequence boundaries on tile edges (16 under the interpreter): interior blocks with no masks at all
    shape = ((16, 32), (32, 16), 2, 2, 96)
    check_varlen_against_reference(make_varlen_case(shape, option_name, triton_backend), torch.float16,
                                   triton_backend)


@pytest.mark.gpu
# float32 with long sequences: per-sequence references of several GB, one at a time
@pytest.mark.parametrize("shape,option_name,dtype", one_at_a_time(
    covering(GPU_SHAPES, list(OPTIONS), DTYPES),
    lambda shape, option_name, dtype: heavy_varlen_reference(shape, dtype)), ids=str)
def test_kernels_match_reference_large(triton_backend, shape, option_name, dtype):
    check_varlen_against_reference(make_varlen_case(shape, option_name, "cuda"), dtype, "cuda")
    torch.cuda.synchronize()


# ---------------------------------------------------------------------------------------------
# The API: max_seqlen forms, packed forms, lse layout, empty sequences, dropout, determinism
# ---------------------------------------------------------------------------------------------


def test_max_seqlen_as_tensor_or_larger_bound(backend):
    case = VarlenCase((5, 0, 23), (9, 4, 23), 2, 1, 32, {"causal": True})
    check_varlen_against_reference(case, torch.float32, DEVICE, max_seqlens=(torch.tensor(23), torch.tensor(23)))
    # a loose bound launches extra query/key blocks, which exit at once
    check_varlen_against_reference(case, torch.float32, DEVICE, max_seqlens=(70, 50))


def test_max_seqlen_takes_numpy_integers(torch_backend):
    """As flash-attn's int parameters do: a collator's numpy maximum is an integer, not a type error."""
    case = VarlenCase((5, 0, 23), (9, 4, 23), 2, 1, 32, {"causal": True})
    check_varlen_against_reference(case, torch.float32, DEVICE, max_seqlens=(np.int64(23), np.int32(23)))


def test_equal_lengths_match_the_dense_function(backend):
    batch, seqlen = 3, 29
    q, k, v = (torch.randn(batch, seqlen, 4, 32, device=DEVICE) for _ in range(3))
    dense = flash_attn_func(q, k, v, causal=True, window_size=(9, -1))
    cu_seqlens = torch.arange(0, (batch + 1) * seqlen, seqlen, dtype=torch.int32, device=DEVICE)
    packed = flash_attn_varlen_func(*(x.flatten(0, 1) for x in (q, k, v)), cu_seqlens, cu_seqlens, seqlen, seqlen,
                                    causal=True, window_size=(9, -1))
    if backend == "triton":
        # the very same kernel code on the very same data: only the pointer arithmetic differs
        assert torch.equal(packed, dense.flatten(0, 1))
    else:
        torch.testing.assert_close(packed, dense.flatten(0, 1), rtol=1e-5, atol=1e-6)


def test_lse_layout_and_attn_probs_convention(backend):
    case = VarlenCase((3, 0, 6), (0, 2, 6), 4, 2, 16)
    cu_q, cu_k = case.cu_seqlens(DEVICE)
    q, k, v = case.random_inputs(torch.float32, DEVICE)
    out, lse, probs = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 6, 6, return_attn_probs=True)
    assert probs is None  # flash-attn's S_dmask: flashattn never materializes the scores
    assert lse.shape == (4, 9) and lse.dtype == torch.float32  # (nheads, total_q)
    _, expected_lse = varlen_attention_ref(q, k, v, cu_q, cu_k)
    torch.testing.assert_close(lse.double(), expected_lse, atol=1e-5, rtol=1e-6)
    # the first sequence's 3 queries see no key: out 0, lse +inf
    assert torch.equal(out[:3], torch.zeros_like(out[:3])) and torch.isinf(lse[:, :3]).all()
    assert torch.isfinite(lse[:, 3:]).all()
    assert torch.equal(flash_attn_varlen_func(q, k, v, cu_q, cu_k, 6, 6), out)


def test_empty_sequences_get_zero_gradients(backend):
    case = VarlenCase((4, 0, 1, 5), (0, 3, 1, 5), 2, 2, 16)
    cu_q, cu_k = case.cu_seqlens(DEVICE)
    q, k, v = (x.requires_grad_() for x in case.random_inputs(torch.float32, DEVICE))
    flash_attn_varlen_func(q, k, v, cu_q, cu_k, 5, 5, causal=True).sum().backward()
    assert all(torch.isfinite(x.grad).all() for x in (q, k, v))
    assert torch.equal(q.grad[:4], torch.zeros_like(q.grad[:4]))  # queries with no key
    for grad in (k.grad, v.grad):
        assert torch.equal(grad[:3], torch.zeros_like(grad[:3]))  # keys that no query sees
    assert q.grad[4:].abs().sum() > 0


def test_only_empty_sequences(backend):
    case = VarlenCase((0, 0), (4, 0), 2, 2, 16)
    cu_q, cu_k = case.cu_seqlens(DEVICE)
    q, k, v = (x.requires_grad_() for x in case.random_inputs(torch.float32, DEVICE))
    out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 0, 4, return_attn_probs=True)
    assert out.shape == (0, 2, 16) and lse.shape == (2, 0)
    out.sum().backward()
    assert torch.equal(k.grad, torch.zeros_like(k))


def test_qkvpacked_and_kvpacked_match_unpacked(backend):
    case = VarlenCase((7, 1, 30), (7, 1, 30), 4, 4, 32)
    cu_seqlens, _ = case.cu_seqlens(DEVICE)
    qkv = torch.randn(38, 3, 4, 32, device=DEVICE, requires_grad=True)
    out = flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, 30, causal=True)
    expected, _ = varlen_attention_ref(*qkv.detach().unbind(1), cu_seqlens, cu_seqlens, causal=True)
    torch.testing.assert_close(out.double(), expected, atol=2e-5, rtol=1e-5)
    out.sum().backward()
    assert qkv.grad.shape == qkv.shape and torch.isfinite(qkv.grad).all()

    q = torch.randn(38, 6, 32, device=DEVICE)
    kv = torch.randn(38, 2, 2, 32, device=DEVICE)
    out = flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens, cu_seqlens, 30, 30, window_size=(4, 2))
    expected, _ = varlen_attention_ref(q, kv[:, 0], kv[:, 1], cu_seqlens, cu_seqlens, window_size=(4, 2))
    torch.testing.assert_close(out.double(), expected, atol=2e-5, rtol=1e-5)


def test_strided_inputs_are_read_in_place(backend):
    # heads sliced out of a wider tensor: the token stride is not nheads * headdim
    case = VarlenCase((12, 0, 19), (20, 6, 19), 2, 2, 24, {"causal": True})
    wide = [torch.randn(n, 5, 24, device=DEVICE) for n in (31, 45, 45)]
    inputs = tuple(x[:, 1:3] for x in wide)
    assert not inputs[0].is_contiguous()
    check_varlen_against_reference(case, torch.float32, DEVICE, inputs=inputs)


def test_deterministic_backward_is_bitwise_repeatable(backend):
    if backend == "triton" and DEVICE == "cpu":
        pytest.skip("the interpreter runs one program at a time: only the GPU's schedule could make a repeat differ")
    case = VarlenCase((20, 45), (33, 45), 4, 2, 32)
    cu_q, cu_k = case.cu_seqlens(DEVICE)
    inputs = case.random_inputs(torch.float32, DEVICE)

    def grads():
        leaves = [x.detach().clone().requires_grad_() for x in inputs]
        flash_attn_varlen_func(*leaves, cu_q, cu_k, 45, 45, causal=True, deterministic=True).sum().backward()
        return [x.grad for x in leaves]

    for a, b in zip(grads(), grads(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.interpreter
def test_dropout_is_seeded_and_the_same_stream_on_both_backends(monkeypatch):
    case = VarlenCase((9, 0, 17), (11, 5, 17), 2, 1, 16)
    cu_q, cu_k = case.cu_seqlens(DEVICE)
    q, k, v = case.random_inputs(torch.float32, DEVICE)
    outputs = {}
    for backend in ("torch", "triton"):
        monkeypatch.setenv("FLASHATTN_BACKEND", backend)
        torch.manual_seed(3)
        outputs[backend] = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 17, 17, dropout_p=0.4)
        if backend == "torch":
            torch.manual_seed(3)
            assert torch.equal(flash_attn_varlen_func(q, k, v, cu_q, cu_k, 17, 17, dropout_p=0.4), outputs[backend])
            assert not torch.equal(flash_attn_varlen_func(q, k, v, cu_q, cu_k, 17, 17, dropout_p=0.4),
                                   outputs[backend])
    # the same scores are dropped: the outputs differ only by rounding
    torch.testing.assert_close(outputs["torch"], outputs["triton"], atol=1e-6, rtol=1e-5)


def _compiled_loss(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k):
    out = flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=True,
                                 window_size=(7, -1))
    return (out**2).sum()


@pytest.mark.parametrize("max_as", ["int", "tensor"])
def test_fullgraph_compile_matches_eager_without_recompiles(torch_backend, max_as):
    # imported here: torch._dynamo.testing adds seconds to torch._dynamo's import, and every pytest-xdist worker
    # collects this module
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    counter = CompileCounterWithBackend(COMPILE_BACKEND)
    compiled = torch.compile(_compiled_loss, fullgraph=True, dynamic=True, backend=counter)
    frames_after_first = None
    for seqlens in ((5, 30, 0, 12), (17, 1, 40, 3), (8, 8, 8, 60)):
        case = VarlenCase(seqlens, seqlens, 4, 2, 32)
        cu_seqlens, _ = case.cu_seqlens("cpu")
        # a tensor max is what a compiled model has: cu_seqlens.diff().max() without .item()
        longest = cu_seqlens.diff().max() if max_as == "tensor" else 64
        leaves = [x.requires_grad_() for x in case.random_inputs(torch.float32, "cpu")]
        eager_leaves = [x.detach().clone().requires_grad_() for x in leaves]
        compiled(*leaves, cu_seqlens, cu_seqlens, longest, longest).backward()
        _compiled_loss(*eager_leaves, cu_seqlens, cu_seqlens, longest, longest).backward()
        for a, b in zip(leaves, eager_leaves, strict=True):
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6)
        frames_after_first = frames_after_first or counter.frame_count
        assert counter.frame_count == frames_after_first, f"recompiled for seqlens {seqlens}"


# ---------------------------------------------------------------------------------------------
# Bad input: each error names the argument
# ---------------------------------------------------------------------------------------------


def _int32(values):
    return torch.tensor(values, dtype=torch.int32)


GOOD = dict(cu_seqlens_q=_int32([0, 3, 8]), cu_seqlens_k=_int32([0, 4, 10]), max_seqlen_q=5, max_seqlen_k=6)

BAD_INPUTS = [
    ("decreasing", dict(cu_seqlens_q=_int32([0, 6, 5]), max_seqlen_q=6), ValueError,
     "cu_seqlens_q must be non-decreasing"),
    ("not-from-0", dict(cu_seqlens_k=_int32([2, 4, 10])), ValueError, "cu_seqlens_k must start at 0"),
    ("dtype", dict(cu_seqlens_q=torch.tensor([0, 3, 8])), TypeError, "cu_seqlens_q must have dtype torch.int32"),
    ("rank", dict(cu_seqlens_k=_int32([[0, 4, 10]])), ValueError, r"cu_seqlens_k must have shape \(batch \+ 1,\)"),
    ("no-batch", dict(cu_seqlens_q=_int32([0]), cu_seqlens_k=_int32([0])), ValueError, "cu_seqlens_q must have shape"),
    ("length-vs-batch", dict(cu_seqlens_k=_int32([0, 4, 6, 10])), ValueError,
     "cu_seqlens_k must have cu_seqlens_q's length batch \\+ 1 = 3"),
    ("alibi-batch", dict(alibi_slopes=torch.ones(3, 4)), ValueError,
     r"alibi_slopes must have shape \(4,\) or \(2, 4\)"),
    ("total-q", dict(cu_seqlens_q=_int32([0, 3, 7]), max_seqlen_q=4), ValueError,
     r"cu_seqlens_q must end at the number of tokens, q.shape\[0\] = 8, got 7"),
    ("total-k", dict(cu_seqlens_k=_int32([0, 4, 11]), max_seqlen_k=7), ValueError,
     r"cu_seqlens_k must end at the number of tokens, k.shape\[0\] = 10"),
    ("max-q-small", dict(max_seqlen_q=4), ValueError, "max_seqlen_q must be at least the longest sequence's length 5"),
    ("max-k-small", dict(max_seqlen_k=5), ValueError, "max_seqlen_k must be at least the longest sequence's length 6"),
    ("max-negative", dict(max_seqlen_k=-1), ValueError, r"max_seqlen_k must be in \[0, 2\*\*31\)"),
    ("max-huge", dict(max_seqlen_q=2**70), ValueError, r"max_seqlen_q must be in \[0, 2\*\*31\)"),
    ("max-type", dict(max_seqlen_q=5.0), TypeError, "max_seqlen_q must be an int or a 0-d integer tensor"),
    ("max-float-tensor", dict(max_seqlen_k=torch.tensor(6.0)), TypeError, "max_seqlen_k must be an int or a 0-d"),
    ("q-rank", dict(q=torch.randn(1, 8, 4, 16)), ValueError, r"q must have 3 dimensions \(total_tokens, nheads"),
    ("dropout", dict(dropout_p=1.0), ValueError, "dropout_p"),
]


@pytest.mark.parametrize("name,changes,error,message", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_is_refused_with_a_clear_error(torch_backend, name, changes, error, message):
    args = dict(q=torch.randn(8, 4, 16), k=torch.randn(10, 2, 16), v=torch.randn(10, 2, 16), **GOOD)
    args.update(changes)
    with pytest.raises(error, match=message):
        flash_attn_varlen_func(**args)


def test_packed_forms_check_their_layout():
    cu_seqlens = _int32([0, 4])
    with pytest.raises(ValueError, match="qkv must have shape"):
        flash_attn_varlen_qkvpacked_func(torch.randn(4, 2, 2, 8), cu_seqlens, 4)
    with pytest.raises(ValueError, match="kv must have shape"):
        flash_attn_varlen_kvpacked_func(torch.randn(4, 2, 8), torch.randn(4, 3, 2, 8), cu_seqlens, cu_seqlens, 4, 4)


@pytest.mark.gpu
def test_cu_seqlens_on_another_device_is_refused():
    q = torch.randn(8, 2, 16, device="cuda")
    with pytest.raises(ValueError, match="cu_seqlens_q must be on q's device"):
        flash_attn_varlen_func(q, q, q, _int32([0, 8]), _int32([0, 8]).cuda(), 8, 8)
