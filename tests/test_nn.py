"""flashattn.nn: MultiheadAttention against torch's with the same weights, and the SelfAttention block."""

import copy
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from flashattn import flash_attn_func
from flashattn.nn import MultiheadAttention, RotaryEmbedding, SelfAttention
from flashattn.testing import assert_within_rule

README = Path(__file__).resolve().parents[1] / "README.md"


def torch_and_flash(embed_dim=64, num_heads=4, **kwargs):
    """A torch MHA with random weights (biases too) and a flashattn one loaded from its state_dict."""
    torch.manual_seed(0)
    reference = torch.nn.MultiheadAttention(embed_dim, num_heads, **kwargs).eval()
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(0.1 * torch.randn_like(p))
    ours = MultiheadAttention(embed_dim, num_heads, **kwargs).eval()
    ours.load_state_dict(reference.state_dict())
    return reference, ours


def check_mha(reference, ours, query, key, value, **call):
    """Outputs and input/weight gradients within the rule: oracle = torch's module in float64."""
    oracle_module = copy.deepcopy(reference).double()
    inputs = [x.detach().requires_grad_() for x in (query, key, value)]
    oracle_inputs = [x.detach().double().requires_grad_() for x in inputs]
    baseline_inputs = [x.detach().clone().requires_grad_() for x in inputs]

    def double(mask):
        return mask.double() if mask is not None and mask.is_floating_point() else mask

    out, weights = ours(*inputs, need_weights=False, **call)
    assert weights is None
    oracle, _ = oracle_module(*oracle_inputs, need_weights=False,
                              **{name: double(m) if "mask" in name else m for name, m in call.items()})
    baseline, _ = reference(*baseline_inputs, need_weights=False, **call)
    assert_within_rule("out", out, oracle, baseline, factor=2)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, [inputs[0], ours.out_proj.weight], dout)
    oracle_grads = torch.autograd.grad(oracle, [oracle_inputs[0], oracle_module.out_proj.weight], dout.double())
    baseline_grads = torch.autograd.grad(baseline, [baseline_inputs[0], reference.out_proj.weight], dout)
    for name, *g in zip(("dquery", "dout_proj"), grads, oracle_grads, baseline_grads, strict=True):
        assert_within_rule(name, *g, factor=3)


def test_state_dict_keys_match_torch():
    for kwargs in ({}, {"bias": False}, {"kdim": 24, "vdim": 40}, {"add_bias_kv": True}):
        reference = torch.nn.MultiheadAttention(32, 4, batch_first=True, **kwargs)
        ours = MultiheadAttention(32, 4, **kwargs)
        assert list(ours.state_dict()) == list(reference.state_dict()), kwargs
        assert isinstance(ours, torch.nn.MultiheadAttention) and ours.batch_first


def test_self_attention_with_padding_and_causal_mask(torch_backend):
    reference, ours = torch_and_flash(batch_first=True)
    x = torch.randn(3, 29, 64)
    padding = torch.zeros(3, 29, dtype=torch.bool)
    padding[1, 20:] = True
    padding[2, :3] = True
    causal = torch.ones(29, 29, dtype=torch.bool).triu(1)
    check_mha(reference, ours, x, x, x, key_padding_mask=padding)
    check_mha(reference, ours, x, x, x, attn_mask=causal, is_causal=True)
    check_mha(reference, ours, x, x, x, attn_mask=causal, key_padding_mask=padding)


@pytest.mark.filterwarnings("ignore:Support for mismatched key_padding_mask:UserWarning")  # torch's, not ours
def test_cross_attention_with_kdim_vdim_float_masks_and_per_head_masks(torch_backend):
    reference, ours = torch_and_flash(kdim=24, vdim=40, batch_first=True)
    query, key, value = torch.randn(2, 17, 64), torch.randn(2, 31, 24), torch.randn(2, 31, 40)
    padding = torch.zeros(2, 31).masked_fill(torch.rand(2, 31) < 0.3, float("-inf"))
    padding[:, 0] = 0.0
    per_head = torch.randn(2 * 4, 17, 31)
    check_mha(reference, ours, query, key, value, key_padding_mask=padding, attn_mask=per_head)
    hidden = torch.rand(17, 31) < 0.3
    hidden[:, 0] = False
    check_mha(reference, ours, query, key, value, attn_mask=hidden, key_padding_mask=padding)


