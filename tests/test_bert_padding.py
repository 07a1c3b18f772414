"""flashattn.bert_padding: flash-attn's helpers between padded batches and packed tokens."""

import pytest
import torch

from flashattn import flash_attn_varlen_func
from flashattn.bert_padding import (
    index_first_axis,
    index_put_first_axis,
    pad_input,
    unpad_input,
    unpad_input_for_concatenated_sequences,
)
from flashattn.reference import attention_ref
from flashattn.testing import assert_within_rule, score_grad_floor


def test_unpad_and_pad_round_trip():
    hidden = torch.randn(3, 7, 2, 5)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0, 0], [0, 0, 1, 1, 1, 1, 0]])
    rows, indices, cu_seqlens, max_seqlen, seqused = unpad_input(hidden, mask)
    assert torch.equal(rows, hidden[mask.bool()])
    assert torch.equal(indices, torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 18, 19]))
    assert cu_seqlens.dtype == torch.int32 and cu_seqlens.tolist() == [0, 7, 10, 14]
    assert max_seqlen == 7 and isinstance(max_seqlen, int)
    assert seqused.dtype == torch.int32 and seqused.tolist() == [7, 3, 4]
    assert torch.equal(pad_input(rows, indices, 3, 7), hidden * mask[..., None, None])


def test_unused_tokens_stay_in_the_rows_but_not_in_seqused():
    hidden = torch.randn(2, 5, 3)
    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 0, 0]], dtype=torch.bool)
    unused = torch.tensor([[0, 0, 1, 1, 0], [0, 0, 0, 1, 0]], dtype=torch.bool)
    rows, indices, cu_seqlens, max_seqlen, seqused = unpad_input(hidden, mask, unused)
    assert indices.tolist() == [0, 1, 2, 3, 5, 6, 7, 8]
    assert cu_seqlens.tolist() == [0, 4, 8] and max_seqlen == 4 and seqused.tolist() == [2, 3]
    assert torch.equal(rows, hidden.flatten(0, 1)[indices])


def test_concatenated_sequences():
    hidden = torch.randn(2, 6, 3)
    lengths = torch.tensor([[2, 3, 0, 0, 0, 0], [3, 2, 1, 0, 0, 0]])
    rows, indices, cu_seqlens, max_seqlen = unpad_input_for_concatenated_sequences(hidden, lengths)
    assert indices.tolist() == [0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 11]
    assert cu_seqlens.tolist() == [0, 2, 5, 8, 10, 11] and max_seqlen == 3
    assert torch.equal(rows, hidden.flatten(0, 1)[indices])


def test_gathers_and_scatters_carry_gradients():
    source = torch.randn(6, 4, requires_grad=True)
    indices = torch.tensor([4, 0, 2])
    picked = index_first_axis(source, indices)
    placed = index_put_first_axis(picked * 2, indices, 6)
    grad = torch.randn(6, 4)
    placed.backward(grad)
    expected = torch.zeros(6, 4)
    expected[indices] = 2 * grad[indices]
    assert torch.equal(source.grad, expected)


def test_a_padded_batch_through_the_varlen_kernels_matches_each_sequence(torch_backend):
    """unpad, flash_attn_varlen_func, pad: each sequence as if alone, the padding zeros, and the gradients through
    the gathers and scatters (the rule: 2x float32 PyTorch's error for outputs, 3x for gradients)."""
    batch, seqlen, nheads, head_dim = 3, 23, 2, 40
    lengths = [23, 9, 1]
    mask = torch.arange(seqlen)[None] < torch.tensor(lengths)[:, None]
    qkv = torch.randn(batch, seqlen, 3, nheads, head_dim, requires_grad=True)
    rows, indices, cu_seqlens, max_seqlen, _ = unpad_input(qkv, mask)
    out = flash_attn_varlen_func(*rows.unbind(1), cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, causal=True)
    padded = pad_input(out, indices, batch, seqlen)
    grad = torch.randn_like(padded)
    (dqkv,) = torch.autograd.grad(padded, qkv, grad)
    assert torch.equal(padded[~mask], torch.zeros_like(padded[~mask]))
    assert torch.equal(dqkv[~mask], torch.zeros_like(dqkv[~mask]))
    for b, n in enumerate(lengths):
        leaves, dout = qkv[b:b + 1, :n].detach().requires_grad_(), grad[b:b + 1, :n]
        results = {}
        for upcast in (True, False):
            reference, _ = attention_ref(*leaves.unbind(2), causal=True, upcast=upcast)
            results[upcast] = reference, torch.autograd.grad(reference, leaves, dout.to(reference.dtype))[0]
        out, oracle = padded[b:b + 1, :n], results[True][0]
        assert_within_rule(f"out {b}", out, oracle, results[False][0], factor=2)
        # dQ and dK round where exact arithmetic gives 0 (a sequence of one token): the scores' gradient's floor
        floor = score_grad_floor(dout, out, oracle, leaves[:, :, 2]) * leaves.abs().max().item() * head_dim**-0.5
        assert_within_rule(f"dqkv {b}", dqkv[b:b + 1, :n], results[True][1], results[False][1], factor=3, floor=floor)


@pytest.mark.parametrize(("call", "error", "match"), [
    (lambda: unpad_input(torch.randn(2, 5, 3), torch.ones(2, 4)), ValueError, r"attention_mask must be \(batch"),
    (lambda: unpad_input(torch.randn(2, 5, 3), [[1] * 5] * 2), TypeError, "attention_mask must be a torch.Tensor"),
    (lambda: unpad_input(torch.randn(2, 5, 3), torch.ones(2, 5), torch.ones(5)), ValueError, "unused_mask must be"),
    (lambda: index_first_axis(torch.randn(4, 2), torch.zeros(2, 2, dtype=torch.long)), TypeError, "indices must be"),
    (lambda: index_put_first_axis(torch.randn(3, 2), torch.tensor([0, 1]), 4), ValueError, "one row per index"),
    (lambda: unpad_input_for_concatenated_sequences(torch.randn(1, 4, 2), torch.tensor([[3, 2, 0, 0]])), ValueError,
     "must sum to at most seqlen = 4"),
    (lambda: unpad_input_for_concatenated_sequences(torch.randn(1, 4, 2), torch.tensor([[3, -1, 0, 0]])), ValueError,
     "non-negative integer lengths"),
])
def test_bad_input_is_refused(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_indices_out_of_range_raise():
    with pytest.raises(IndexError):
        index_first_axis(torch.randn(4, 2), torch.tensor([4]))
