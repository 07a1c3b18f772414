"""FP8 (e4m3) inputs: the quantizer, the checks, the PyTorch path against the float64 reference of the dequantized
inputs, and the Triton kernel (the interpreter on tiny shapes, the GPU on awkward ones) within the FP8 rule
(``testing.assert_fp8_within_rule``: at most twice the error of the emulated kernel arithmetic)."""

import inspect
import math
from types import SimpleNamespace

import pytest
import torch

from flashattn import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache, fp8
from flashattn.fp8_format import E4M3_MAX, SCALE_BLOCK
from flashattn.fp8_quantize import quantize_tensor
from flashattn.reference import attention_ref
from flashattn.testing import (
    assert_fp8_within_rule,
    assert_within_rule,
    fp8_emulated_attention,
    page_keys,
    rounding_error,
)


def make_inputs(batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, device="cpu", outliers=False, seed=0):
    generator = torch.Generator().manual_seed(seed)
    shapes = ((batch, seqlen_q, nheads, head_dim), (batch, seqlen_k, nheads_k, head_dim),
              (batch, seqlen_k, nheads_k, head_dim))
    tensors = []
    for shape in shapes:
        x = torch.randn(shape, generator=generator)
        if outliers:
            x += 10 * torch.randn(shape, generator=generator) * (torch.rand(shape, generator=generator) < 1e-3)
        tensors.append(x.to(device))
    return tensors


def dequantized(quantized: fp8.Quantized):
    return tuple(fp8.dequantize(x, d, torch.float64) for x, d in zip(quantized[:3], quantized[3:], strict=True))


def descale_kwargs(quantized: fp8.Quantized) -> dict:
    return dict(q_descale=quantized.q_descale, k_descale=quantized.k_descale, v_descale=quantized.v_descale)


# -- the quantizer --


@pytest.mark.parametrize("head_dim", [1, 40, 64, 96, 256])
def test_rotation_is_orthogonal(head_dim):
    signs = fp8.random_signs(head_dim, seed=3, device=torch.device("cpu"))
    matrix = fp8.rotate(torch.eye(head_dim, dtype=torch.float64), signs)
    assert torch.allclose(matrix @ matrix.T, torch.eye(head_dim, dtype=torch.float64), atol=1e-12)
    assert sum(fp8.hadamard_pieces(head_dim)) == head_dim


def test_seeded_signs_repeat_and_differ_between_seeds():
    """A seed's signs are a fixed function of it (the same on any device and in any process); seeds that differ by a
    bit, or are one 64-bit value written signed and unsigned, give other and the same signs; about half are -1."""
    cpu = torch.device("cpu")
    one = fp8.random_signs(256, seed=7, device=cpu)
    assert torch.equal(one, fp8.random_signs(256, seed=7, device=cpu))
    assert set(one.tolist()) == {-1.0, 1.0} and one.dtype == torch.float32
    assert 96 < int((one < 0).sum()) < 160  # a fair coin's 256 flips: 128 +- 32 at four sigma
    assert not torch.equal(one, fp8.random_signs(256, seed=6, device=cpu))
    assert torch.equal(fp8.random_signs(64, seed=-1, device=cpu), fp8.random_signs(64, seed=2**64 - 1, device=cpu))
    assert torch.equal(one[:40], fp8.random_signs(40, seed=7, device=cpu))  # a stream: head dims share a prefix
    torch.manual_seed(11)
    drawn = fp8.random_signs(128, seed=None, device=cpu)
    torch.manual_seed(11)
    assert torch.equal(drawn, fp8.random_signs(128, seed=None, device=cpu))


def test_rotation_spreads_an_outlier_channel():
    x = torch.zeros(1, 1, 1, 128, dtype=torch.float64)
    x[..., 5] = 1.0
    rotated = fp8.rotate(x, fp8.random_signs(128, seed=0, device=torch.device("cpu")))
    assert torch.allclose(rotated.abs(), torch.full_like(rotated, 128 ** -0.5))


