"""flashattn.sdpa_override: torch's SDPA routed to flashattn inside the block, and only there."""

import warnings

import pytest
import torch
import torch.nn.functional as F

import flashattn
from flashattn import sdpa

ORIGINAL = F.scaled_dot_product_attention


@pytest.fixture
def calls(monkeypatch, torch_backend):
    """Count the calls that reach flashattn's SDPA."""
    seen = []
    target = sdpa.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append(args[0].shape)
        return target(*args, **kwargs)

    monkeypatch.setattr(sdpa, "scaled_dot_product_attention", spy)
    return seen


def test_calls_inside_are_routed_and_match_torch(calls):
    query, key, value = (torch.randn(2, 4, 19, 32) for _ in range(3))
    mask = torch.rand(19, 19) > 0.2
    mask[:, 0] = True
    expected = ORIGINAL(query, key, value, attn_mask=mask)
    with flashattn.sdpa_override():
        assert F.scaled_dot_product_attention is not ORIGINAL
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask)
        causal = F.scaled_dot_product_attention(query, key, value, None, 0.0, True)  # positional, as torch
    assert len(calls) == 2 and F.scaled_dot_product_attention is ORIGINAL
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=2e-6)
    torch.testing.assert_close(causal, ORIGINAL(query, key, value, is_causal=True), rtol=1e-5, atol=2e-6)


def test_multihead_attention_is_routed(calls):
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(64, 4, batch_first=True).eval()
    x = torch.randn(2, 23, 64)
    padding = torch.zeros(2, 23, dtype=torch.bool)
    padding[1, 17:] = True
    expected, _ = mha(x, x, x, key_padding_mask=padding, need_weights=False)
    with flashattn.sdpa_override():
        out, _ = mha(x, x, x, key_padding_mask=padding, need_weights=False)
    assert len(calls) == 1
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("case", ["float64", "value-head-dim"])
def test_unsupported_calls_fall_back_to_torch_with_one_warning(calls, case):
    query, key, value = (torch.randn(1, 2, 9, 16, dtype=torch.float64) for _ in range(3))
    if case == "value-head-dim":
        query, key, value = query.float(), key.float(), torch.randn(1, 2, 9, 24)
    with flashattn.sdpa_override(), pytest.warns(UserWarning, match="using torch's") as record:
        outs = [F.scaled_dot_product_attention(query, key, value) for _ in range(3)]
    assert len(record) == 1 and not calls
    assert ("float16, bfloat16 or float32" if case == "float64" else "value must have") in str(record[0].message)
    assert torch.equal(outs[0], ORIGINAL(query, key, value))


def test_supported_calls_do_not_warn(calls):
    query = torch.randn(1, 2, 9, 16)
    with flashattn.sdpa_override(), warnings.catch_warnings():
        warnings.simplefilter("error")
        F.scaled_dot_product_attention(query, query, query)
    assert len(calls) == 1


def test_torch_is_restored_after_an_exception_and_when_nested():
    with pytest.raises(RuntimeError, match="inside"), flashattn.sdpa_override():
        raise RuntimeError("raised inside the block")
    assert F.scaled_dot_product_attention is ORIGINAL
    with flashattn.sdpa_override():
        outer = F.scaled_dot_product_attention
        with flashattn.sdpa_override():
            assert F.scaled_dot_product_attention is not outer
        assert F.scaled_dot_product_attention is outer
    assert F.scaled_dot_product_attention is ORIGINAL