def test_bias_kv_zero_attn_sequence_first_and_unbatched(torch_backend):
    reference, ours = torch_and_flash(add_bias_kv=True, add_zero_attn=True, batch_first=False)
    query, key = torch.randn(13, 2, 64), torch.randn(19, 2, 64)  # (L, B, E)
    padding = torch.zeros(2, 19, dtype=torch.bool)
    padding[0, 15:] = True
    check_mha(reference, ours, query, key, key, key_padding_mask=padding)
    check_mha(reference, ours, query[:, 0], key[:, 0], key[:, 0], key_padding_mask=padding[0])


@pytest.mark.parametrize("extra", [dict(add_bias_kv=True), dict(add_zero_attn=True)], ids=str)
def test_causal_with_an_appended_key_that_every_query_sees(torch_backend, extra):
    """is_causal with add_bias_kv / add_zero_attn: the causal mask over the given keys, the appended key seen by
    every query, as torch's path with a key_padding_mask computes it (and as need_weights=True does here)."""
    reference, ours = torch_and_flash(batch_first=True, **extra)
    x = torch.randn(2, 9, 64)
    causal = torch.ones(9, 9, dtype=torch.bool).triu(1)
    padding = torch.zeros(2, 9, dtype=torch.bool)
    check_mha(reference, ours, x, x, x, attn_mask=causal, key_padding_mask=padding, is_causal=True)
    with torch.no_grad():
        flash = ours(x, x, x, attn_mask=causal, is_causal=True, need_weights=False)[0]
        weighted = ours(x, x, x, attn_mask=causal, is_causal=True, need_weights=True)[0]
    torch.testing.assert_close(flash, weighted, rtol=1e-5, atol=2e-6)


def test_need_weights_runs_torch_and_returns_its_weights(torch_backend):
    reference, ours = torch_and_flash(batch_first=True)
    x = torch.randn(2, 11, 64)
    expected = reference(x, x, x, need_weights=True, average_attn_weights=False)
    got = ours(x, x, x, average_attn_weights=False)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    # is_causal without attn_mask is accepted here, on both paths
    causal = torch.ones(11, 11, dtype=torch.bool).triu(1)
    weights = ours(x, x, x, is_causal=True)[1]
    assert torch.equal(weights, reference(x, x, x, attn_mask=causal)[1])
    torch.testing.assert_close(ours(x, x, x, is_causal=True, need_weights=False)[0],
                               reference(x, x, x, attn_mask=causal)[0], rtol=1e-5, atol=2e-6)


def test_unsupported_dtype_warns_and_runs_torch():
    reference, ours = torch_and_flash(batch_first=True)
    reference, ours = reference.double(), ours.double()
    x = torch.randn(2, 5, 64, dtype=torch.float64)
    with pytest.warns(UserWarning, match="float16, bfloat16 or float32"):
        out, _ = ours(x, x, x, need_weights=False)
    assert torch.equal(out, reference(x, x, x, need_weights=False)[0])


@pytest.mark.interpreter
def test_multihead_attention_on_the_kernels(triton_backend):
    reference, ours = torch_and_flash(32, 2, batch_first=True)
    reference, ours = reference.to(triton_backend), ours.to(triton_backend)
    x = torch.randn(2, 21, 32, device=triton_backend)
    padding = torch.zeros(2, 21, dtype=torch.bool, device=triton_backend)
    padding[1, 13:] = True
    check_mha(reference, ours, x, x, x, key_padding_mask=padding)


# -- SelfAttention --


def test_rotary_embedding_is_a_complex_rotation():
    rotary = RotaryEmbedding(8, base=100.0)
    x = torch.randn(2, 5, 3, 8)
    positions = torch.arange(5)
    got = rotary(x, positions)
    pairs = torch.complex(x[..., :4], x[..., 4:])
    angle = positions[:, None].float() * 100.0 ** (-torch.arange(0, 8, 2) / 8)
    turned = pairs * torch.polar(torch.ones_like(angle), angle)[:, None, :]
    torch.testing.assert_close(got, torch.cat([turned.real, turned.imag], -1))
    with pytest.raises(ValueError, match="even head dim"):
        RotaryEmbedding(7)


@pytest.mark.parametrize("cast", ["to", "half", "bfloat16"])
def test_rotary_frequencies_stay_float32_when_the_module_is_cast(cast):
    rotary = RotaryEmbedding(128)
    x, positions = torch.randn(1, 4096, 1, 128), torch.arange(4096)
    expected = rotary(x, positions)
    cast_rotary = rotary.to(torch.bfloat16) if cast == "to" else getattr(rotary, cast)()
    assert cast_rotary.inv_freq.dtype == torch.float32
    assert torch.equal(cast_rotary(x, positions), expected)
    assert SelfAttention(64, 4, 2).to(torch.bfloat16).rotary.inv_freq.dtype == torch.float32


