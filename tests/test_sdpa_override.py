"""flashattn.sdpa_override: torch's SDPA routed to flashattn inside the block, and only there."""

import copy
import threading
import warnings

import pytest
import torch
import torch.nn.functional as F

import flashattn
from flashattn import sdpa
from flashattn.testing import assert_within_rule

ORIGINAL = F.scaled_dot_product_attention


def count_calls(monkeypatch, owner, name: str) -> list:
    """Replace ``owner.name`` by a spy that records each call's first argument's shape and calls through."""
    seen = []
    target = getattr(owner, name)

    def spy(*args, **kwargs):
        seen.append(args[0].shape)
        return target(*args, **kwargs)

    monkeypatch.setattr(owner, name, spy)
    return seen


@pytest.fixture
def calls(monkeypatch, torch_backend):
    """Count the calls that reach flashattn's SDPA."""
    return count_calls(monkeypatch, sdpa, "scaled_dot_product_attention")


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


def perturbed_mha(batch_first: bool) -> torch.nn.MultiheadAttention:
    """An eval-mode torch MHA with random weights and biases."""
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(64, 4, batch_first=batch_first).eval()
    with torch.no_grad():
        for p in mha.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return mha


@pytest.fixture
def fast_path_calls(monkeypatch):
    """Count the calls to torch's fused MHA fast path (which never calls scaled_dot_product_attention)."""
    return count_calls(monkeypatch, torch, "_native_multi_head_attention")


@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_attention_fast_path_is_routed(calls, fast_path_calls, batch_first):
    """Eval mode under no_grad takes torch's fast path outside the block and flashattn inside."""
    mha = perturbed_mha(batch_first)
    x = torch.randn(2, 23, 64) if batch_first else torch.randn(23, 2, 64)
    padding = torch.zeros(2, 23, dtype=torch.bool)
    padding[1, 17:] = True
    with torch.no_grad():
        oracle, _ = copy.deepcopy(mha).double()(*(x.double(),) * 3, key_padding_mask=padding, need_weights=False)
        fast_path_calls.clear()
        baseline, _ = mha(x, x, x, key_padding_mask=padding, need_weights=False)
        assert len(fast_path_calls) == (1 if batch_first else 0)  # torch's own choice, outside the block
        with flashattn.sdpa_override(), warnings.catch_warnings():
            warnings.simplefilter("error")
            out, weights = mha(x, x, x, key_padding_mask=padding, need_weights=False)
    assert weights is None and len(calls) == 1 and len(fast_path_calls) == (1 if batch_first else 0)
    assert torch.backends.mha.get_fastpath_enabled()
    # the fast path zeroes padded query rows (a nested tensor); compare the rows that are real tokens
    real = ~padding if batch_first else ~padding.T
    assert_within_rule("out", out[real], oracle[real], baseline[real], factor=2)


def test_transformer_encoder_fast_path_is_routed(calls, fast_path_calls):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True)
    encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    x = torch.randn(2, 23, 64)
    with torch.no_grad():
        oracle = copy.deepcopy(encoder).double()(x.double())
        baseline = encoder(x)
        with flashattn.sdpa_override():
            out = encoder(x)
    assert len(calls) == 2  # one per layer
    assert_within_rule("out", out, oracle, baseline, factor=2)


@pytest.mark.parametrize("grad", [False, True])
def test_need_weights_runs_torch_with_one_warning(calls, grad):
    mha = perturbed_mha(batch_first=True)
    x = torch.randn(2, 23, 64)
    with torch.set_grad_enabled(grad):
        oracle = copy.deepcopy(mha).double()(*(x.double(),) * 3)
        baseline = mha(x, x, x)
        with flashattn.sdpa_override(), pytest.warns(UserWarning, match="need_weights=True") as record:
            results = [mha(x, x, x) for _ in range(3)]
    assert len(record) == 1 and not calls
    assert "pass need_weights=False" in str(record[0].message)
    for out, weights in results:
        assert_within_rule("out", out, oracle[0], baseline[0], factor=2)
        assert_within_rule("weights", weights, oracle[1], baseline[1], factor=2)


@pytest.mark.parametrize("case", ["float64", "value-head-dim"])
def test_unsupported_calls_fall_back_to_torch_with_one_warning(calls, case):
    query, key, value = (torch.randn(1, 2, 9, 16, dtype=torch.float64) for _ in range(3))
    if case == "value-head-dim":
        query, key, value = query.float(), key.float(), torch.randn(1, 2, 9, 24)
    with flashattn.sdpa_override(), pytest.warns(UserWarning, match="using torch's") as record:
        outs = [F.scaled_dot_product_attention(query, key, value) for _ in range(3)]
        # the same reason at other sizes does not warn again
        other_value = torch.randn(1, 2, 9, 32) if case == "value-head-dim" else value
        F.scaled_dot_product_attention(query, key, other_value)
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
    original_mha = F.multi_head_attention_forward
    with pytest.raises(RuntimeError, match="inside"), flashattn.sdpa_override():
        assert not torch.backends.mha.get_fastpath_enabled()
        raise RuntimeError("raised inside the block")
    assert F.scaled_dot_product_attention is ORIGINAL and F.multi_head_attention_forward is original_mha
    assert torch.backends.mha.get_fastpath_enabled()
    with flashattn.sdpa_override():
        outer = F.scaled_dot_product_attention
        with flashattn.sdpa_override():
            assert F.scaled_dot_product_attention is outer
        assert F.scaled_dot_product_attention is outer
    assert F.scaled_dot_product_attention is ORIGINAL


def test_blocks_of_two_threads_that_end_out_of_order_restore_torch():
    """Thread A opens, B opens, A closes, B closes: the patch lasts while either block is open, and not after."""
    original_mha = F.multi_head_attention_forward
    a_open, b_open, a_closed = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def a():
        with flashattn.sdpa_override():
            a_open.set()
            b_open.wait()
        a_closed.set()

    def b():
        a_open.wait()
        with flashattn.sdpa_override():
            b_open.set()
            a_closed.wait()
            seen["patched while B is open"] = F.scaled_dot_product_attention is not ORIGINAL

    threads = [threading.Thread(target=f) for f in (a, b)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert seen == {"patched while B is open": True}
    assert F.scaled_dot_product_attention is ORIGINAL and F.multi_head_attention_forward is original_mha
    assert torch.backends.mha.get_fastpath_enabled()


def test_a_scale_flashattn_refuses_goes_to_torch():
    query = torch.randn(1, 2, 5, 16)
    with flashattn.sdpa_override(), pytest.warns(UserWarning, match="using torch's.*scale"):
        out = F.scaled_dot_product_attention(query, query, query, scale=float("inf"))
    torch.testing.assert_close(out, ORIGINAL(query, query, query, scale=float("inf")), equal_nan=True, rtol=0, atol=0)


def test_a_fast_path_turned_off_by_the_user_stays_off():
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with flashattn.sdpa_override():
            pass
        assert not torch.backends.mha.get_fastpath_enabled()
    finally:
        torch.backends.mha.set_fastpath_enabled(True)
