"""Kernel launches with less host time per call than ``kernel[grid](...)``: the only place that launches.

Triton's ``JITFunction.run`` does, on every call: bind the arguments and specialize each one (its generated binder),
turn the specialization and the options into a string cache key, check the kernel's global values, query the
device and stream, and build the launch metadata. For this library's kernels (20 to 45 arguments) that is tens of
microseconds of host time a launch, which short calls pay in full: at 512-1k tokens the forward's GPU time is
45-200 us, and a training step's backward makes three launches.

:func:`launch` keeps the part that decides which compiled kernel runs, Triton's own binder, so the specialization
(each tensor's dtype and 16-byte alignment, each integer's divisibility by 16 and whether it is 1, the constexprs)
is Triton's, not a copy of its rules. It keys the compiled kernel on that specialization and the launch options,
and calls the compiled kernel's launcher directly. A key seen for the first time, and any call while Triton's
launch hooks are set (a profiler), go through ``kernel[grid](...)`` unchanged.
"""

from __future__ import annotations

import threading

import torch

# (kernel, device, specialization, options, debug flags) -> the compiled kernel
_COMPILED: dict = {}


def launch(kernel, grid: tuple[int, ...], *args, **kwargs):
    """``kernel[grid](*args, **kwargs)`` on the current CUDA stream, through the compiled kernel's launcher once
    this specialization has been launched before. Returns what ``kernel[grid]`` returns the first time (the compiled
    kernel; None under the interpreter)."""
    from triton import knobs
    from triton.runtime.jit import JITFunction

    recording = getattr(RECORDING, "active", None)
    if not isinstance(kernel, JITFunction) or kernel.pre_run_hooks or hooked_launches():
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


def zeros(size: int | tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A new tensor of zeros that a kernel reads (a counter, or an accumulator it adds into): a plan's replay
    allocates its own tensors uninitialized, except these, which it zeroes too."""
    tensor = torch.zeros(size, dtype=dtype, device=device)
    recording = getattr(RECORDING, "active", None)
    if recording is not None:
        recording.zeroed.add(id(tensor))
    return tensor


def _hooked(hook) -> bool:
    """Whether a launch hook is set: Triton 3.6 keeps each as a chain of calls (empty: none), older ones as None."""
    return hook is not None and bool(getattr(hook, "calls", True))


# the call whose launches are being recorded (``plans.planned``), per thread
RECORDING = threading.local()


def hooked_launches() -> bool:
    """Whether Triton's launch hooks are set (a profiler watching each launch)."""
    from triton import knobs

    return _hooked(knobs.runtime.launch_enter_hook) or _hooked(knobs.runtime.launch_exit_hook)
