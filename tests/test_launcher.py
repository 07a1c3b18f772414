"""flashattn.launch.launcher.launch: the compiled kernel it reuses must be the one Triton would pick for each call's
specialization (an integer that is 1 or a multiple of 16, a tensor's 16-byte alignment), and it must launch on the
caller's stream."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import NamedTuple

import pytest
import torch
import triton
import triton.language as tl

from flashattn.launch import launcher, plans
from flashattn.launch.launcher import launch

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


# ------------------------------------------------------------------------------------------------------------------
# Launch plans (plans.record_or_replay): what a recorded call's replay launches, checked without a GPU on a fake
# compiled kernel; tests/test_launch_plans.py runs the real calls on the GPU.
# ------------------------------------------------------------------------------------------------------------------


class _FakeCompiled:
    def __init__(self, scratch: int = 0):
        self.function, self.packed_metadata = "function", "metadata"
        self.metadata = SimpleNamespace(global_scratch_size=scratch)
        self.run = None  # not Triton's launcher: the plan launches it through ``_run``


class _FakeDescriptor(NamedTuple):
    base: torch.Tensor
    shape: list
    strides: list
    block_shape: list
    layout: str
    padding: str


@pytest.fixture
def replayed_launches(monkeypatch):
    """The (grid, arguments, side stream) of every step a replay runs, in order."""
    runs = []
    monkeypatch.setattr(plans, "_run", lambda step, tensors, addresses, stream: runs.append(
        (step.grid, plans._arguments(step, tensors, addresses), step.side_stream)))
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device_index: 0, raising=False)
    return runs


def _recorded(*launches, complete: bool = True) -> plans._Recording:
    recording = plans._Recording(stream=None, device_index=0)
    recording.launches.extend(launches)
    recording.complete = complete
    return recording


def test_a_replay_puts_the_new_inputs_and_fresh_outputs_where_the_recorded_ones_were(replayed_launches):
    q, k = torch.randn(2, 8, 4), torch.randn(2, 8, 4)
    out = torch.empty_strided((2, 8, 4), (32, 1, 8))  # a strided output: the replay allocates the same strides
    descriptor = _FakeDescriptor(k, [16, 4], [4, 1], [8, 4], "layout", "zero")
    recording = _recorded((_FakeCompiled(), (3, 2, 1), [q, out, 8, 0.5, "tf32", None, descriptor], False))
    plan = recording.plan((q, k), (out, q, torch.empty(0)), fork=None, allocator=None)

    new_q, new_k = torch.randn(2, 8, 4), torch.randn(2, 8, 4)
    result = plan.replay((new_q, new_k))
    [(grid, values, side_stream)] = replayed_launches
    assert grid == (3, 2, 1) and not side_stream
    # tensors go to the launcher as their addresses (an int skips its check of the pointer)
    assert values[0] == new_q.data_ptr() and values[2:6] == [8, 0.5, "tf32", None]
    new_out = result[0]
    assert values[1] == new_out.data_ptr() and new_out is not out
    assert (new_out.shape, new_out.stride(), new_out.dtype) == (out.shape, out.stride(), out.dtype)
    assert result[1] is new_q and result[2].numel() == 0
    assert values[6].base is new_k
    assert (values[6].shape, values[6].strides, values[6].block_shape, values[6].padding) == \
        ((16, 4), (4, 1), (8, 4), "zero")
    # the recorded tensors are not kept: the plan holds slots
    assert all(value is None for value in plan.steps[0].constants[:2])


def test_absent_optional_inputs_keep_their_slots(replayed_launches):
    q, table = torch.randn(4), torch.randn(2)
    out = torch.empty(4)
    plan = _recorded((_FakeCompiled(), (1, 1, 1), [q, out, table], False)).plan((q, None, table), (out,), None, None)
    new_q, new_table = torch.randn(4), torch.randn(2)
    result = plan.replay((new_q, None, new_table))
    [(_, values, _)] = replayed_launches
    assert values == [new_q.data_ptr(), result[0].data_ptr(), new_table.data_ptr()]


def test_second_stream_steps_run_inside_one_fork_joined_at_the_end(replayed_launches):
    events = []

    class Fork:
        side = SimpleNamespace(cuda_stream=1)

        def __init__(self, device):
            events.append("fork")

        def first(self):
            events.append("first")
            return contextlib.nullcontext()

        def join(self):
            events.append("join")

    q = torch.randn(4)
    recording = _recorded((_FakeCompiled(), (1, 1, 1), [q], False), (_FakeCompiled(), (2, 1, 1), [q], True),
                          (_FakeCompiled(), (3, 1, 1), [q], False))
    plan = recording.plan((q,), (q,), fork=Fork, allocator=None)
    plan.replay((torch.randn(4),))
    assert [grid[0] for grid, _, _ in replayed_launches] == [1, 2, 3]
    assert [side for _, _, side in replayed_launches] == [False, True, False]
    assert events == ["fork", "first", "join"]


def test_the_allocator_is_kept_only_for_kernels_with_global_scratch():
    q = torch.randn(4)
    assert _recorded((_FakeCompiled(0), (1, 1, 1), [q], False)).plan((q,), (q,), None, "alloc").allocator is None
    assert _recorded((_FakeCompiled(64), (1, 1, 1), [q], False)).plan((q,), (q,), None, "alloc").allocator == "alloc"


def test_calls_a_replay_could_not_reproduce_get_no_plan():
    q = torch.randn(4, 4)
    written = torch.empty(4)
    compiled = _FakeCompiled()
    # a view of an input is not a new tensor: a replay would allocate instead of viewing
    assert _recorded((compiled, (1, 1, 1), [q[1:]], False)).plan((q,), (q,), None, None) is None
    # a new tensor in the result that no kernel wrote (a zeros or a copy, made outside the launches)
    assert _recorded((compiled, (1, 1, 1), [q, written], False)).plan((q,), (torch.zeros(3),), None, None) is None
    # a new tensor that a kernel sees through a dtype view (no _base) and another as itself: a replay would allocate
    # the two apart, and the reader's would be unwritten
    vt = torch.empty(4, dtype=torch.float8_e4m3fn)
    assert _recorded((compiled, (1, 1, 1), [q, vt.view(torch.uint8)], False),
                     (compiled, (1, 1, 1), [vt, written], False)).plan((q,), (written,), None, None) is None
    # a launch that went around the recorder, and a call with no launch at all
    assert _recorded((compiled, (1, 1, 1), [q], False), complete=False).plan((q,), (q,), None, None) is None
    assert _recorded().plan((q,), (q,), None, None) is None
    # and the written one is fine
    assert _recorded((compiled, (1, 1, 1), [q, written], False)).plan((q,), (written,), None, None) is not None


def test_inputs_that_are_one_tensor_get_their_own_plan(monkeypatch):
    """A plan recorded on (x, x) maps both arguments to one slot: a call on two tensors must record its own."""
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(plans, "_PLANS", {})
    calls = []

    def call():
        calls.append(1)
        return ()

    x, a, b = torch.randn(4), torch.randn(4), torch.randn(4)
    for inputs in ((x, x), (a, b), (a, a), (b, a)):
        plans.record_or_replay("same key", inputs, call)
    # (x, x) and (a, a) share a plan key, as do (a, b) and (b, a): two recordings (no launch: no plan, so the
    # later calls of a key run their own path too)
    assert len(calls) == 4 and len(plans._PLANS) == 2


class _TritonLauncher:
    """Triton 3.6's ``CudaLauncher`` as a plan sees it: its C launcher wrapped by Triton's own
    ``wrap_handle_tensordesc`` (a kernel whose first descriptor is encoded on the host, its second built on the
    device)."""

    global_scratch_size = profile_scratch_size = 0
    launch_cooperative_grid, launch_pdl = False, True

    def __init__(self, c_launcher):
        from triton.backends.nvidia.driver import wrap_handle_tensordesc

        signature = {"q": "*fp32", "n": "i32", "desc": "tensordesc<fp32[8, 4]>", "dev_desc": "tensordesc<fp32[8, 4]>"}
        self.launch = wrap_handle_tensordesc(c_launcher, signature, [{"swizzle": 0}, None])


def test_a_direct_launch_passes_what_tritons_launcher_would(monkeypatch):
    """A plan's step calls the C launcher itself with the arguments that Triton's wrapper would expand (each descriptor
    into its encoding, or its base, then shapes and strides), and encodes a host descriptor once per base address."""
    import triton.backends.nvidia.driver as driver

    real_expand = driver.make_tensordesc_arg
    encoded = []

    def expand(arg, metadata):  # the host encoding needs a GPU driver: a stand-in that names the base's address
        if metadata is None:
            return real_expand(arg, metadata)
        encoded.append(arg.base.data_ptr())
        return [("tensor map", arg.base.data_ptr()), *arg.shape, *arg.strides]

    monkeypatch.setattr(driver, "make_tensordesc_arg", expand)
    calls = []
    compiled = _FakeCompiled()
    compiled.run = _TritonLauncher(lambda *args: calls.append(list(args)))
    q, k, v = torch.randn(8), torch.randn(16, 4), torch.randn(16, 4)
    host, device = (_FakeDescriptor(x, (16, 4), (4, 1), (8, 4), "layout", "zero") for x in (k, v))
    plan = _recorded((compiled, (3, 1, 1), [q, 7, host, device], False)).plan((q, k, v), (q,), None, None)
    (step,) = plan.steps
    assert step.direct is not None

    new_q, new_k, new_v = torch.randn(8), torch.randn(16, 4), torch.randn(16, 4)
    for _ in range(2):
        tensors = [new_q, new_k, new_v]
        addresses = [x.data_ptr() for x in tensors]
        plans._run(step, tensors, addresses, stream=5)
    direct = calls[-1]
    compiled.run.launch(3, 1, 1, 5, *step.direct.prefix, *plans._arguments(step, tensors, addresses))
    wrapped = calls[-1]
    # the wrapper gets tensors where the plan passes their addresses
    assert direct == [x.data_ptr() if isinstance(x, torch.Tensor) else x for x in wrapped]
    assert direct[4:13] == ["function", False, True, None, None, "metadata", None, None, None]
    assert ("tensor map", new_k.data_ptr()) in direct and new_v.data_ptr() in direct
    # the recording's base encoded once when planned, the new one once for two replays (and once by the wrapper)
    assert encoded == [k.data_ptr(), new_k.data_ptr(), new_k.data_ptr()]
