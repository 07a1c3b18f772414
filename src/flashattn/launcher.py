"""Kernel launches with less host time per call than ``kernel[grid](...)``.

Triton's ``JITFunction.run`` does, on every call: bind the arguments and specialize each one (its generated binder),
turn the specialization and the options into a string cache key, check the kernel's global values, query the
device and stream, and build the launch metadata. For this library's kernels (20 to 45 arguments) that is tens of
microseconds of host time a launch, which short calls pay in full: at 512-1k tokens the forward's GPU time is
45-200 us, and a training step's backward makes three launches (docs/perf-notes.md, version 13.1).

:func:`launch` keeps the part that decides which compiled kernel runs, Triton's own binder, so the specialization
(each tensor's dtype and 16-byte alignment, each integer's divisibility by 16 and whether it is 1, the constexprs)
is Triton's, not a copy of its rules. It keys the compiled kernel on that specialization and the launch options,
and calls the compiled kernel's launcher directly. A key seen for the first time, and any call while Triton's
launch hooks are set (a profiler), go through ``kernel[grid](...)`` unchanged.
"""

from __future__ import annotations

import threading
from typing import NamedTuple

import torch

# (kernel, device, specialization, options, debug flags) -> the compiled kernel
_COMPILED: dict = {}


def launch(kernel, grid: tuple[int, ...], *args, **kwargs):
    """``kernel[grid](*args, **kwargs)`` on the current CUDA stream, through the compiled kernel's launcher once
    this specialization has been launched before. Returns what ``kernel[grid]`` returns the first time (the compiled
    kernel; None under the interpreter)."""
    from triton import knobs
    from triton.runtime.jit import JITFunction

    recording = getattr(_RECORDING, "active", None)
    if not isinstance(kernel, JITFunction) or kernel.pre_run_hooks or _hooked_launches():
        if recording is not None:
            recording.complete = False
        return kernel[grid](*args, **kwargs)  # the interpreter, or someone watching each launch
    device = torch.cuda.current_device()
    binder = kernel.device_caches[device][4]
    bound, specialization, options = binder(*args, **kwargs)
    key = (kernel, device, tuple(specialization), tuple(options.items()), knobs.runtime.debug,
           knobs.compilation.instrumentation_mode)
    compiled = _COMPILED.get(key)
    if compiled is None:
        compiled = kernel[grid](*args, **kwargs)  # compiles (or loads) and launches it
        _COMPILED[key] = compiled
    else:
        grid_x, grid_y, grid_z = (*grid, 1, 1)[:3]
        compiled.run(grid_x, grid_y, grid_z, torch.cuda.current_stream(device).cuda_stream, compiled.function,
                     compiled.packed_metadata, None, None, None, *bound.values())
    if recording is not None:
        recording.add(compiled, grid, bound.values())
    return compiled


