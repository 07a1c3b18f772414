"""benchmarks/decode_read_floor.py: its read-only kernel reads every element of K and V once (under Triton's
interpreter on the CPU), whatever the chunking, including a partial last block."""

from __future__ import annotations

import benchmark_scripts
import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the interpreter without a GPU


@pytest.fixture(scope="module")
def script():
    return benchmark_scripts.load("decode_read_floor")


@pytest.mark.parametrize("elements, programs, block", [(4096, 4, 256), (3000, 3, 256), (1000, 8, 64), (77, 2, 128)])
def test_read_once_sums_every_element_once(script, elements, programs, block):
    generator = torch.Generator().manual_seed(elements)
    k = torch.randn(elements, generator=generator).to(DEVICE)
    v = (torch.rand(elements, generator=generator) + 0.5).to(DEVICE)  # an element read twice or skipped moves the sum
    expected = (k.double().sum() + v.double().sum()).item()
    got = script.read_sum(k, v, programs=programs, block=block)
    assert got == pytest.approx(expected, rel=1e-5, abs=1e-3)
