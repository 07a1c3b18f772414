"""flash_attn_combine: merging attention over disjoint key sets, forward and gradients, on both backends."""

import pytest
import torch

from flashattn import flash_attn_combine, flash_attn_func
from flashattn.configs import COMBINE_TILE_ELEMENTS, combine_tiles
from flashattn.ops import attention_combine, attention_combine_backward
from flashattn.reference import attention_ref
from flashattn.testing import assert_lse_close, assert_within_rule

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def plain_combine(out_partial: torch.Tensor, lse_partial: torch.Tensor):
    """The merge written the obvious way (no empty splits): softmax of the lse over the splits."""
    weights = torch.softmax(lse_partial, dim=0)  # (S, B, H, Sq)
    out = (weights.transpose(-1, -2).unsqueeze(-1) * out_partial).sum(dim=0)
    return out, torch.logsumexp(lse_partial, dim=0)


def random_partials(splits=3, batch=2, seqlen=5, nheads=3, head_dim=24, dtype=torch.float32, device=DEVICE):
    generator = torch.Generator().manual_seed(0)
    out_partial = torch.randn(splits, batch, seqlen, nheads, head_dim, generator=generator).to(dtype).to(device)
    lse_partial = (3 * torch.randn(splits, batch, nheads, seqlen, generator=generator)).to(device)
    return out_partial, lse_partial


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_combined_chunks_equal_attention_over_all_keys(backend, dtype):
    """Attention over key chunks, merged, against attention over all keys (float64 oracle, the rule)."""
    batch, seqlen_q, seqlen_k, nheads, head_dim = 2, 9, 70, 4, 40
    generator = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(batch, n, nheads, head_dim, generator=generator).to(dtype).to(DEVICE)
               for n in (seqlen_q, seqlen_k, seqlen_k))
    bounds = [0, 5, 31, 32, 70]  # uneven chunks, one of a single key
    outs, lses = [], []
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        out, lse, _ = flash_attn_func(q, k[:, lo:hi], v[:, lo:hi], return_attn_probs=True)
        outs.append(out)
        lses.append(lse)
    out, lse = flash_attn_combine(torch.stack(outs), torch.stack(lses))
    oracle_out, oracle_lse = attention_ref(q, k, v)
    baseline_out, _ = attention_ref(q, k, v, upcast=False)
    assert out.dtype == dtype and out.shape == q.shape
    assert_within_rule("out", out, oracle_out, baseline_out, factor=2)
    assert_lse_close(lse, oracle_lse, dtype)


@pytest.mark.parametrize("splits", [3, 9], ids=lambda n: f"splits{n}")  # 9: three steps of the kernel's 4
def test_matches_plain_merge(backend, splits):
    out_partial, lse_partial = random_partials(splits)
    out, lse = flash_attn_combine(out_partial, lse_partial)
    expected_out, expected_lse = plain_combine(out_partial.double(), lse_partial.double())
    assert_within_rule("out", out, expected_out, plain_combine(out_partial, lse_partial)[0], factor=2)
    torch.testing.assert_close(lse.double(), expected_lse, rtol=0, atol=4e-6)


def test_one_split_is_the_identity(backend):
    out_partial, lse_partial = random_partials(splits=1)
    out, lse = flash_attn_combine(out_partial, lse_partial)
    torch.testing.assert_close(out, out_partial[0], rtol=0, atol=0)
    torch.testing.assert_close(lse, lse_partial[0], rtol=0, atol=0)