def zeros(size: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A new tensor of zeros that a kernel reads (a counter): a plan's replay allocates its own tensors
    uninitialized, except these, which it zeroes too."""
    tensor = torch.zeros(size, dtype=dtype, device=device)
    recording = getattr(_RECORDING, "active", None)
    if recording is not None:
        recording.zeroed.add(id(tensor))
    return tensor


def _hooked(hook) -> bool:
    """Whether a launch hook is set: Triton 3.6 keeps each as a chain of calls (empty: none), older ones as None."""
    return hook is not None and bool(getattr(hook, "calls", True))


# ---------------------------------------------------------------------------------------------
# Launch plans: every launch of one call, recorded once per call signature and replayed.
# ---------------------------------------------------------------------------------------------

# signature key -> LaunchPlan, or None for a call that cannot be replayed (it then always takes its own path)
_PLANS: dict = {}
# a bound on the plans kept: one per (shapes, strides, dtype, alignment, options) seen; a training run has a few
MAX_PLANS = 512
_RECORDING = threading.local()


class _HostDescriptor(NamedTuple):
    """What a compiled kernel's launcher reads of a host-side TMA descriptor (Triton 3.6's
    ``make_tensordesc_arg``: base, shape, strides, padding): a replay builds one per call, as building a Gluon
    ``TensorDescriptor`` (its checks) costs several microseconds."""

    base: torch.Tensor
    shape: tuple
    strides: tuple
    block_shape: tuple
    layout: object
    padding: str


class _Step(NamedTuple):
    compiled: object
    grid: tuple[int, int, int]
    constants: list  # every argument, with None where a tensor or descriptor goes
    tensor_slots: tuple  # (argument position, tensor slot)
    # (argument position, tensor slot of its base, shape, strides, block shape, layout, padding)
    descriptor_slots: tuple
    side_stream: bool


class LaunchPlan:
    """A call's launches as templates: the tensors are slots (the call's inputs first, then what the call allocated),
    everything else is the recorded value. ``replay(inputs)`` allocates the call's new tensors, launches each step on
    the stream it was recorded on (the current one, or the second stream that ``fork`` makes) and returns the result's
    tensors. Valid only for calls whose key fixes every value but the tensors (:func:`planned`)."""

    def __init__(self, allocations: list, steps: list, result_slots: tuple, fork, allocator, device_index: int):
        self.device_index = device_index
        self.allocations = allocations
        self.steps = steps
        self.result_slots = result_slots
        self.fork = fork
        self.allocator = allocator

    def replay(self, inputs: tuple) -> tuple:
        tensors = list(inputs)
        for size, stride, dtype, device, zeroed in self.allocations:
            new = torch.empty_strided(size, stride, dtype=dtype, device=device)
            tensors.append(new.zero_() if zeroed else new)
        if self.allocator is not None:
            import triton

            triton.set_allocator(self.allocator)  # the allocator is per thread: the backward runs on autograd's
        streams = side_stream = None
        stream = torch._C._cuda_getCurrentRawStream(self.device_index)  # what Triton's launch reads, less its wrapping
        # the launcher takes an int as the address itself; for a tensor it asks the driver whether its data_ptr() is
        # a device address, once per argument and launch (the key holds every input's device)
        addresses = [None if x is None else x.data_ptr() for x in tensors]
        for step in self.steps:
            values = step.constants.copy()
            for position, slot in step.tensor_slots:
                values[position] = addresses[slot]
            for position, slot, *rest in step.descriptor_slots:
                values[position] = _HostDescriptor(tensors[slot], *rest)
            if step.side_stream:
                if streams is None:
                    streams = self.fork(inputs[0].device)
                    side_stream = streams.side.cuda_stream
                with streams.first():  # the workspace of a kernel's descriptors is allocated on its stream
                    _run(step, values, side_stream)
            else:
                _run(step, values, stream)
        if streams is not None:
            streams.join()
        return tuple(tensors[slot] for slot in self.result_slots)


def _run(step: _Step, values: list, stream: int) -> None:
    compiled = step.compiled
    compiled.run(*step.grid, stream, compiled.function, compiled.packed_metadata, None, None, None, *values)


def planned(key, inputs: tuple, call, fork=None, allocator=None):
    """``call()``, which launches kernels on ``inputs`` only (``launch``) and returns a tuple of tensors, through its
    plan for ``key`` once recorded.

    The caller's contract: ``key`` fixes every value the call computes except the tensors' contents and addresses,
    that is, the inputs' shapes, strides, dtypes, device and 16-byte alignment, the options, and every switch the
    call reads; the call's new tensors are ``torch.empty`` ones that its kernels write in full (a replay allocates
    them uninitialized) or made by :func:`zeros`, and it launches its second-stream work inside
    ``fork(device).first()``. The first call of a key runs ``call`` and records its launches; a call that makes a view
    of its inputs, or returns a new tensor that no kernel writes, is never replayed.

    Which inputs are one tensor is part of the key: a plan maps each argument to the slot of the input it was, so a
    plan recorded on ``(x, x, x)`` would pass the last input three times to a call with three tensors."""
    if _hooked_launches() or getattr(_RECORDING, "active", None) is not None:
        return call()  # a call inside another's recording (a whole decode step around its op) is part of that plan
    key = (key, _same_tensors(inputs))
    plan = _PLANS.get(key, _UNSEEN)
    if plan is None:
        return call()
    if plan is not _UNSEEN:
        return plan.replay(inputs)
    recording = _Recording(torch.cuda.current_stream(), torch.cuda.current_device())
    _RECORDING.active = recording
    try:
        result = call()
    finally:
        _RECORDING.active = None
    if len(_PLANS) >= MAX_PLANS:
        _PLANS.clear()
    _PLANS[key] = recording.plan(inputs, result, fork, allocator)
    return result


def _same_tensors(inputs: tuple) -> tuple[int, ...] | None:
    """For each input, the position of the first input that is the same tensor object; None when all differ (the
    usual case, checked first). Absent inputs (None) are told apart by the caller's key."""
    present = [id(x) for x in inputs if x is not None]
    if len(set(present)) == len(present):
        return None
    first: dict[int, int] = {}
    return tuple(first.setdefault(id(x), position) for position, x in enumerate(inputs))


