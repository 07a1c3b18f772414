"""The blocked PyTorch path (CPU tensors, FLASHATTN_BACKEND=torch) against the float64 reference."""

import pytest
from cases import CPU_SHAPES, DTYPES, OPTIONS, make_case

from flashattn import flash_attn_func
from flashattn.testing import check_against_reference


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("option_name", list(OPTIONS))
@pytest.mark.parametrize("shape", CPU_SHAPES, ids=str)
def test_torch_path_matches_reference(torch_backend, shape, option_name, dtype):
    case = make_case(shape, option_name, "cpu")
    check_against_reference(case, dtype, "cpu", flash_attn_func)