def test_packed_quantize_is_each_sequences_own(torch_backend):
    """Packed inputs take one descale per sequence and kv head: the same bytes and descales as quantizing each
    sequence alone, and flash_attn_varlen_func on them is each sequence's attention of its dequantized inputs."""
    lengths_q, lengths_k = (5, 0, 17), (9, 4, 30)
    sequences = [make_inputs(1, sq, sk, 4, 2, 40, seed=i)
                 for i, (sq, sk) in enumerate(zip(lengths_q, lengths_k, strict=True))]
    packed = [torch.cat([x[i][0] for x in sequences]) for i in range(3)]
    cu_q, cu_k = (torch.tensor([0, *torch.tensor(n).cumsum(0).tolist()], dtype=torch.int32)
                  for n in (lengths_q, lengths_k))
    quantized = fp8.quantize(*packed, seed=2, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    assert quantized.q_descale.shape == quantized.v_descale.shape == (3, 2)
    out = flash_attn_varlen_func(*quantized[:3], cu_q, cu_k, max(lengths_q), max(lengths_k), causal=True,
                                 **descale_kwargs(quantized))
    for b, x in enumerate(sequences):
        alone = fp8.quantize(*x, seed=2, granularity="head")
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        for got, want, span in zip(quantized[:3], alone[:3], (rows, keys, keys), strict=True):
            assert torch.equal(got[span].view(torch.uint8), want[0].view(torch.uint8))
        for got, want in zip(quantized[3:], alone[3:], strict=True):
            assert torch.equal(got[b], want[0])
        if lengths_q[b]:
            oracle, _ = attention_ref(*dequantized(alone), causal=True)
            error = (out[rows][None].double() - oracle).abs().max().item()
            assert error <= 2 * rounding_error(oracle, torch.bfloat16) + 1e-5, f"sequence {b}: {error:.3e}"
    with pytest.raises(ValueError, match="cu_seqlens_k"):
        fp8.quantize(*packed, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k[:-1])
    with pytest.raises(ValueError, match="3-dim"):
        fp8.quantize(*sequences[0], cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)


@pytest.mark.parametrize("granularity", ["block", "head"])
def test_quantize_shapes_and_steps(granularity):
    q, k, v = make_inputs(2, 300, 200, 4, 2, 64)
    quantized = fp8.quantize(q, k, v, hadamard=False, granularity=granularity)
    assert all(x.dtype == torch.float8_e4m3fn for x in quantized[:3])
    blocks = {"block": ((2, 2, 3), (2, 2, 2)), "head": ((2, 2), (2, 2))}[granularity]
    assert quantized.q_descale.shape == blocks[0] and quantized.k_descale.shape == blocks[1]
    assert quantized.v_descale.shape == blocks[1]
    for original, back in zip((q, k, v), dequantized(quantized), strict=True):
        # a scale of amax / 448 puts each block's amax on e4m3's largest value: relative steps of 2^-4 at most
        scale_max = original.abs().max().item() / fp8.E4M3_MAX
        error = (back - original.double()).abs()
        assert (error <= original.double().abs() * 2**-4 + scale_max * 2**-9).all()


def test_hadamard_lowers_the_error_of_an_outlier_channel():
    # a channel that is large in both q and k (LLMs' outlier features): its products dominate the scores and their
    # rounding, until the rotation spreads it over every channel
    q, k, v = make_inputs(1, 256, 256, 2, 2, 128)
    q[..., 5] += 20.0
    k[..., 5] += 20.0
    scores = q.double()[0, :, 0] @ k.double()[0, :, 0].T

    def score_error(hadamard):
        dq, dk, _ = dequantized(fp8.quantize(q, k, v, hadamard=hadamard, seed=1))
        return (dq[0, :, 0] @ dk[0, :, 0].T - scores).pow(2).mean().sqrt().item()

    assert score_error(True) < 0.5 * score_error(False)


# -- the checks --


QKV_DENSE = ((2, 8, 4, 16), (2, 8, 2, 16), (2, 8, 2, 16))
QKV_PACKED = ((10, 4, 16), (10, 2, 16), (10, 2, 16))


@pytest.mark.parametrize("shapes,options,error,match", [
    (((2, 8, 4, 16), (2, 8, 2, 16), (2, 4, 2, 16)), {}, ValueError, "k and v must have the same shape"),
    (((2, 8, 4, 16), (2, 8, 2, 16), (3, 8, 2, 16)), {}, ValueError, "k and v must have the same shape"),
    (((2, 8, 4, 16), (2, 8, 2, 16), (2, 8, 4, 16)), {}, ValueError, "k and v must have the same shape"),
    (((2, 8, 4, 16), (2, 8, 2, 16), (2, 8, 2, 32)), {"hadamard": False}, ValueError, "k and v must have the same"),
    (((2, 8, 4, 16), (3, 8, 2, 16), (3, 8, 2, 16)), {}, ValueError, "k must have q's batch size 2, got 3"),
    (((2, 8, 4, 32), (2, 8, 2, 16), (2, 8, 2, 16)), {"hadamard": False}, ValueError, "k and v must have q's head dim"),
    (((2, 8, 4, 16), (2, 8, 3, 16), (2, 8, 3, 16)), {}, ValueError, r"heads in q \(4\) .* heads in k \(3\)"),
    (((2, 8, 2, 16), (2, 8, 4, 16), (2, 8, 4, 16)), {}, ValueError, r"heads in q \(2\) .* heads in k \(4\)"),
    (((2, 8, 4, 16), (2, 8, 0, 16), (2, 8, 0, 16)), {}, ValueError, r"heads in k \(0\)"),
    (((2, 8, 4, 0), (2, 8, 2, 0), (2, 8, 2, 0)), {}, ValueError, "q must have a head dim >= 1"),
    (QKV_DENSE, {"seed": "x"}, TypeError, "seed must be an int or None, got str"),
    (QKV_DENSE, {"seed": 1.5}, TypeError, "seed must be an int or None, got float"),
    (QKV_DENSE, {"seed": 2**64}, ValueError, "seed must be in"),
    (QKV_DENSE, {"hadamard": "no"}, TypeError, "hadamard must be a bool"),
    (QKV_DENSE, {"granularity": "row"}, ValueError, "granularity must be"),
    (QKV_PACKED, {"cu_seqlens_q": [0, 5, 9]}, ValueError, "cu_seqlens_q must end at the number of tokens"),
    (QKV_PACKED, {"cu_seqlens_q": [1, 5, 10]}, ValueError, "cu_seqlens_q must start at 0"),
    (QKV_PACKED, {"cu_seqlens_k": [0, 6, 4, 10]}, ValueError, "cu_seqlens_k must have cu_seqlens_q's length"),
    (QKV_PACKED, {"cu_seqlens_k": [0, 12, 10]}, ValueError, "cu_seqlens_k must be non-decreasing"),
    (((10, 4, 16), (10, 2, 16), (9, 2, 16)), {}, ValueError, "k and v must have the same shape"),
])
def test_quantize_checks_name_the_argument(shapes, options, error, match):
    """q, k and v against each other (the shapes the docstring gives), the options, and packed inputs' cu_seqlens as
    flash_attn_varlen_func checks them: a ValueError or TypeError naming the argument, not an error inside torch."""
    q, k, v = (torch.randn(shape) for shape in shapes)
    if len(shapes[0]) == 3:
        options = {"cu_seqlens_q": [0, 5, 10], "cu_seqlens_k": [0, 4, 10], **options}
        options = {name: torch.tensor(value, dtype=torch.int32) if name.startswith("cu_") else value
                   for name, value in options.items()}
    with pytest.raises(error, match=match):
        fp8.quantize(q, k, v, **options)


CU_5 = torch.tensor([0, 2, 5], dtype=torch.int32)


@pytest.mark.parametrize("call,error,match", [
    (lambda x: fp8.quantize_tensor(x[0], 2), ValueError, "x must be a 4-dim float tensor"),
    (lambda x: fp8.quantize_tensor(x.long(), 2), ValueError, "x must be a 4-dim float tensor"),
    (lambda x: fp8.quantize_tensor(x, 3), ValueError, "nheads_k must be a positive int that divides x's 4 heads"),
    (lambda x: fp8.quantize_tensor(x, 0), ValueError, "nheads_k must be a positive int"),
    (lambda x: fp8.quantize_tensor(x, 2.0), ValueError, "nheads_k must be a positive int"),
    (lambda x: fp8.quantize_tensor(x[..., :0], 2), ValueError, "x must have heads and a head dim"),
    (lambda x: fp8.quantize_tensor(x, 2, "row"), ValueError, "granularity must be"),
    (lambda x: fp8.quantize_packed(x, CU_5, 2), ValueError, "x must be a 3-dim float tensor"),
    (lambda x: fp8.quantize_packed(x[0], CU_5.long(), 2), TypeError, "cu_seqlens must have dtype torch.int32"),
    (lambda x: fp8.quantize_packed(x[0], CU_5[:2], 2), ValueError, "cu_seqlens must end at the number of tokens"),
    (lambda x: fp8.quantize_packed(x[0], CU_5.flip(0), 2), ValueError, "cu_seqlens must start at 0"),
    (lambda x: fp8.quantize_packed(x[0], CU_5, 8), ValueError, "nheads_k must be a positive int"),
], ids=["rank", "dtype", "heads", "zero-heads", "float-heads", "head-dim", "granularity", "packed-rank",
        "cu-dtype", "cu-end", "cu-start", "packed-heads"])
def test_quantize_one_tensor_checks_name_the_argument(call, error, match):
    """The one-tensor quantizers that ``fp8`` exports: a ValueError or TypeError naming the argument, never an error
    from inside torch or a quantization of the wrong shape."""
    with pytest.raises(error, match=match):
        call(torch.randn(2, 5, 4, 16))


def test_quantize_takes_empty_query_sequences():
    quantized = fp8.quantize(*(torch.randn(shape) for shape in ((2, 0, 4, 16), (2, 8, 2, 16), (2, 8, 2, 16))))
    assert quantized.q.shape == (2, 0, 4, 16) and quantized.q_descale.shape == (2, 2, 0)


def test_fp8_call_checks_name_the_argument():
    q, k, v = make_inputs(1, 8, 8, 2, 1, 32)
    quantized = fp8.quantize(q, k, v)
    q8, k8, v8 = quantized[:3]
    with pytest.raises(ValueError, match="dropout_p"):
        flash_attn_func(q8, k8, v8, dropout_p=0.1)
    with pytest.raises(ValueError, match="alibi_slopes"):
        flash_attn_func(q8, k8, v8, alibi_slopes=torch.ones(2))
    with pytest.raises(TypeError, match="k must be torch.float8_e4m3fn"):
        flash_attn_func(q8, k.to(torch.float8_e5m2), v8)
    with pytest.raises(TypeError, match="q_descale.*float32"):
        flash_attn_func(q8, k8, v8, q_descale=torch.ones(1, 1, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"k_descale must have shape \(1, 1\) or \(1, 1, 1\)"):
        flash_attn_func(q8, k8, v8, k_descale=torch.ones(1, 2))
    with pytest.raises(TypeError, match="apply to float8_e4m3fn inputs"):
        flash_attn_func(q, k, v, v_descale=torch.ones(1, 1))
    with pytest.raises(ValueError, match="forward only"):
        flash_attn_func(q8.detach().requires_grad_(), k8, v8)
    cu_seqlens = torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"v_descale must have shape \(1, 1\)"):
        flash_attn_varlen_func(q8[0], k8[0], v8[0], cu_seqlens, cu_seqlens, 8, 8, v_descale=torch.ones(1, 1, 1))
    with pytest.raises(ValueError, match="rotary_cos"):
        flash_attn_with_kvcache(q8, k8, v8, rotary_cos=torch.ones(8, 16), rotary_sin=torch.ones(8, 16))
    cache = torch.zeros(1, 16, 3, 32, dtype=torch.float8_e4m3fn)  # 3 kv heads beside q's 2: before the descales fold
    with pytest.raises(ValueError, match=r"key/value heads in k_cache \(3\)"):
        flash_attn_with_kvcache(q8, cache, cache.clone(), cache_seqlens=4)


# -- the PyTorch path: the dequantized inputs' attention, in float32, to bfloat16 --


@pytest.mark.parametrize("options", [{}, {"causal": True}, {"window_size": (20, 3)}, {"softcap": 4.0}], ids=str)
@pytest.mark.parametrize("granularity", ["block", "head"])
def test_torch_path_is_the_dequantized_attention(torch_backend, options, granularity):
    q, k, v = make_inputs(2, 150, 260, 4, 2, 48)
    quantized = fp8.quantize(q, k, v, seed=0, granularity=granularity)
    out = flash_attn_func(*quantized[:3], **descale_kwargs(quantized), **options)
    oracle, _ = attention_ref(*dequantized(quantized), **options)
    assert out.dtype == torch.bfloat16
    assert (out.double() - oracle).abs().max().item() <= 2 * rounding_error(oracle, torch.bfloat16) + 1e-5


def test_varlen_and_paged_keys_match_dense_calls(torch_backend):
    lengths_q, lengths_k = (5, 0, 40), (30, 7, 64)
    sequences = [make_inputs(1, sq, sk, 4, 2, 32, seed=i) for i, (sq, sk) in enumerate(zip(lengths_q, lengths_k,
                                                                                          strict=True))]
    quantized = [fp8.quantize(*s, seed=0, granularity="head") for s in sequences]
    pack = [torch.cat([x[i][0] for x in quantized]) for i in range(3)]
    descales = {name: torch.cat([getattr(x, name) for x in quantized])
                for name in ("q_descale", "k_descale", "v_descale")}
    cu_q = torch.tensor([0, *torch.tensor(lengths_q).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(lengths_k).cumsum(0).tolist()], dtype=torch.int32)
    out = flash_attn_varlen_func(*pack, cu_q, cu_k, max(lengths_q), max(lengths_k), causal=True, **descales)
    k_pages, v_pages, table = page_keys(pack[1], pack[2], cu_k, page_size=16)
    paged = flash_attn_varlen_func(pack[0], k_pages, v_pages, cu_q, cu_k, max(lengths_q), max(lengths_k),
                                   causal=True, block_table=table, **descales)
    for b, x in enumerate(quantized):
        rows = slice(cu_q[b], cu_q[b + 1])
        if rows.start == rows.stop:
            continue
        expected = flash_attn_func(*x[:3], causal=True, **descale_kwargs(x))[0]
        torch.testing.assert_close(out[rows], expected, rtol=0, atol=2**-8)
        torch.testing.assert_close(paged[rows], expected, rtol=0, atol=2**-8)


def test_kvcache_appends_e4m3_and_attends(torch_backend):
    q, k, v = make_inputs(2, 3, 50, 4, 2, 32)
    quantized = fp8.quantize(q, k, v, seed=0, granularity="head")
    k_cache = torch.zeros(2, 64, 2, 32, dtype=torch.float8_e4m3fn)
    v_cache = torch.zeros_like(k_cache)
    k_cache[:, :46], v_cache[:, :46] = quantized.k[:, :46], quantized.v[:, :46]
    out = flash_attn_with_kvcache(quantized.q, k_cache, v_cache, quantized.k[:, 46:], quantized.v[:, 46:],
                                  cache_seqlens=46, causal=True, **descale_kwargs(quantized))
    assert torch.equal(k_cache[:, :50].view(torch.uint8), quantized.k.view(torch.uint8))
    expected = flash_attn_func(*quantized[:3], causal=True, **descale_kwargs(quantized))
    torch.testing.assert_close(out, expected, rtol=0, atol=2**-8)


# Block descales take the one-pass kernel where a block's rotated rows fit its registers (launch.quantize_fp8.one_pass):
# q's group of 2 at hdim 128, of 3 (padded to 4) at hdim 40, k and v (group 1) at every width (64 by hdim 40's
# padding); q's group of 2 at hdim 256 takes the two passes, as per-head descales do (the GPU test below covers more)
@pytest.mark.interpreter
@pytest.mark.parametrize("shape,granularity,hadamard", [
    ((1, 140, 20, 4, 2, 128), "block", True),
    ((1, 77, 1, 2, 1, 96), "head", True),
    ((1, 130, 3, 1, 1, 256), "block", False),
    ((2, 5, 9, 4, 1, 40), "head", True),
    ((2, 150, 70, 6, 2, 40), "block", True),
    ((1, 257, 100, 2, 1, 256), "block", True),
], ids=str)
def test_quantizer_kernels_match_the_pytorch_quantizer(triton_backend, monkeypatch, shape, granularity, hadamard):
    """16-bit dense inputs take the quantizer's kernels (one pass or two): the PyTorch quantizer's bytes and
    descales, up to the float32 rounding of the rotation's sums (a descale's last bits; a byte where that moves a
    value across a rounding boundary)."""
    q, k, v = (x.to(torch.bfloat16).to(triton_backend) for x in make_inputs(*shape, outliers=True))
    kernels = fp8.quantize(q, k, v, hadamard=hadamard, seed=3, granularity=granularity)
    monkeypatch.setenv("FLASHATTN_BACKEND", "torch")
    reference = fp8.quantize(q, k, v, hadamard=hadamard, seed=3, granularity=granularity)
    for name in ("q", "k", "v"):
        ours, theirs = getattr(kernels, name), getattr(reference, name)
        descale, expected = getattr(kernels, f"{name}_descale"), getattr(reference, f"{name}_descale")
        assert ours.dtype == fp8.FP8_DTYPE and ours.shape == theirs.shape and descale.shape == expected.shape
        torch.testing.assert_close(descale, expected, rtol=2**-20, atol=0)
        assert (ours.view(torch.uint8) != theirs.view(torch.uint8)).float().mean().item() < 1e-3
        step = 2**-3 * fp8.dequantize(theirs, expected, torch.float64).abs() + 2**-9 * expected.max().item()
        assert ((fp8.dequantize(ours, descale, torch.float64) - fp8.dequantize(theirs, expected, torch.float64)).abs()
                <= step).all()


@pytest.mark.gpu
@pytest.mark.parametrize("granularity", ["block", "head"])
@pytest.mark.parametrize("shape", [(2, 1023, 4, 1, 64), (2, 4096, 16, 16, 128), (3, 300, 6, 2, 40)], ids=str)
def test_unrotated_quantizer_kernels_are_the_pytorch_quantizer_bit_for_bit(shape, granularity):
    """Without the rotation the quantizer's kernels and the PyTorch quantizer do the same IEEE divisions, amax / 448
    and x / descale: the same descales and bytes on the GPU, where the FP8 backward's kernels take dO from the one
    and its reference path from the other."""
    from flashattn.launch.quantize_fp8 import quantize_rows

    batch, seqlen, nheads, nheads_k, head_dim = shape
    x = make_inputs(batch, seqlen, seqlen, nheads, nheads_k, head_dim, "cuda", outliers=True)[0].to(torch.bfloat16)
    ours, descale = quantize_rows(x, None, nheads_k, SCALE_BLOCK, E4M3_MAX, granularity == "head", fp8.FP8_DTYPE)
    theirs, expected = quantize_tensor(x, nheads_k, granularity)
    assert torch.equal(descale.view(expected.shape), expected)
    assert torch.equal(ours.view(torch.uint8), theirs.view(torch.uint8))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(2, 1000, 8, 8, 128), (1, 4097, 8, 4, 128), (1, 1000, 4, 4, 256),
                                   (2, 300, 6, 2, 40), (1, 513, 8, 2, 64), (1, 700, 4, 4, 96)], ids=str)