def clear_plans() -> None:
    """Forget every recorded plan: after a change that the plans' keys do not see (a patched function or table)."""
    _PLANS.clear()


_UNSEEN = object()


class _Recording:
    def __init__(self, stream, device_index: int):
        self.stream = stream
        self.device_index = device_index
        self.launches: list = []
        self.zeroed: set[int] = set()  # the ids of the call's new tensors made by ``zeros``
        self.complete = True  # False once a launch went around ``launch``'s compiled-kernel path (not recorded)

    def add(self, compiled, grid: tuple[int, ...], values) -> None:
        self.launches.append((compiled, (*grid, 1, 1)[:3], list(values), torch.cuda.current_stream() != self.stream))

    def plan(self, inputs: tuple, result: tuple, fork, allocator) -> LaunchPlan | None:
        if not self.complete:
            return None
        slots = {id(x): slot for slot, x in enumerate(inputs) if x is not None}
        storages = {x.untyped_storage().data_ptr() for x in inputs if x is not None}
        allocations: list = []

        def slot_of(x: torch.Tensor, written: bool) -> int | None:
            slot = slots.get(id(x))
            if slot is not None:
                return slot
            # a new tensor: its own storage (not a view of an input) that a kernel writes, or an empty one
            if x._base is not None or x.untyped_storage().data_ptr() in storages or not (written or x.numel() == 0):
                return None
            allocations.append((x.size(), x.stride(), x.dtype, x.device, id(x) in self.zeroed))
            slots[id(x)] = slot = len(inputs) + len(allocations) - 1
            return slot

        steps = []
        for compiled, grid, values, side_stream in self.launches:
            constants, tensor_slots, descriptor_slots = list(values), [], []
            for position, value in enumerate(values):
                if isinstance(value, torch.Tensor):
                    tensor_slots.append((position, slot_of(value, True)))
                elif isinstance(getattr(value, "base", None), torch.Tensor):
                    descriptor_slots.append((position, slot_of(value.base, True), tuple(value.shape),
                                             tuple(value.strides), tuple(value.block_shape), value.layout,
                                             value.padding))
                else:
                    continue
                constants[position] = None
            if any(slot is None for _, slot in tensor_slots) or any(d[1] is None for d in descriptor_slots):
                return None
            steps.append(_Step(compiled, grid, constants, tuple(tensor_slots), tuple(descriptor_slots), side_stream))
        result_slots = tuple(slot_of(x, False) for x in result)
        if not steps or any(slot is None for slot in result_slots):
            return None
        needs_allocator = any(compiled.metadata.global_scratch_size > 0 for compiled, *_ in self.launches)
        return LaunchPlan(allocations, steps, result_slots, fork, allocator if needs_allocator else None,
                          self.device_index)


def _hooked_launches() -> bool:
    from triton import knobs

    return _hooked(knobs.runtime.launch_enter_hook) or _hooked(knobs.runtime.launch_exit_hook)