@pytest.mark.parametrize("splits", [4, 10], ids=lambda n: f"splits{n}")  # 10: empty splits in later steps too
def test_empty_splits_are_ignored(backend, splits):
    """lse = +inf (flashattn's empty row) or -inf marks a split that saw no key: weight 0, its output
    never read (even NaN); all splits empty gives 0 and lse = +inf; gradients stay finite."""
    out_partial, lse_partial = random_partials(splits=splits)
    empty = [1, 3] if splits == 4 else [1, 3, 5, 8, 9]
    lse_partial[empty[0::2]] = float("inf")
    lse_partial[empty[1::2]] = float("-inf")
    out_partial[empty[0::2]] = float("nan")
    out_partial[empty[1::2]] = float("inf")
    lse_partial[:, 0, :, 2] = float("inf")  # row (batch 0, token 2): every split empty
    out_partial = out_partial.requires_grad_()
    lse_partial = lse_partial.requires_grad_()
    out, lse = flash_attn_combine(out_partial, lse_partial)
    kept = [s for s in range(splits) if s not in empty]
    expected_out, expected_lse = plain_combine(out_partial[kept].double(), lse_partial[kept].double())
    rows = torch.ones_like(lse, dtype=torch.bool)
    rows[0, :, 2] = False
    torch.testing.assert_close(lse[rows].double(), expected_lse[rows], rtol=0, atol=4e-6)
    torch.testing.assert_close(out.transpose(1, 2)[rows].double(), expected_out.transpose(1, 2)[rows],
                               rtol=0, atol=4e-6)
    assert torch.equal(out[0, 2], torch.zeros_like(out[0, 2])) and (lse[0, :, 2] == float("inf")).all()
    (out.sum() + lse[rows].sum()).backward()
    assert torch.isfinite(out_partial.grad).all() and torch.isfinite(lse_partial.grad).all()
    assert (out_partial.grad[empty] == 0).all() and (lse_partial.grad[empty] == 0).all()
    assert (out_partial.grad[:, 0, 2] == 0).all() and (lse_partial.grad[:, 0, :, 2] == 0).all()