def test_one_pass_writes_the_two_passes_bytes(triton_backend, monkeypatch, shape):
    """Block descales in one pass (block_quantize_kernel) and in two (block_amax_kernel, quantize_kernel): the same
    bytes and descales, the rotation's float32 sums taken in the same order."""
    from flashattn.launch import quantize_fp8

    batch, seqlen, nheads, nheads_k, head_dim = shape
    q, k, v = (x.to(torch.bfloat16) for x in make_inputs(batch, seqlen, seqlen, nheads, nheads_k, head_dim, "cuda",
                                                          outliers=True))
    for hadamard in (True, False):
        one = fp8.quantize(q, k, v, hadamard=hadamard, seed=5)
        with monkeypatch.context() as patch:
            patch.setattr(quantize_fp8, "one_pass", lambda width, group: False)
            two = fp8.quantize(q, k, v, hadamard=hadamard, seed=5)
        for name in ("q", "k", "v"):
            assert torch.equal(getattr(one, name).view(torch.uint8), getattr(two, name).view(torch.uint8)), name
            assert torch.equal(getattr(one, f"{name}_descale"), getattr(two, f"{name}_descale")), name


def test_one_pass_takes_the_groups_whose_rotated_block_fits_registers():
    from flashattn.launch.quantize_fp8 import one_pass

    assert all(one_pass(width, 1) for width in (32, 64, 128, 256))
    assert one_pass(128, 2) and one_pass(64, 3) and one_pass(32, 8)
    assert not one_pass(256, 2) and not one_pass(128, 3) and not one_pass(64, 5)


