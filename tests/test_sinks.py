"""Attention sinks (``flashattn.sinks``, GPT-OSS's learned per-head logit): outputs and gradients, the sinks' own
included, against the softmax over the scores and the sink column spelled out, in float64 as the oracle and in the
input precision as the baseline that sets the tolerance (the flash-attn rule: 2x for outputs, 3x for gradients)."""

import pytest
import torch
from test_sdpa import make_mask, sdpa_inputs

from flashattn import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache
from flashattn.sdpa import attention_bhle
from flashattn.testing import assert_within_rule


def sink_attention(query, key, value, sinks, mask, is_causal: bool, with_lse: bool = False):
    """softmax([q k^T / sqrt(E) + mask, sink]) without its sink column, times v; top-left causal (and the rows'
    log-sum-exps over the keys alone)."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    scores = query @ key.transpose(-1, -2) * query.shape[-1] ** -0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    if is_causal:
        seqlen_q, seqlen_k = scores.shape[-2:]
        above = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=scores.device).triu(1)
        scores = scores.masked_fill(above, float("-inf"))
    sink = sinks.to(scores.dtype).reshape(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
    probs = torch.cat([scores, sink], -1).softmax(-1)[..., :-1]
    return (probs @ value, scores.logsumexp(-1)) if with_lse else probs @ value


def lse_floor(out, lse, sinks, grad) -> float:
    """The sinks' gradient error that a float32 log-sum-exp cannot avoid: each row's weight w = sigmoid(lse - sink)
    moves by w (1 - w) |lse| eps, and the row adds (1 - w) rowsum(dO O) to its head's gradient."""
    weights = torch.sigmoid(lse - sinks[:, None]).nan_to_num(1.0)
    rows = (grad * out).sum(-1).abs() / weights.clamp_min(1e-30)
    spread = weights * (1 - weights) * lse.abs().nan_to_num(0.0) * torch.finfo(torch.float32).eps
    return (spread * rows).sum((0, 2)).max().item()


def reference_leaves(leaves, precision) -> list[torch.Tensor]:
    """q, k, v in ``precision`` and the sinks in float32 (float64 for the oracle), as fresh leaves: a reference's
    inputs."""
    sinks_dtype = torch.float64 if precision == torch.float64 else torch.float32
    inputs = [x.detach().to(precision) for x in leaves[:3]] + [leaves[3].detach().to(sinks_dtype)]
    return [x.requires_grad_() for x in inputs]


def assert_sinks_within_rule(out, grads, run, dtype, dsinks_floor: float) -> None:
    """``out`` and the gradients of q, k, v and the sinks against ``run(precision)``'s (output, gradients): the
    float64 oracle, and ``dtype``'s as the baseline (2x for the output, 3x for the gradients)."""
    oracle, oracle_grads = run(torch.float64)
    baseline, baseline_grads = run(dtype)
    assert_within_rule("out", out, oracle, baseline, factor=2)
    for name, ours, exact, plain in zip(("dq", "dk", "dv", "dsinks"), grads, oracle_grads, baseline_grads,
                                        strict=True):
        assert_within_rule(name, ours, exact, plain, factor=3, floor=dsinks_floor if name == "dsinks" else 0.0)


def check_sinks(shape, dtype, mask_kind: str, is_causal: bool, device) -> None:
    batch, nheads, nheads_k, seqlen_q, seqlen_k, head_dim = shape
    query, key, value = sdpa_inputs(*shape, dtype, device)
    sinks = 2 * torch.randn(nheads, device=device)  # float32 parameters beside a 16-bit model, as GPT-OSS's
    mask = make_mask(mask_kind, batch, nheads, seqlen_q, seqlen_k, dtype, device)
    mask = None if mask is None else mask.detach()
    leaves = [x.requires_grad_() for x in (query, key, value, sinks)]
    out = attention_bhle(*leaves[:3], mask, 0.0, is_causal, None, sinks=leaves[3])
    grad = torch.randn_like(out)
    grads = torch.autograd.grad(out, leaves, grad)

    def run(precision):
        inputs = reference_leaves(leaves, precision)
        result = sink_attention(*inputs[:3], inputs[3], None if mask is None else
                                (mask if mask.dtype == torch.bool else mask.to(precision)), is_causal)
        return result, torch.autograd.grad(result, inputs, grad.to(precision))

    with torch.no_grad():
        exact_out, exact_lse = sink_attention(*(x.double() for x in leaves), mask, is_causal, with_lse=True)
    floor = lse_floor(exact_out, exact_lse, leaves[3].detach().double(), grad.double())
    assert_sinks_within_rule(out, grads, run, dtype, floor)


