"""Attention sinks (``flashattn.sinks``, GPT-OSS's learned per-head logit): outputs and gradients, the sinks' own
included, against the softmax over the scores and the sink column spelled out, in float64 as the oracle and in the
input precision as the baseline that sets the tolerance (the flash-attn rule: 2x for outputs, 3x for gradients)."""

import pytest
import torch
from test_sdpa import make_mask, sdpa_inputs

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
        inputs = [x.detach().to(precision).requires_grad_() for x in leaves]
        inputs[3] = leaves[3].detach().to(torch.float64 if precision == torch.float64 else torch.float32)
        inputs[3].requires_grad_()
        result = sink_attention(*inputs[:3], inputs[3], None if mask is None else
                                (mask if mask.dtype == torch.bool else mask.to(precision)), is_causal)
        return result, torch.autograd.grad(result, inputs, grad.to(precision))

    oracle, oracle_grads = run(torch.float64)
    baseline, baseline_grads = run(dtype)
    assert_within_rule("out", out, oracle, baseline, factor=2)
    for name, ours, exact, plain in zip(("dq", "dk", "dv"), grads, oracle_grads, baseline_grads, strict=False):
        assert_within_rule(name, ours, exact, plain, factor=3)
    with torch.no_grad():
        exact_out, exact_lse = sink_attention(*(x.double() for x in leaves), mask, is_causal, with_lse=True)
    floor = lse_floor(exact_out, exact_lse, leaves[3].detach().double(), grad.double())
    assert_within_rule("dsinks", grads[3], oracle_grads[3], baseline_grads[3], factor=3, floor=floor)


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
    check_sinks((1, 4, 2, 19, 33, 32), torch.float32, "bool-padding", True, triton_backend)


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