# -- the Triton kernel --


def check_kernel(device, batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, granularity="block", block_n=None,
                 **options):
    q, k, v = make_inputs(batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, device)
    quantized = fp8.quantize(q, k, v, seed=0, granularity=granularity)
    out, lse, _ = flash_attn_func(*quantized[:3], **descale_kwargs(quantized), return_attn_probs=True, **options)
    inputs = dequantized(quantized)
    oracle, oracle_lse = attention_ref(*inputs, **options)
    if block_n is None:
        from flashattn.launch.forward_fp8 import fp8_tile

        masked = options.get("causal", False) or options.get("window_size", (-1, -1)) != (-1, -1)
        block_n = fp8_tile(head_dim, masked, torch.device(device)).block_n
    emulated = fp8_emulated_attention(*inputs, block_n=block_n, **options)
    assert_fp8_within_rule(f"fp8 out {granularity} {options}", out, oracle, emulated)
    seen = oracle_lse.isfinite()
    assert torch.equal(lse.isfinite(), seen)
    # Hopper's FP8 tensor cores add the products of one wgmma into a sum of about 14 mantissa bits (DeepSeek-V3's
    # report): Triton's fp8 dot moves the sum to a float32 register every 32 products, the Gluon kernel (as
    # FlashAttention-3) does not, and its scores, so the lse, carry about 2^-13 of their size
    assert (lse.double() - oracle_lse)[seen].abs().max().item() < 2**-11 * max(1.0, oracle_lse[seen].abs().max().item())


