"""Test setup: without a GPU, the Triton kernels run under Triton's interpreter.

TRITON_INTERPRET must be set before any kernel module is imported (Triton reads it when a function is
decorated), so it is set here, at collection time, and only on machines without CUDA.
"""

import contextlib
import os
import tempfile
import zlib

# pytest-xdist workers share the cores: each takes its share of the threads of torch, OpenMP and numpy's BLAS (the
# interpreter's), since more threads than cores spin in their barriers and slow every worker (-n 2 on 2 cores: the
# torch path's tests ran 3x slower with 2 threads each). The pools read these when numpy and torch are first imported
WORKER_THREADS = 0
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    WORKER_THREADS = max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(variable, str(WORKER_THREADS))

import pytest  # noqa: E402
import torch  # noqa: E402
from filelock import FileLock  # noqa: E402

from flashattn.launch import plans  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
if WORKER_THREADS:
    torch.set_num_threads(WORKER_THREADS)

try:
    import triton

    HAS_TRITON = True
except ImportError:
    HAS_TRITON = False


def _interpreter_patches_the_language_once_a_launch() -> None:
    """Triton 3.6's interpreter patches triton.language's builtins for a launch, and again at every call of a
    @triton.jit helper inside it (a scope it never restores), though the launch's patches are still in place: a
    fifth of an interpreted kernel's time. Here a helper's call patches only the language modules (triton.language,
    triton.language.core) that the launch has not; the launch's own patching and its restore are Triton's. Other
    Triton versions run as they are."""
    import triton.language as tl
    from triton.runtime import interpreter

    patch_lang, run_grid = interpreter._patch_lang, interpreter.GridExecutor.__call__
    patched: set[int] = set()  # ids of the language modules patched in the launch running now

    def patch_once(fn):
        wanted = {id(value) for value in fn.__globals__.values() if value is tl or value is tl.core}
        if patched and wanted <= patched:
            return interpreter._LangPatchScope()  # nothing to restore
        patched.update(wanted)
        return patch_lang(fn)

    def launch(self, *args, **kwargs):
        patched.clear()
        try:
            return run_grid(self, *args, **kwargs)
        finally:
            patched.clear()

    interpreter._patch_lang = patch_once
    interpreter.GridExecutor.__call__ = launch


if HAS_TRITON and os.environ.get("TRITON_INTERPRET") == "1" and triton.__version__ == "3.6.0":
    _interpreter_patches_the_language_once_a_launch()


def pytest_collection_modifyitems(config, items):
    _keep_shard(config, items)
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    skip_triton = pytest.mark.skip(reason="needs triton")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)
        if "interpreter" in item.keywords and not HAS_TRITON:
            item.add_marker(skip_triton)


def _keep_shard(config, items) -> None:
    """FLASHATTN_TEST_SHARD=i/n keeps the i-th of n parts of the collected tests (1 <= i <= n).

    A test's part comes from a hash of its id, so every pytest-xdist worker computes the same split, and
    the slow GPU files spread over all parts (benchmarks/gpu_suite.sh runs one part per device call).
    """
    shard = os.environ.get("FLASHATTN_TEST_SHARD", "")
    if not shard:
        return
    try:
        index, count = (int(x) for x in shard.split("/"))
    except ValueError:
        index = count = 0
    if not 1 <= index <= count:
        raise pytest.UsageError(f"FLASHATTN_TEST_SHARD must be i/n with 1 <= i <= n, got {shard!r}")
    kept, deselected = [], []
    for item in items:
        (kept if zlib.crc32(item.nodeid.encode()) % count == index - 1 else deselected).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
    items[:] = kept


@pytest.fixture(autouse=True)
def _groups_take_turns(request):
    """Tests marked ``xdist_group(name)`` run one at a time across pytest-xdist workers: the GPU tests whose float64
    references take tens of GB (cases.GPU_MEMORY_GROUP), the tests that spawn process groups. A lock file per group
    holds them to that: ``--dist loadgroup`` (pytest-xdist 3.8 under pytest 9) does not keep a group on one worker."""
    names = sorted({str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                    for mark in request.node.iter_markers("xdist_group")})
    with contextlib.ExitStack() as stack:
        for name in names:
            stack.enter_context(FileLock(os.path.join(tempfile.gettempdir(), f"flashattn-tests-{name}.lock")))
        yield


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


@pytest.fixture(autouse=True)
def seeded_by_test_id(request):
    """Each test's random inputs from a seed of its id: the same on any pytest-xdist worker and in any order, so that
    a failure repeats when the test runs alone."""
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture(autouse=True)
def fresh_launch_plans():
    """Each test records its own launch plans (``flashattn.launcher.planned``): one recorded by an earlier test would
    replay past a function, flag or table that this test patches."""

    plans.clear_plans()
    yield
    plans.clear_plans()