@pytest.mark.parametrize(("shape", "mask_kind", "is_causal", "dtype"), [
    ((2, 4, 2, 37, 53, 40), "bool-batch", False, torch.float32),
    ((1, 6, 2, 53, 37, 96), "none", True, torch.bfloat16),
    ((2, 2, 2, 1, 1, 16), "none", False, torch.float16),
    ((2, 4, 4, 70, 70, 64), "float-heads", True, torch.float32),
], ids=str)
def test_sinks_match_reference(torch_backend, shape, mask_kind, is_causal, dtype):
    check_sinks(shape, dtype, mask_kind, is_causal, "cpu")


@pytest.mark.interpreter
def test_sinks_on_the_kernels(triton_backend):
    """SDPA's sinks, and the public functions' learnable_sink (dense and packed), on the kernels."""
    check_sinks((1, 4, 2, 19, 33, 32), torch.float32, "bool-padding", True, triton_backend)
    check_public_sinks(dense_call(2, True), [19] * 2, [33] * 2, 4, 2, 32, torch.float32, True, triton_backend)
    check_public_sinks(varlen_call([19, 7], [12, 30], True), [19, 7], [12, 30], 2, 1, 32, torch.float32, True,
                       triton_backend)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_sinks_on_the_gpu(triton_backend, dtype):
    check_sinks((2, 8, 2, 1023, 1024, 128), dtype, "none", True, "cuda")
    check_sinks((1, 4, 4, 257, 2049, 64), dtype, "bool-padding", False, "cuda")


def test_a_row_without_keys_stays_zero(torch_backend):
    """A row whose mask hides every key: no key takes mass, the sink takes it all, the output is 0."""
    query, key, value = sdpa_inputs(1, 2, 2, 3, 5, 16, torch.float32, "cpu")
    mask = torch.ones(1, 1, 3, 5, dtype=torch.bool)
    mask[..., 1, :] = False
    sinks = torch.zeros(2, requires_grad=True)
    out = attention_bhle(query, key, value, mask, 0.0, False, None, sinks=sinks)
    assert torch.equal(out[:, :, 1], torch.zeros_like(out[:, :, 1]))
    out.sum().backward()
    assert torch.isfinite(sinks.grad).all()


@pytest.mark.parametrize(("sinks", "error", "match"), [
    (torch.zeros(3), ValueError, r"sinks must have one logit per query head, shape \(2,\)"),
    (torch.zeros(2, dtype=torch.int64), TypeError, "sinks must be floating point"),
    ([0.0, 0.0], TypeError, "sinks must be a torch.Tensor"),
])
def test_bad_sinks_are_refused(torch_backend, sinks, error, match):
    query, key, value = sdpa_inputs(1, 2, 2, 3, 5, 16, torch.float32, "cpu")
    with pytest.raises(error, match=match):
        attention_bhle(query, key, value, None, 0.0, False, None, sinks=sinks)


# -- the public functions' learnable_sink (FlashAttention-4's argument) --


def visible_keys(seqlens_q, seqlens_k, causal: bool, device) -> torch.Tensor:
    """(total_q, total_k) bool: a packed batch's block-diagonal mask, each block bottom-right causal when asked."""
    rows = []
    for index, (sq, sk) in enumerate(zip(seqlens_q, seqlens_k, strict=True)):
        i, j = torch.arange(sq, device=device)[:, None], torch.arange(sk, device=device)[None, :]
        block = j <= i + sk - sq if causal else torch.ones(sq, sk, dtype=torch.bool, device=device)
        row = [block if other == index else torch.zeros(sq, n, dtype=torch.bool, device=device)
               for other, n in enumerate(seqlens_k)]
        rows.append(torch.cat(row, 1))
    return torch.cat(rows, 0)


