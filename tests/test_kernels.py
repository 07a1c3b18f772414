"""The Triton kernels against the float64 reference.

On a machine without a GPU they run under Triton's interpreter on small shapes; on the GPU machine
the same tests run on CUDA, and the ``gpu``-marked ones add the large shapes.
"""

import pytest
import torch
from cases import DTYPES, GPU_SHAPES, INTERPRETER_SHAPES, OPTIONS, make_case

from flashattn import flash_attn_func
from flashattn.testing import check_against_reference


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("option_name", list(OPTIONS))
@pytest.mark.parametrize("shape", INTERPRETER_SHAPES, ids=str)
def test_kernels_match_reference(triton_backend, shape, option_name, dtype):
    case = make_case(shape, option_name, triton_backend)
    check_against_reference(case, dtype, triton_backend, flash_attn_func)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("option_name", list(OPTIONS))
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=str)
def test_kernels_match_reference_large(triton_backend, shape, option_name, dtype):
    case = make_case(shape, option_name, "cuda")
    check_against_reference(case, dtype, "cuda", flash_attn_func)
    torch.cuda.synchronize()