def test_gradcheck_float64():
    """Both outputs (out and lse) differentiated against finite differences, on the torch path."""
    out_partial, lse_partial = random_partials(splits=3, batch=1, seqlen=3, nheads=2, head_dim=5, device="cpu")
    inputs = (out_partial.double().requires_grad_(), lse_partial.double().requires_grad_())
    assert torch.autograd.gradcheck(flash_attn_combine, inputs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_gradients_match_plain_merge(backend, dtype):
    """Gradients to out_partial and lse_partial, through out and lse, held to the rule (factor 3)."""
    out_partial, lse_partial = random_partials(dtype=dtype)
    generator = torch.Generator().manual_seed(2)
    dout = torch.randn(out_partial.shape[1:], generator=generator).to(dtype).to(DEVICE)
    dlse = torch.randn(lse_partial.shape[1:], generator=generator).to(DEVICE)

    def grads(function, out_p, lse_p):
        out_p, lse_p = out_p.detach().requires_grad_(), lse_p.detach().requires_grad_()
        out, lse = function(out_p, lse_p)
        return torch.autograd.grad((out, lse), (out_p, lse_p), (dout.to(out.dtype), dlse.to(lse.dtype)))

    ours = grads(flash_attn_combine, out_partial, lse_partial)
    oracle = grads(plain_combine, out_partial.double(), lse_partial.double())
    baseline = grads(plain_combine, out_partial, lse_partial)
    assert ours[0].dtype == dtype and ours[1].dtype == torch.float32
    assert_within_rule("d out_partial", ours[0], oracle[0], baseline[0], factor=3)
    assert_within_rule("d lse_partial", ours[1], oracle[1], baseline[1], factor=3, floor=1e-6)


def test_strided_inputs_and_flash_attn_3_layout(backend):
    """flash-attn 3 stores lse as (splits, batch, seqlen, nheads): its transpose is a valid input."""
    out_partial, lse_partial = random_partials()
    lse_fa3 = lse_partial.transpose(-1, -2).contiguous()
    out, lse = flash_attn_combine(out_partial, lse_fa3.transpose(-1, -2))
    expected_out, expected_lse = flash_attn_combine(out_partial, lse_partial)
    torch.testing.assert_close(out, expected_out, rtol=0, atol=0)
    torch.testing.assert_close(lse, expected_lse, rtol=0, atol=0)
    padded = torch.zeros(*out_partial.shape[:-1], 32, device=DEVICE)
    padded[..., :24] = out_partial
    out_strided, _ = flash_attn_combine(padded[..., :24], lse_partial)
    torch.testing.assert_close(out_strided, expected_out, rtol=0, atol=0)


def test_out_dtype(backend):
    out_partial, lse_partial = random_partials()
    out, lse = flash_attn_combine(out_partial, lse_partial, out_dtype=torch.bfloat16)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32


def test_bad_input_is_refused():
    out_partial, lse_partial = random_partials()
    with pytest.raises(ValueError, match=r"lse_partial must have shape \(num_splits, batch, nheads, seqlen\)"):
        flash_attn_combine(out_partial, lse_partial.transpose(-1, -2))
    with pytest.raises(ValueError, match="out_partial must have 5 dimensions"):
        flash_attn_combine(out_partial[0], lse_partial)
    with pytest.raises(TypeError, match="lse_partial must be float32 or float64"):
        flash_attn_combine(out_partial, lse_partial.half())
    with pytest.raises(TypeError, match="out_partial must be float16, bfloat16, float32 or float64"):
        flash_attn_combine(out_partial.int(), lse_partial)
    with pytest.raises(ValueError, match="at least one split"):
        flash_attn_combine(out_partial[:0], lse_partial[:0])
    for out_dtype in (torch.int32, "float16"):
        with pytest.raises(TypeError, match="out_dtype must be None or float16"):
            flash_attn_combine(out_partial, lse_partial, out_dtype=out_dtype)


def test_custom_ops_pass_opcheck(backend):
    """Schema, fake (torch.compile) and dispatch checks of the two combine ops."""
    out_partial, lse_partial = random_partials(splits=2, batch=1, seqlen=2, nheads=2, head_dim=8)
    torch.library.opcheck(attention_combine, (out_partial, lse_partial))
    dout = torch.randn(out_partial.shape[1:], device=DEVICE)
    dlse = torch.randn(lse_partial.shape[1:], device=DEVICE)
    torch.library.opcheck(attention_combine_backward, (dout, dlse, out_partial, lse_partial))


@pytest.mark.parametrize("num_splits", [2, 9, 33, 128])
@pytest.mark.parametrize("rows", [1, 32, 512, 4128])
@pytest.mark.parametrize("block_d", [32, 128, 256])
def test_combine_tiles_fill_the_gpu_within_the_tile_budget(num_splits, rows, block_d):
    tiles = combine_tiles(num_splits, rows, block_d, processors=132, interpret=False)
    assert tiles.split_block >= min(num_splits, 128)
    assert block_d % tiles.chunk_d == 0
    assert tiles.split_block * tiles.block_m * tiles.chunk_d <= COMBINE_TILE_ELEMENTS
    programs = -(-rows // tiles.block_m) * (block_d // tiles.chunk_d)
    smallest = tiles.block_m == 1 and tiles.chunk_d == 16
    assert programs >= 2 * 132 or smallest, tiles
    if tiles.block_m < 16:  # rows shrink only as far as needed
        assert -(-rows // (2 * tiles.block_m)) * (block_d // tiles.chunk_d) < 2 * 132 or \
            tiles.split_block * 2 * tiles.block_m * tiles.chunk_d > COMBINE_TILE_ELEMENTS


@pytest.mark.gpu
@pytest.mark.parametrize("splits", [1, 7, 33, 64])
@pytest.mark.parametrize("shape", [(8, 129, 32, 128), (1, 1, 32, 128), (2, 1, 12, 40), (1, 3, 8, 256)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_large_merge_on_gpu(monkeypatch, splits, shape, dtype):
    monkeypatch.setenv("FLASHATTN_BACKEND", "triton")
    batch, seqlen, nheads, head_dim = shape
    out_partial, lse_partial = random_partials(splits, batch=batch, seqlen=seqlen, nheads=nheads, head_dim=head_dim,
                                               dtype=dtype, device="cuda")
    out, lse = flash_attn_combine(out_partial, lse_partial)
    expected_out, expected_lse = plain_combine(out_partial.double(), lse_partial.double())
    assert_within_rule("out", out, expected_out, plain_combine(out_partial, lse_partial)[0], factor=2)
    torch.testing.assert_close(lse.double(), expected_lse, rtol=0, atol=1e-5)
    torch.cuda.synchronize()