def packed_sink_attention(q, k, v, sinks, mask, with_lse=False):
    """The sink reference on packed (total, heads, d) tensors under a (total_q, total_k) mask: (out in q's layout,
    and the lse (heads, total_q) over the keys alone)."""
    result = sink_attention(*(x.transpose(0, 1)[None] for x in (q, k, v)), sinks, mask[None, None], False, with_lse)
    if with_lse:
        return result[0][0].transpose(0, 1), result[1][0]
    return result[0].transpose(0, 1)


def output_rounding_floor(q, k, v, sinks, mask, grad, dtype) -> float:
    """The sinks' gradient error that rounding the kernels' output to ``dtype`` brings (the backward reads that
    output, as flash-attn's reads O for delta), at four standard deviations: each row adds (1 - w) rowsum(dO O) w
    to its head's gradient, and each O element carries a rounding error uniform within half an ulp."""
    with torch.no_grad():
        no_sink = torch.full_like(sinks, -1e300, dtype=torch.float64)
        out, lse = packed_sink_attention(*(x.double() for x in (q, k, v)), no_sink, mask, with_lse=True)
        weights = torch.sigmoid(lse - sinks.double()[:, None]).transpose(0, 1).unsqueeze(-1)
        unit = torch.finfo(dtype).eps / 2
        terms = ((1 - weights) * weights) ** 2 * ((grad.double() * out) ** 2).sum(-1, keepdim=True)
        variance = terms.movedim(-2, 0).reshape(sinks.shape[0], -1).sum(1) * unit**2 / 3
    return 4 * variance.sqrt().max().item()


def check_public_sinks(call, seqlens_q, seqlens_k, nheads, nheads_k, head_dim, dtype, causal, device) -> None:
    """``call(q, k, v, sinks)`` (packed (total, heads, d) tensors of the sequences ``seqlens_q`` / ``seqlens_k``,
    returning out in q's layout) against the reference: the output by the 2x rule, the gradients of q, k, v and the
    sinks by the 3x rule."""
    q = torch.randn(sum(seqlens_q), nheads, head_dim, dtype=dtype, device=device)
    k, v = (torch.randn(sum(seqlens_k), nheads_k, head_dim, dtype=dtype, device=device) for _ in range(2))
    sinks = 2 * torch.randn(nheads, device=device)
    mask = visible_keys(seqlens_q, seqlens_k, causal, device)
    leaves = [x.requires_grad_() for x in (q, k, v, sinks)]
    out = call(*leaves)
    grad = torch.randn_like(out)
    grads = torch.autograd.grad(out, leaves, grad)

    def run(precision):
        inputs = reference_leaves(leaves, precision)
        result = packed_sink_attention(*inputs, mask)
        return result, torch.autograd.grad(result, inputs, grad.to(precision))

    with torch.no_grad():
        exact_out, exact_lse = packed_sink_attention(*(x.double() for x in leaves), mask, with_lse=True)
    floor = max(lse_floor(exact_out.transpose(0, 1)[None], exact_lse[None], leaves[3].detach().double(),
                          grad.double().transpose(0, 1)[None]),
                output_rounding_floor(*(x.detach() for x in leaves), mask, grad, dtype))
    assert_sinks_within_rule(out, grads, run, dtype, floor)


def dense_call(batch, causal):
    def call(q, k, v, sinks):  # packed tensors of equal sequences, as flash_attn_func's (batch, seqlen, ...)
        out = flash_attn_func(*(x.unflatten(0, (batch, -1)) for x in (q, k, v)), causal=causal,
                              learnable_sink=sinks)
        return out.flatten(0, 1)
    return call


def varlen_call(seqlens_q, seqlens_k, causal):
    def call(q, k, v, sinks):
        cu_q, cu_k = (torch.tensor([0, *torch.tensor(n).cumsum(0).tolist()], dtype=torch.int32, device=q.device)
                      for n in (seqlens_q, seqlens_k))
        return flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(seqlens_q), max(seqlens_k), causal=causal,
                                      learnable_sink=sinks)
    return call


# (batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, dtype, causal)
DENSE_SINK_CASES = [(2, 37, 53, 4, 2, 40, torch.float32, True), (1, 113, 113, 2, 2, 96, torch.bfloat16, False),
                    (3, 1, 1, 2, 1, 16, torch.float16, True), (1, 70, 29, 6, 2, 64, torch.float32, True)]


