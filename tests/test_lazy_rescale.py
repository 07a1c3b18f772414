"""The Hopper 16-bit forward's lazy rescale (``forward_hopper.lazy_max``), mirrored in PyTorch on the CPU.

The Gluon kernel runs only on an sm90 GPU (tests/test_forward_hopper.py); this mirror keeps its
block order, its 64-row warpgroups (aligned to row 0, as the causal tiles counted from the end are) and its
decision: a warpgroup moves its rows' max only when some row's would grow by more than the threshold, and P takes the
max in use. The sums and the lse are in base 2 as in the kernel.
"""

import math

import pytest
import torch

from flashattn.reference import attention_ref

ROWS_PER_WARPGROUP = 64
THRESHOLDS = (None, 0.0, 0.8, 8.0)  # None: rescale every block; 8: the 16-bit kernel's at hdim 256


def lazy_block_attention(q, k, v, causal, block_n, threshold):
    """One head: q (seqlen_q, D), k and v (seqlen_k, D) float32 -> (out, lse, largest P, blocks skipped, blocks)."""
    seqlen_q, seqlen_k = q.shape[0], k.shape[0]
    scale_log2 = q.shape[1] ** -0.5 / math.log(2)
    rows = torch.arange(seqlen_q).view(-1, 1)
    groups = torch.arange(seqlen_q) // ROWS_PER_WARPGROUP
    m = torch.full((seqlen_q,), float("-inf"))
    l = torch.zeros(seqlen_q)
    acc = torch.zeros(seqlen_q, v.shape[1])
    largest_p, skipped, decisions = 0.0, 0, 0
    for start in range(0, seqlen_k, block_n):
        cols = torch.arange(start, min(start + block_n, seqlen_k))
        s = (q @ k[cols].T) * scale_log2
        if causal:  # bottom-right aligned
            s = torch.where(cols.view(1, -1) <= rows + (seqlen_k - seqlen_q), s, float("-inf"))
        m_new = torch.maximum(m, s.amax(dim=1))
        rescale = torch.ones(seqlen_q, dtype=torch.bool)
        if threshold is not None:
            padded = torch.nn.functional.pad(m_new > m + threshold, (0, -seqlen_q % ROWS_PER_WARPGROUP))
            grown = padded.view(-1, ROWS_PER_WARPGROUP).any(dim=1)
            rescale = grown[groups]
            m_new = torch.where(rescale, m_new, m)
            decisions += grown.numel()
            skipped += int((~grown).sum())
        m_use = torch.where(m_new == float("-inf"), 0.0, m_new)
        p = torch.exp2(s - m_use[:, None])
        alpha = torch.exp2(m - m_use)
        assert torch.all(alpha[~rescale & (m > float("-inf"))] == 1.0)  # a skipped rescale multiplies by exactly 1
        largest_p = max(largest_p, float(p.max()))
        l = l * alpha + p.sum(dim=1)
        acc = torch.where(rescale[:, None], acc * alpha[:, None], acc)
        acc = acc + p @ v[cols]
        m = m_new
    empty = l == 0
    l_safe = torch.where(empty, 1.0, l)
    out = acc / l_safe[:, None]
    lse = torch.where(empty, float("inf"), (m + torch.log2(l_safe)) * math.log(2))
    return out, lse, largest_p, skipped, decisions


def _errors(seqlen_q, seqlen_k, causal, block_n, threshold, scale=1.0, seed=0):
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(n, 64, generator=generator) for n in (seqlen_q, seqlen_k, seqlen_k))
    q = q * scale
    out_ref, lse_ref = attention_ref(q[None, :, None], k[None, :, None], v[None, :, None], causal=causal)
    out_ref, lse_ref = out_ref[0, :, 0], lse_ref[0, 0]
    out, lse, largest_p, skipped, decisions = lazy_block_attention(q, k, v, causal, block_n, threshold)
    eager, eager_lse, *_ = lazy_block_attention(q, k, v, causal, block_n, None)
    seen = torch.isfinite(lse_ref)
    assert torch.equal(torch.isfinite(lse), seen), "a row that sees no key: lse +inf, as the kernels"
    assert torch.all(out[~seen] == 0)

    def error(x, ref):
        return float((x.double() - ref).abs().max()) if seen.any() else 0.0

    return (error(out[seen], out_ref[seen]), error(eager[seen], out_ref[seen]), error(lse[seen], lse_ref[seen]),
            error(eager_lse[seen], lse_ref[seen]), largest_p, skipped, decisions)


@pytest.mark.parametrize("threshold", THRESHOLDS)
@pytest.mark.parametrize("seqlen_q,seqlen_k,causal", [
    (1, 1, False), (1, 113, True), (113, 113, False), (113, 113, True), (113, 203, True), (203, 113, False),
    (256, 64, True),  # bottom-right causal with seqlen_q > seqlen_k: the first 192 rows see no key
])
@pytest.mark.parametrize("block_n", [64, 128])
def test_lazy_rescale_matches_the_reference(seqlen_q, seqlen_k, causal, block_n, threshold):
    out_err, eager_err, lse_err, eager_lse_err, largest_p, _, _ = _errors(seqlen_q, seqlen_k, causal, block_n,
                                                                          threshold, scale=2.0)
    # float32 against float64: at most twice the error of the mirror that rescales every block
    assert out_err <= 2 * eager_err + 1e-6, (out_err, eager_err)
    assert lse_err <= 2 * eager_lse_err + 1e-6, (lse_err, eager_lse_err)
    assert largest_p <= 2 ** (threshold or 0) * (1 + 1e-6)


def test_lazy_rescale_skips_where_the_max_settles():
    """Scores of N(0, 1) inputs settle after the first blocks: a threshold of 8 skips every later rescale, one of
    0.8 some; and a max that climbs by about 6 log2 units a block takes both branches and still gives the
    reference's result."""
    *_, skipped, decisions = _errors(128, 1024, False, 64, 8.0)
    assert skipped == decisions - 2  # the first block sets each warpgroup's max
    *_, skipped, decisions = _errors(128, 1024, False, 64, 0.8)
    assert 0 < skipped < decisions - 2
    generator = torch.Generator().manual_seed(1)
    q = torch.ones(70, 64)
    k = torch.randn(512, 64, generator=generator) * 0.01 + torch.linspace(0, 4, 512).view(-1, 1)  # climbing scores
    v = torch.randn(512, 64, generator=generator)
    out, lse, largest_p, skipped, decisions = lazy_block_attention(q, k, v, False, 64, 8.0)
    out_ref, lse_ref = attention_ref(q[None, :, None], k[None, :, None], v[None, :, None])
    assert 0 < skipped < decisions - 2 and 1 < largest_p <= 2**8
    assert float((out.double() - out_ref[0, :, 0]).abs().max()) < 1e-5
    assert float((lse.double() - lse_ref[0, 0]).abs().max()) < 1e-5
