"""Test setup: without a GPU, the Triton kernels run under Triton's interpreter.

TRITON_INTERPRET must be set before any kernel module is imported (Triton reads it when a function is
decorated), so it is set here, at collection time, and only on machines without CUDA.
"""

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

try:
    import triton  # noqa: F401

    HAS_TRITON = True
except ImportError:
    HAS_TRITON = False


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    skip_triton = pytest.mark.skip(reason="needs triton")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)
        if "interpreter" in item.keywords and not HAS_TRITON:
            item.add_marker(skip_triton)


@pytest.fixture(params=["torch", pytest.param("triton", marks=pytest.mark.interpreter)])
def backend(request, monkeypatch):
    """Each test twice: on the PyTorch path, and on the Triton kernels (the interpreter without a GPU)."""
    monkeypatch.setenv("FLASHATTN_BACKEND", request.param)
    return request.param


@pytest.fixture
def triton_backend(monkeypatch):
    """Route the ops to the Triton kernels: the GPU when there is one, else the interpreter on CPU."""
    monkeypatch.setenv("FLASHATTN_BACKEND", "triton")
    return "cuda" if HAS_CUDA else "cpu"


@pytest.fixture
def torch_backend(monkeypatch):
    monkeypatch.setenv("FLASHATTN_BACKEND", "torch")
    return "cpu"