@pytest.mark.parametrize("case", DENSE_SINK_CASES, ids=str)
def test_flash_attn_func_learnable_sink(torch_backend, case):
    batch, sq, sk, nheads, nheads_k, head_dim, dtype, causal = case
    check_public_sinks(dense_call(batch, causal), [sq] * batch, [sk] * batch, nheads, nheads_k, head_dim, dtype,
                       causal, "cpu")


@pytest.mark.parametrize("causal", [True, False])
def test_flash_attn_varlen_func_learnable_sink(torch_backend, causal):
    seqlens_q, seqlens_k = [37, 1, 70], [53, 20, 41]
    check_public_sinks(varlen_call(seqlens_q, seqlens_k, causal), seqlens_q, seqlens_k, 4, 2, 32, torch.bfloat16,
                       causal, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_learnable_sink_on_the_gpu(dtype):
    check_public_sinks(dense_call(2, True), [1023] * 2, [1024] * 2, 8, 2, 128, dtype, True, "cuda")
    check_public_sinks(varlen_call([300, 1, 513], [257, 64, 513], False), [300, 1, 513], [257, 64, 513], 4, 4, 64,
                       dtype, False, "cuda")


def test_kvcache_learnable_sink(torch_backend):
    """A decode step with sinks: the step's output and log-sum-exp against the reference over each batch element's
    cache (its first cache_seqlens[b] keys), the new key appended first. The sinks scale the step's result after
    the kernels, whichever ran: the PyTorch path suffices."""
    dtype, device = torch.float16, "cpu"
    batch, capacity, nheads, nheads_k, head_dim = 3, 40, 4, 2, 32
    k_cache, v_cache = (torch.randn(batch, capacity, nheads_k, head_dim, dtype=dtype, device=device)
                        for _ in range(2))
    q = torch.randn(batch, 1, nheads, head_dim, dtype=dtype, device=device)
    k, v = (torch.randn(batch, 1, nheads_k, head_dim, dtype=dtype, device=device) for _ in range(2))
    cache_seqlens = torch.tensor([0, 17, 39], dtype=torch.int32, device=device)
    sinks = torch.randn(nheads, device=device)
    out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=cache_seqlens, causal=True,
                                       return_softmax_lse=True, learnable_sink=sinks)
    lengths = (cache_seqlens + 1).tolist()

    def run(precision):
        keys = [k_cache[b, :n].to(precision) for b, n in enumerate(lengths)]
        values = [v_cache[b, :n].to(precision) for b, n in enumerate(lengths)]
        mask = visible_keys([1] * batch, lengths, True, device)
        return packed_sink_attention(q.flatten(0, 1).to(precision), torch.cat(keys), torch.cat(values),
                                     sinks.to(precision), mask, with_lse=True)

    (oracle, oracle_lse), (baseline, _) = run(torch.float64), run(dtype)
    assert_within_rule("out", out.flatten(0, 1), oracle, baseline, factor=2)
    expected_lse = torch.logaddexp(oracle_lse, sinks.double()[:, None]).transpose(0, 1).unsqueeze(-1)
    # the log-sum-exp is float32 (flash-attn's contract): float32's tolerance
    torch.testing.assert_close(lse, expected_lse.reshape(batch, 1, nheads).transpose(1, 2).float())


def test_learnable_sink_is_checked_and_refused_with_fp8(torch_backend):
    q = torch.randn(1, 5, 2, 16)
    with pytest.raises(ValueError, match=r"learnable_sink must have one logit per query head, shape \(2,\)"):
        flash_attn_func(q, q, q, learnable_sink=torch.zeros(3))
    with pytest.raises(TypeError, match="learnable_sink must be floating point"):
        flash_attn_varlen_func(q[0], q[0], q[0], torch.tensor([0, 5], dtype=torch.int32),
                               torch.tensor([0, 5], dtype=torch.int32), 5, 5, learnable_sink=torch.zeros(2).long())
    e4m3 = q.to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="learnable_sink is not supported with float8 inputs"):
        flash_attn_func(e4m3, e4m3, e4m3, learnable_sink=torch.zeros(2))