@pytest.mark.interpreter
@pytest.mark.parametrize("shape,granularity,options", [
    ((1, 40, 300, 2, 1, 64), "block", {}),
    ((1, 40, 300, 2, 1, 64), "block", {"causal": True}),
    ((1, 1, 33, 2, 2, 40), "head", {"window_size": (5, 3)}),
    ((2, 17, 140, 2, 1, 32), "block", {"softcap": 5.0}),
], ids=str)
def test_fp8_kernel_interpreter(triton_backend, shape, granularity, options):
    check_kernel(triton_backend, *shape, granularity, **options)


@pytest.mark.interpreter
def test_fp8_kernel_varlen_interpreter(triton_backend):
    lengths_q, lengths_k = (5, 0, 40), (30, 7, 70)
    sequences = [fp8.quantize(*make_inputs(1, sq, sk, 2, 1, 32, triton_backend, seed=i), seed=0, granularity="head")
                 for i, (sq, sk) in enumerate(zip(lengths_q, lengths_k, strict=True))]
    pack = [torch.cat([x[i][0] for x in sequences]) for i in range(3)]
    descales = {name: torch.cat([getattr(x, name) for x in sequences])
                for name in ("q_descale", "k_descale", "v_descale")}
    cu_q = torch.tensor([0, 5, 5, 45], dtype=torch.int32, device=triton_backend)
    cu_k = torch.tensor([0, 30, 37, 107], dtype=torch.int32, device=triton_backend)
    out = flash_attn_varlen_func(*pack, cu_q, cu_k, 40, 70, causal=True, **descales)
    for b in (0, 2):
        inputs = dequantized(sequences[b])
        oracle, _ = attention_ref(*inputs, causal=True)
        emulated = fp8_emulated_attention(*inputs, causal=True, block_n=32)
        assert_fp8_within_rule(f"varlen sequence {b}", out[cu_q[b]:cu_q[b + 1]][None], oracle, emulated)


