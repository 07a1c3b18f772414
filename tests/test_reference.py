"""The reference itself: the mask rule, the seeds' block algorithm, and the dropout stream."""

import pytest
import torch

from flashattn import masks
from flashattn.dropout import philox_uniform
from flashattn.reference import attention_ref, seed_block_attention
from flashattn.testing import assert_within_rule


def test_causal_mask_is_bottom_right_aligned():
    rows, cols = torch.arange(2).view(-1, 1), torch.arange(5).view(1, -1)
    seen = masks.visible(rows, cols, 2, 5, -1, 0).int()
    assert seen.tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    rows, cols = torch.arange(5).view(-1, 1), torch.arange(2).view(1, -1)
    seen = masks.visible(rows, cols, 5, 2, -1, 0).int()
    assert seen.tolist() == [[0, 0], [0, 0], [0, 0], [1, 0], [1, 1]]


def test_window_mask_bounds():
    rows, cols = torch.arange(4).view(-1, 1), torch.arange(4).view(1, -1)
    seen = masks.visible(rows, cols, 4, 4, 1, 1).int()
    assert seen.tolist() == [[1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 1], [0, 0, 1, 1]]


@pytest.mark.parametrize("seqlen_q,seqlen_k,left,right", [(5, 9, 2, 0), (9, 5, -1, 0), (7, 7, 3, 2), (4, 30, -1, -1)])
def test_visible_key_range_covers_every_visible_key(seqlen_q, seqlen_k, left, right):
    seen = masks.visible(torch.arange(seqlen_q).view(-1, 1), torch.arange(seqlen_k).view(1, -1),
                         seqlen_q, seqlen_k, left, right)
    lo, hi = masks.visible_key_range(seqlen_q, seqlen_k, left, right)
    keys = seen.any(dim=0).nonzero().view(-1)
    if len(keys):
        assert lo == keys.min().item() and hi == keys.max().item() + 1


WINDOWS = [(-1, -1), (-1, 0), (2, 0), (3, 2), (0, 5), (-1, 3), (4, -1)]


@pytest.mark.parametrize("seqlen_q,seqlen_k", [(1, 1), (5, 9), (9, 5), (13, 13), (1, 17), (17, 1)])
@pytest.mark.parametrize("left,right", WINDOWS)
def test_query_range_and_full_blocks_agree_with_the_mask(seqlen_q, seqlen_k, left, right):
    """Every key block [start, end) of widths 1-4: visible_query_range is exactly the queries that see one of
    its keys, and block_fully_visible says whether all of those see all of them."""
    seen = masks.visible(torch.arange(seqlen_q).view(-1, 1), torch.arange(seqlen_k).view(1, -1),
                         seqlen_q, seqlen_k, left, right).expand(seqlen_q, seqlen_k)
    for width in range(1, 5):
        for start in range(0, seqlen_k, width):
            end = min(start + width, seqlen_k)
            block = seen[:, start:end]
            lo, hi = masks.visible_query_range(start, end, seqlen_q, seqlen_k, left, right)
            queries = block.any(dim=1).nonzero().view(-1)
            if len(queries):
                assert (lo, hi) == (queries.min().item(), queries.max().item() + 1)
                assert masks.block_fully_visible(lo, hi, start, end, seqlen_q, seqlen_k, left, right) == \
                    bool(block[lo:hi].all())
            else:
                assert lo == hi


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen,block_size", [(1, 64), (113, 32), (256, 64)])
def test_seed_block_algorithm_matches_materialized_attention(seqlen, block_size, causal):
    """The block algorithm (float32 inside) against the float64 reference: within 2x plain float32 attention's
    error, the flash-attn rule."""
    q, k, v = (torch.randn(2, seqlen, 3, 40) for _ in range(3))
    blocked = seed_block_attention(q, k, v, block_size=block_size, causal=causal)
    expected, _ = attention_ref(q.double(), k.double(), v.double(), causal=causal)
    plain, _ = attention_ref(q, k, v, causal=causal, upcast=False)
    assert_within_rule("out", blocked, expected, plain, factor=2)


def test_fully_masked_rows_give_zero_output_and_infinite_lse():
    q, k, v = (torch.randn(1, n, 2, 16, dtype=torch.float64) for n in (6, 3, 3))
    out, lse = attention_ref(q, k, v, causal=True)
    assert torch.equal(out[:, :3], torch.zeros_like(out[:, :3]))
    assert torch.isinf(lse[..., :3]).all() and torch.isfinite(lse[..., 3:]).all()


def test_philox_uniform_is_uniform_and_seeded():
    counter = torch.arange(200_000, dtype=torch.int64)
    draws = philox_uniform(1234, counter)
    assert draws.min().item() >= 0.0 and draws.max().item() < 1.0
    assert abs(draws.mean().item() - 0.5) < 0.005
    assert not torch.equal(draws, philox_uniform(1235, counter))
    assert torch.equal(draws, philox_uniform(1234, counter))


@pytest.mark.interpreter
def test_philox_uniform_matches_triton_rand():
    import triton
    import triton.language as tl

    @triton.jit
    def draw(Out, seed, offset, N: tl.constexpr):
        idx = tl.arange(0, N)
        counter = offset + idx.to(tl.int64) * 4_294_967_311  # reach the high counter word too
        tl.store(Out + idx, tl.rand(seed, counter))

    device = "cuda" if torch.cuda.is_available() else "cpu"
    out = torch.empty(1024, device=device)
    seed, offset = 2**40 + 12345, 987654321
    draw[(1,)](out, seed, offset, N=1024)
    counter = offset + torch.arange(1024, dtype=torch.int64) * 4_294_967_311
    assert torch.equal(out.cpu(), philox_uniform(seed, counter))
