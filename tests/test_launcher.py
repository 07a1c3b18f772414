"""flashattn.launcher.launch: the compiled kernel it reuses must be the one Triton would pick for each call's
specialization (an integer that is 1 or a multiple of 16, a tensor's 16-byte alignment), and it must launch on the
caller's stream."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from flashattn import launcher
from flashattn.launcher import launch

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@triton.jit
def _scaled_copy(source, target, n, stride, scale, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    keep = offsets < n
    tl.store(target + offsets, tl.load(source + offsets * stride, mask=keep) * scale, mask=keep)


@pytest.fixture
def counted_runs(monkeypatch):
    """How many launches went through JITFunction.run, the path ``launch`` takes only for a key it has not seen."""
    runs = []
    original = type(_scaled_copy).run

    def run(self, *args, **kwargs):
        runs.append(kwargs.get("grid"))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(type(_scaled_copy), "run", run)
    return runs


def _copy(source: torch.Tensor, n: int, stride: int, scale: float) -> torch.Tensor:
    target = torch.zeros(n, device=source.device, dtype=source.dtype)
    launch(_scaled_copy, (triton.cdiv(n, 64),), source, target, n, stride, scale, BLOCK=64)
    return target


def test_falls_back_to_the_kernel_call_off_the_gpu():
    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: ("called", grid, args, kwargs)

    assert launch(Recorder(), (3,), 1, BLOCK=4) == ("called", (3,), (1,), {"BLOCK": 4})


@pytest.mark.gpu
@gpu
def test_each_specialization_gets_its_own_compiled_kernel(counted_runs):
    launcher._COMPILED.clear()
    base = torch.randn(4096, device="cuda")
    # n and stride take the values Triton specializes on (1, multiples of 16, neither), a source off the 16-byte
    # alignment, in an order where a reused kernel of the wrong specialization would read the wrong elements
    for n, stride, offset in [(1000, 2, 0), (1, 1, 0), (1000, 1, 0), (1024, 16 // 4, 0), (1024, 1, 1), (7, 3, 1),
                              (1000, 2, 0), (1000, 1, 1), (1, 1, 0)]:
        source = base[offset:]
        for _ in range(2):  # the first launch of a key compiles, the second takes the direct path
            expected = source[: n * stride : stride] * 0.5
            torch.testing.assert_close(_copy(source, n, stride, 0.5), expected, rtol=0, atol=0)
    # one JITFunction.run per specialization: (n, stride, alignment) = (1000, 2, 16), (1, 1, 16), (1000, 1, 16),
    # (1024, 4, 16), (1024, 1, 4), (7, 3, 4), (1000, 1, 4); the repeats took the direct path
    assert len(counted_runs) == 7


@pytest.mark.gpu
@gpu
def test_launches_on_the_current_stream():
    source = torch.randn(1 << 20, device="cuda")
    _copy(source, 1 << 20, 1, 2.0)  # compiled and cached on the default stream
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(10_000_000)  # the stream is busy: a launch elsewhere would finish first
        result = _copy(source, 1 << 20, 1, 2.0)
    stream.synchronize()
    torch.testing.assert_close(result, source * 2.0, rtol=0, atol=0)