def check_kvcache_kernel(device, cached: tuple, seqlen_q: int, seqlen_new: int, nheads: int, nheads_k: int,
                         head_dim: int, capacity: int, page_size: int | None, **options):
    """flash_attn_with_kvcache on e4m3 caches through the decode kernel (bfloat16 products over the widened tiles):
    the appended rows are the new keys' bytes, and the output is within flash-attn's rule of the float64 attention of
    the dequantized inputs, against plain PyTorch in bfloat16 on them."""
    batch = len(cached)
    q, k, v = make_inputs(batch, seqlen_q, max(cached) + seqlen_new, nheads, nheads_k, head_dim)
    x = fp8.quantize(q, k, v, seed=0, granularity="head")
    q8, k8, v8 = (t.to(device) for t in x[:3])
    descales = {name: d.to(device) for name, d in descale_kwargs(x).items()}
    k_cache = torch.zeros(batch, capacity, nheads_k, head_dim, dtype=torch.float8_e4m3fn, device=device)
    v_cache = torch.zeros_like(k_cache)
    new = [torch.stack([t[b, n:n + seqlen_new] for b, n in enumerate(cached)]) if seqlen_new else None
           for t in (k8, v8)]
    for b, n in enumerate(cached):
        k_cache[b, :n], v_cache[b, :n] = k8[b, :n], v8[b, :n]
    block_table = None
    if page_size is not None:  # the same rows in pages of a shuffled pool
        pages = capacity // page_size
        order = torch.randperm(batch * pages, generator=torch.Generator().manual_seed(1))
        block_table = order.view(batch, pages).to(torch.int32).to(device)
        pools = [torch.empty(batch * pages, page_size, nheads_k, head_dim, dtype=torch.float8_e4m3fn, device=device)
                 for _ in range(2)]
        for pool, cache in zip(pools, (k_cache, v_cache), strict=True):
            pool[order.to(device)] = cache.reshape(batch * pages, page_size, nheads_k, head_dim)
        k_cache, v_cache = pools
    seqlens = torch.tensor(cached, dtype=torch.int32, device=device)
    out = flash_attn_with_kvcache(q8, k_cache, v_cache, *new, cache_seqlens=seqlens, block_table=block_table,
                                  **options, **descales)
    assert out.dtype == torch.bfloat16
    q64, k64, v64 = dequantized(x)
    for b, n in enumerate(cached):
        rows = torch.arange(n + seqlen_new)
        if block_table is not None:
            rows = block_table[b].cpu().long()[rows // page_size] * page_size + rows % page_size
        stored = k_cache[b] if block_table is None else k_cache.flatten(0, 1)
        assert torch.equal(stored[rows.to(device)].view(torch.uint8), k8[b, :n + seqlen_new].view(torch.uint8))
        inputs = (q64[b:b + 1], k64[b:b + 1, :n + seqlen_new], v64[b:b + 1, :n + seqlen_new])
        oracle, _ = attention_ref(*inputs, **options)
        plain, _ = attention_ref(*(t.to(torch.bfloat16) for t in inputs), upcast=False, **options)
        assert_within_rule(f"fp8 cache, sequence {b}", out[b:b + 1].cpu(), oracle.cpu(), plain.cpu(), 2.0)


@pytest.mark.interpreter
@pytest.mark.parametrize("seqlen_q,seqlen_new,page_size,options", [
    (1, 1, None, {"causal": True}),
    (3, 2, 16, {"causal": True}),
    (2, 0, 16, {}),
], ids=str)
def test_fp8_kvcache_kernel_interpreter(triton_backend, seqlen_q, seqlen_new, page_size, options):
    check_kvcache_kernel(triton_backend, (37, 20), seqlen_q, seqlen_new, 4, 2, 32, 64, page_size, **options)


@pytest.mark.gpu
@pytest.mark.parametrize("cached,seqlen_q,seqlen_new,heads,head_dim,page_size", [
    ((1000, 4000, 17), 1, 1, (32, 8), 128, None),
    ((1000, 4000, 17), 1, 1, (32, 8), 128, 256),
    ((113, 1023), 4, 4, (8, 8), 64, 64),
    ((4095, 1), 1, 0, (16, 2), 256, None),
], ids=str)
def test_fp8_kvcache_kernel_gpu(triton_backend, cached, seqlen_q, seqlen_new, heads, head_dim, page_size):
    check_kvcache_kernel("cuda", cached, seqlen_q, seqlen_new, *heads, head_dim, 4096 + 256, page_size, causal=True)


GPU_SHAPES = [  # (batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim)
    (2, 1, 1023, 8, 8, 128),
    (2, 113, 113, 8, 2, 64),
    (1, 1023, 1023, 4, 4, 96),
    (1, 1023, 4096, 8, 1, 128),
    (2, 4096, 4096, 4, 4, 256),
]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=str)
@pytest.mark.parametrize("granularity,options", [
    ("block", {}), ("block", {"causal": True}), ("head", {"causal": True}), ("block", {"window_size": (256, 0)}),
    ("head", {"softcap": 30.0}),
], ids=str)
def test_fp8_kernel_gpu(triton_backend, shape, granularity, options):
    check_kernel("cuda", *shape, granularity, **options)