def explicit_self_attention(block: SelfAttention, x: torch.Tensor, attention_mask=None) -> torch.Tensor:
    """The block's computation spelled out with torch's SDPA, in x's dtype."""
    batch, seqlen, _ = x.shape
    qkv = F.linear(x, block.qkv.weight.to(x.dtype))
    h, hk, d = block.num_heads, block.num_kv_heads, block.head_dim
    q, k, v = qkv.split([h * d, hk * d, hk * d], -1)
    q, k, v = (t.unflatten(-1, (-1, d)) for t in (q, k, v))
    positions = torch.arange(seqlen)
    q, k = block.rotary(q, positions), block.rotary(k, positions)
    causal = torch.ones(seqlen, seqlen, dtype=torch.bool).tril()
    mask = causal if attention_mask is None else causal & attention_mask[:, None, None, :]
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask,
                                         enable_gqa=True)
    return F.linear(out.transpose(1, 2).flatten(2), block.out.weight.to(x.dtype))


def test_self_attention_block_matches_its_explicit_form(torch_backend):
    torch.manual_seed(0)
    block = SelfAttention(48, num_heads=6, num_kv_heads=2).eval()
    x = torch.randn(2, 27, 48)
    real = torch.ones(2, 27, dtype=torch.bool)
    real[1, 20:] = False
    for mask in (None, real):
        out = block(x, attention_mask=mask)
        oracle = explicit_self_attention(block, x.double(), mask)
        assert_within_rule("out", out, oracle, explicit_self_attention(block, x, mask), factor=2)
    torch.testing.assert_close(block(x, torch.ones(2, 27, dtype=torch.bool)), block(x), rtol=1e-5, atol=1e-6)


def test_self_attention_calls_the_attention_it_is_given(torch_backend):
    """``attention=``: fp8.flash_attn_func, say, in the unmasked path; the other paths refuse another function."""
    calls = []

    def attention(q, k, v, dropout_p, causal):
        calls.append((q.shape, dropout_p, causal))
        return flash_attn_func(q, k, v, dropout_p, causal=causal)

    torch.manual_seed(0)
    block = SelfAttention(32, num_heads=2, attention=attention)
    x = torch.randn(2, 9, 32)
    plain = SelfAttention(32, num_heads=2)
    plain.load_state_dict(block.state_dict())
    torch.testing.assert_close(block(x), plain(x))
    assert calls == [((2, 9, 2, 16), 0.0, True)]
    with pytest.raises(ValueError, match="attention_mask"):
        block(x, attention_mask=torch.ones(2, 9, dtype=torch.bool))
    with pytest.raises(ValueError, match="process_group"):
        SelfAttention(32, num_heads=2, attention=attention, process_group=object())


def test_readme_training_loop_reduces_the_loss(torch_backend):
    text = README.read_text()
    match = re.search(r"<!-- training-loop -->\s*```python\n(.*?)```", text, re.S)
    assert match, "README has no training-loop block"
    namespace = {}
    exec(compile(match.group(1), "README.md", "exec"), namespace)
    losses = namespace["losses"]
    assert losses[-1] < 0.5 * losses[0], losses


# -- bad arguments: an error that names the argument and what was expected


def bool_mask(*shape):
    return torch.zeros(shape, dtype=torch.bool)


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize(("call", "error", "match"), [
    *[({"attn_mask": bool_mask(*shape)}, ValueError,
       rf"attn_mask must have shape \(L, S\) = \(8, 8\) or \(batch \* num_heads, L, S\) = \(8, 8, 8\), "
       rf"got {re.escape(str(shape))}")
      for shape in [(16, 8, 4), (4, 8, 16), (8, 4, 16), (8,), (1, 8, 8), (2, 4, 8, 8)]],
    *[({"key_padding_mask": bool_mask(*shape)}, ValueError,
       rf"key_padding_mask must have shape \(batch, S\) = \(2, 8\), got {re.escape(str(shape))}")
      for shape in [(8, 2), (16,), (2, 8, 1), (2, 9)]],
    ({"key_padding_mask": torch.zeros(2, 8, dtype=torch.long)}, TypeError, "key_padding_mask must be bool .*int64"),
    ({"attn_mask": torch.zeros(8, 8, dtype=torch.float64)}, TypeError, "attn_mask must be bool .*float64"),
    ({"query": torch.randn(2, 2, 8, 32)}, ValueError,
     r"query must have shape \(batch, seqlen, embed_dim\) = \(\*, \*, 32\)"),
    ({"query": torch.randn(2, 8, 33)}, ValueError, r"query must have shape .* got \(2, 8, 33\)"),
    ({"key": torch.randn(3, 8, 32)}, ValueError, r"key must have shape \(batch, seqlen, kdim\) = \(2, \*, 32\)"),
    ({"value": torch.randn(2, 9, 32)}, ValueError, r"value must have shape \(batch, seqlen, vdim\) = \(2, 8, 32\)"),
    ({"query": torch.randn(2, 8, 32, dtype=torch.float16)}, TypeError, "query must have the module's parameter dtype "
                                                                       "torch.float32"),
])
def test_multihead_attention_names_the_bad_argument(call, error, match, need_weights):
    x = torch.randn(2, 8, 32)
    inputs = {"query": x, "key": x, "value": x, **call}
    with pytest.raises(error, match=match):
        MultiheadAttention(32, 4)(**inputs, need_weights=need_weights)


