"""benchmarks/products_ceiling.py: its kernel computes what its PyTorch reference does (on an sm90 GPU), and a length
that is not whole tiles is named."""

import sys
from pathlib import Path

import pytest
import torch
from hopper_kernels import hopper

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import products_ceiling  # noqa: E402


def test_products_names_a_length_that_is_not_whole_tiles():
    q = torch.zeros(1, 200, 1, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="seqlen"):
        products_ceiling.products(q, q, q, products_ceiling.forward_tile(128))


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_products_kernel_matches_its_reference(head_dim):
    q, k, v = (torch.randn(2, 512, 3, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = products_ceiling.products(q, k, v, products_ceiling.forward_tile(head_dim))
    ref = products_ceiling.reference(q, k, v)
    # the kernel sums each score in another order than PyTorch, so a score next to a rounding boundary may round to
    # the neighbouring 16-bit value: one ulp (2^-8 of it) on a few in 10^5 of them; a wrong row, head or block moves
    # the result by its whole size. The bound: one score in a hundred off by an ulp
    error = ((out - ref).norm() / ref.norm()).item()
    assert error < 0.1 * 2.0**-8, f"hdim {head_dim}: relative error {error:.2e}"