@pytest.mark.gpu
def test_fp8_kernel_varlen_gpu(triton_backend):
    lengths_q, lengths_k = (1, 113, 0, 1023), (300, 113, 9, 2048)
    sequences = [fp8.quantize(*make_inputs(1, sq, sk, 8, 2, 128, "cuda", seed=i), seed=0, granularity="head")
                 for i, (sq, sk) in enumerate(zip(lengths_q, lengths_k, strict=True))]
    pack = [torch.cat([x[i][0] for x in sequences]) for i in range(3)]
    descales = {name: torch.cat([getattr(x, name) for x in sequences])
                for name in ("q_descale", "k_descale", "v_descale")}
    cu_q = torch.tensor([0, *torch.tensor(lengths_q).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, *torch.tensor(lengths_k).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    out = flash_attn_varlen_func(*pack, cu_q, cu_k, max(lengths_q), max(lengths_k), causal=True, **descales)
    from flashattn.launch.forward_fp8 import fp8_tile

    block_n = fp8_tile(128, True, torch.device("cuda")).block_n
    for b, x in enumerate(sequences):
        if lengths_q[b] == 0:
            continue
        inputs = dequantized(x)
        oracle, _ = attention_ref(*inputs, causal=True)
        emulated = fp8_emulated_attention(*inputs, causal=True, block_n=block_n)
        assert_fp8_within_rule(f"varlen sequence {b}", out[cu_q[b]:cu_q[b + 1]][None], oracle, emulated)


def test_p_scale_keeps_small_probabilities():
    # 2^-12 underflows to 0 in e4m3 (the smallest subnormal is 2^-9); scaled by P_SCALE it is an exact e4m3 value
    p = torch.tensor([2.0**-12])
    assert fp8.round_to_e4m3(p).item() == 0.0
    assert fp8.round_to_e4m3(p * fp8.P_SCALE).item() / fp8.P_SCALE == 2.0**-12
    assert math.isclose(fp8.P_SCALE, 2 ** round(math.log2(fp8.P_SCALE)))


# -- the Gluon kernel (sm90: kernels/forward_fp8_hopper.py) --


@pytest.mark.parametrize("keys, head_dim", [(113, 40), (1, 16), (200, 256)])
def test_permuted_transposed_v_orders_keys_as_the_p_operand(triton_backend, keys, head_dim):
    """V^T for the Gluon kernel: keys padded with zeros to a multiple of 32, position k of each 32 holding key
    16 k4 + 8 k1 + 4 k3 + 2 k2 + k0 (the P operand's order); v a strided view."""
    from flashattn.launch.forward_fp8 import permuted_transposed_v

    width = -(-keys // 32) * 32
    v = torch.randn(2, 3, keys, head_dim, device=triton_backend).to(torch.float8_e4m3fn).transpose(1, 2)
    vt = permuted_transposed_v(v).view(torch.uint8)
    assert vt.shape == (2, 3, head_dim, width) and vt.is_contiguous()
    bits = [(torch.arange(width) >> i) & 1 for i in range(5)]
    order = torch.arange(width) // 32 * 32 + 16 * bits[4] + 8 * bits[1] + 4 * bits[3] + 2 * bits[2] + bits[0]
    padded = torch.cat([v.cpu().view(torch.uint8), torch.zeros(2, width - keys, 3, head_dim, dtype=torch.uint8)], 1)
    assert torch.equal(vt.cpu(), padded[:, order].permute(0, 2, 3, 1))


def test_transposed_v_dense_and_packed(triton_backend):
    """V^T for the Triton FP8 kernel: (B, Sk, Hk, D) -> (B, Hk, D, Sk), packed (total, Hk, D) -> (Hk, D, total)."""
    from flashattn.launch.forward_fp8 import transposed_v

    v = torch.randn(2, 77, 3, 96, device=triton_backend).to(torch.float8_e4m3fn)
    assert torch.equal(transposed_v(v).view(torch.uint8), v.view(torch.uint8).permute(0, 2, 3, 1))
    packed = v[:, :, :, :64].reshape(154, 3, 64)  # a copy: the head dim's rows are strided
    assert torch.equal(transposed_v(packed[::2]).view(torch.uint8), packed[::2].view(torch.uint8).permute(1, 2, 0))


def test_the_v_transpose_writes_the_v_t_that_a_launch_plan_replays(triton_backend, monkeypatch):
    """The FP8 forward's launches, recorded (no kernel runs) and planned (``plans._Recording.plan``): the attention
    kernel reads V^T from the slot that the V^T copy writes. A uint8 view of V^T passed to the copy had no ``_base``,
    so the plan allocated it apart, and a replay's attention read a V^T that nothing wrote."""
    from flashattn.launch import forward_fp8, plans
    from flashattn.options import AttentionOptions

    recording = plans._Recording(stream=None, device_index=0)

    def record(kernel, grid, *args, **kwargs):
        signature = inspect.signature(kernel.fn)
        bound = signature.bind(*args, **{k: v for k, v in kwargs.items() if k in signature.parameters})
        bound.apply_defaults()
        compiled = SimpleNamespace(run=None, metadata=SimpleNamespace(global_scratch_size=0))
        recording.launches.append((compiled, (*grid, 1, 1)[:3], list(bound.arguments.values()), False))

    monkeypatch.setattr(forward_fp8, "launch", record)
    for head_dim in (64, 96):  # the Gluon kernel where it fits (sm90), the Triton one
        recording.launches.clear()
        q, k, v = (torch.randn(1, 40, 2, head_dim, device=triton_backend).to(torch.float8_e4m3fn) for _ in range(3))
        inputs = (q, k, v, *fp8.canonical_descales((None, None, None), 1, 2, q.device))
        result = forward_fp8.launch_forward_fp8(q, k, v, inputs[3:], AttentionOptions(0.125, -1, -1, 0.0))
        plan = recording.plan(inputs, result, None, None)
        copy, attention = plan.steps
        written = dict(copy.tensor_slots)[1]
        assert written >= len(inputs)
        assert written in [slot for _, slot in attention.tensor_slots] + [d[1] for d in attention.descriptor_slots]


def needs_hopper():
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Gluon FP8 kernel is sm90's")


def check_gluon_kernel(batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, granularity, **options):
    from flashattn.launch.forward_fp8 import fp8_tile

    needs_hopper()
    block_n = fp8_tile(head_dim, options.get("causal", False), torch.device("cuda"), hopper=True).block_n
    check_kernel("cuda", batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, granularity, block_n=block_n,
                 **options)


GLUON_SHAPES = [  # (batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim): lengths 1, 113, 1023, q != k, GQA
    (2, 1, 1023, 8, 8, 128),
    (2, 113, 113, 8, 2, 64),
    (1, 1023, 1023, 4, 4, 256),
    (1, 1023, 4096, 8, 1, 128),
    (2, 4096, 1023, 4, 2, 64),
    (2, 4096, 4096, 4, 4, 256),
    (3, 777, 300, 6, 3, 128),
]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", GLUON_SHAPES, ids=str)
@pytest.mark.parametrize("granularity,options", [("block", {}), ("block", {"causal": True}), ("head", {}),
                                                 ("head", {"causal": True})], ids=str)
def test_fp8_gluon_kernel_gpu(triton_backend, shape, granularity, options):
    check_gluon_kernel(*shape, granularity, **options)


@pytest.mark.gpu
def test_fp8_launch_picks_the_gluon_kernel_where_it_fits(triton_backend, monkeypatch):
    """Dense causal or unmasked calls at head dims 64/128/256 take the Gluon kernel; a window, a softcap, another
    head dim and packed calls take the Triton one (each after its V^T copy)."""
    from flashattn.kernels import forward_fp8_hopper, transpose_fp8
    from flashattn.launch import forward_fp8

    needs_hopper()
    picked = []
    real = forward_fp8.launch

    def recording(kernel, *args, **kwargs):
        if kernel is not transpose_fp8.transpose_v_kernel:
            picked.append(kernel is forward_fp8_hopper.attention_forward_fp8_hopper_kernel)
        return real(kernel, *args, **kwargs)

    monkeypatch.setattr(forward_fp8, "launch", recording)
    quantized = fp8.quantize(*make_inputs(1, 200, 200, 4, 2, 128, "cuda"), seed=0)
    for options, gluon in [({}, True), ({"causal": True}, True), ({"window_size": (64, 0)}, False),
                           ({"softcap": 20.0}, False)]:
        picked.clear()
        flash_attn_func(*quantized[:3], **descale_kwargs(quantized), **options)
        assert picked == [gluon], options
    picked.clear()
    odd = fp8.quantize(*make_inputs(1, 64, 64, 2, 2, 96, "cuda"), seed=0)
    flash_attn_func(*odd[:3], **descale_kwargs(odd))
    assert picked == [False]
    cu = torch.tensor([0, 200], dtype=torch.int32, device="cuda")
    packed = fp8.quantize(*(x[0] for x in make_inputs(1, 200, 200, 4, 2, 128, "cuda")), cu_seqlens_q=cu,
                          cu_seqlens_k=cu)
    picked.clear()
    flash_attn_varlen_func(*packed[:3], cu, cu, 200, 200, **descale_kwargs(packed))
    assert picked == [False]


def test_fp8_bench_rows(torch_backend):
    """``flashattn bench --dtype fp8``'s case: a row a provider, TFLOP/s for the attentions, milliseconds only for
    the quantizer, no provider failing (the CPU runs the PyTorch path)."""
    from flashattn.tools.bench import FP8_PROVIDERS, BenchCase, measure_fp8_case

    case = BenchCase(batch=1, seqlen=64, nheads=2, head_dim=32, causal=True)
    rows = measure_fp8_case(case, torch.device("cpu"), ["flashattn", *FP8_PROVIDERS])
    assert [row.provider for row in rows] == ["flashattn", *FP8_PROVIDERS]
    for row in rows:
        assert row.error is None and row.fwd_ms > 0, row
        assert (row.fwd_tflops is None) == (row.provider == "quantize"), row


def test_fp8_training_bench_writes_steps(torch_backend, tmp_path, monkeypatch):
    """``flashattn bench --dtype fp8 --training``: a row a provider with both halves of the step timed (one call
    each here: the timing loop is ``timing``'s, tested there), the FP8 output compared with flashattn's bf16 one
    (within FP8's error of it), and the results file."""
    import json
    import time

    from flashattn.tools import bench
    from flashattn.tools.bench import TRAIN_PROVIDER, step_ms
    from flashattn.tools.cli import main
    from flashattn.tools.timing import Timing

    def once(fn, device):
        started = time.perf_counter()
        fn()
        return Timing(time.perf_counter() - started, 0.0, 1, True)

    monkeypatch.setattr(bench, "time_call", once)

    args = ["bench", "--dtype", "fp8", "--training", "--head-dims", "32", "--seqlens", "64", "--causal", "yes",
            "--tokens", "128", "--hidden", "64", "--out", str(tmp_path)]
    assert main(args) == 0
    (path,) = tmp_path.glob("*-fp8_train.json")
    rows = json.loads(path.read_text())["results"]
    # the bf16 baselines (cuDNN's, and FA4's where installed, beside ours on a GPU), then the FP8 step
    assert [row["provider"] for row in rows] == [*bench._baseline(torch.cuda.is_available()), TRAIN_PROVIDER]
    for row in rows:
        assert row["error"] is None and row["fwd_ms"] > 0 and row["bwd_ms"] > 0, row
        assert row["case"]["seqlen"] == 64 and row["case"]["causal"] and row["case"]["head_dim"] == 32
    assert 0 < rows[-1]["max_diff_vs_flashattn"] < 0.25  # e4m3 inputs and P: a few percent of |out| <= max |v|
    assert step_ms(SimpleNamespace(fwd_ms=1.0, bwd_ms=2.5)) == 3.5
    assert step_ms(SimpleNamespace(fwd_ms=1.0, bwd_ms=None)) is None