def test_multihead_attention_takes_unbatched_masks():
    x = torch.randn(8, 32)
    out, _ = MultiheadAttention(32, 4)(x, x, x, key_padding_mask=bool_mask(8), attn_mask=torch.zeros(4, 8, 8),
                                       need_weights=False)
    assert out.shape == (8, 32)
    with pytest.raises(ValueError, match=r"key_padding_mask must have shape \(S,\) = \(8,\), got \(1, 8\)"):
        MultiheadAttention(32, 4)(x, x, x, key_padding_mask=bool_mask(1, 8), need_weights=False)


@pytest.mark.parametrize(("args", "kwargs", "match"), [
    ((32, 4), {"num_kv_heads": 0}, "num_kv_heads must be an int >= 1 or None, got 0"),
    ((32, 4), {"num_kv_heads": -2}, "num_kv_heads must be an int >= 1 or None, got -2"),
    ((32, 4), {"num_kv_heads": 3}, r"num_heads \(4\) must be a multiple of num_kv_heads \(3\)"),
    ((32, 0), {}, "num_heads must be an int >= 1, got 0"),
    ((32, 4), {"head_dim": 0}, "head_dim must be an int >= 1 or None, got 0"),
    ((30, 4), {}, r"dim \(30\) must be a multiple of num_heads \(4\), or pass head_dim"),
    ((32, 4), {"context_parallel_mode": "bogus"}, "context_parallel_mode must be one of 'ring', 'all_to_all', 'auto'"),
])
def test_self_attention_constructor_names_the_bad_argument(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        SelfAttention(*args, **kwargs)


@pytest.mark.parametrize(("x", "call", "error", "match"), [
    ((8, 32), {}, ValueError, r"x must have shape \(batch, seqlen, dim\) = \(\*, \*, 32\), got \(8, 32\)"),
    ((2, 8, 33), {}, ValueError, r"x must have shape .* got \(2, 8, 33\)"),
    ((2, 0, 32), {}, ValueError, r"x must hold at least one token"),
    ((2, 8, 32), {"attention_mask": bool_mask(2, 9)}, ValueError,
     r"attention_mask must have shape \(batch, seqlen\) = \(2, 8\), got \(2, 9\)"),
    ((2, 8, 32), {"attention_mask": torch.ones(2, 8)}, TypeError, "attention_mask must be bool or integer"),
    ((2, 8, 32), {"positions": torch.arange(9)}, ValueError,
     r"positions must have shape \(seqlen,\) = \(8,\) .*got \(9,\)"),
])
def test_self_attention_forward_names_the_bad_argument(x, call, error, match):
    block = SelfAttention(32, 4, num_kv_heads=2)
    with pytest.raises(error, match=match):
        block(torch.randn(x), **call)
    with pytest.raises(TypeError, match="x must have the module's parameter dtype torch.float32"):
        block(torch.randn(2, 8, 32, dtype=torch.float16))
    x = torch.randn(2, 8, 32)  # integer masks (Hugging Face's) and (1, seqlen) positions are taken
    torch.testing.assert_close(block(x, torch.ones(2, 8, dtype=torch.long), torch.arange(8)[None]), block(x))


def test_rotary_embedding_names_the_bad_argument():
    rotary = RotaryEmbedding(8)
    with pytest.raises(ValueError, match=r"x must have shape \(batch, seqlen, heads, head_dim\) = \(\*, \*, \*, 8\)"):
        rotary(torch.randn(2, 5, 3, 16), torch.arange(5))
    with pytest.raises(ValueError, match=r"positions must have shape \(seqlen,\) = \(5,\) or \(batch, seqlen\) = "
                                         r"\(2, 5\) .*got \(3, 5\)"):
        rotary(torch.randn(2, 5, 3, 8), torch.arange(5).expand(3, 5))
