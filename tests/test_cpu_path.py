"""The blocked PyTorch path (CPU tensors, FLASHATTN_BACKEND=torch) against the float64 reference."""

import pytest
from cases import CPU_SHAPES, DTYPES, OPTIONS, covering, make_case

from flashattn import flash_attn_func
from flashattn.testing import check_against_reference


# Pairwise (cases.covering): each option on every shape and in every dtype, not all three at once (the path
# computes in float32 whatever the input dtype; 1023 queries and keys take several key blocks)
@pytest.mark.parametrize("shape,option_name,dtype", covering(CPU_SHAPES, list(OPTIONS), DTYPES), ids=str)
def test_torch_path_matches_reference(torch_backend, shape, option_name, dtype):
    case = make_case(shape, option_name, "cpu")
    check_against_reference(case, dtype, "cpu", flash_attn_func)
