"""The CPU suite's budget: `bash .ci/run` (install, ruff, the tests in one pytest-xdist worker a core) is to stay
within 8 minutes on 2 cores. Most of the time goes to the Triton kernels under the interpreter, seconds a case, so
their cases are counted here: a grid that adds kernel branches covers them pairwise (tests/cases.covering), not as a
cartesian product of near-identical cases. Raise the count only with a measured run of .ci/run.
"""

import os

import pytest
import torch

INTERPRETER_CASES = 300  # the suite has 300; its pytest run takes 4 minutes on 2 cores with Triton's cache empty


@pytest.mark.skipif(torch.cuda.is_available(), reason="the budget is the CPU suite's")
def test_interpreter_cases_stay_within_the_ci_budget(request):
    if os.environ.get("FLASHATTN_TEST_SHARD"):
        pytest.skip("counts the whole suite")
    # every pytest-xdist worker collects the whole suite; a run of some files or -k counts fewer
    cases = [item.nodeid for item in request.session.items if "interpreter" in item.keywords]
    assert len(cases) <= INTERPRETER_CASES, (
        f"{len(cases)} test cases run the kernels under the interpreter, more than the {INTERPRETER_CASES} that fit "
        "the CI budget: cover the new branches pairwise (tests/cases.covering) or measure .ci/run and raise the count")
