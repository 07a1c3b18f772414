"""Launch plans: every launch of one call, recorded the first time a call signature comes and replayed after.

A short call spends most of its host time choosing kernels, tiles and streams, building descriptors and binding
launch arguments; a replay skips all of it. The key (:func:`planned`) is what decides every launch: the options, the
inputs' shapes, strides, dtypes, devices and 16-byte alignment, and the tiles ``configs.use_config`` forces. It does
not see the tables or other module constants: after patching one, call :func:`clear_plans`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .. import configs
from ..faults import is_fault_buffer
from ..validation import DERIVE_MAX_SEQLEN
from . import launcher
from .backward import GradientStreams
from .common import tma_workspace
from .launcher import hooked_launches

# signature key -> LaunchPlan, or None for a call that cannot be replayed (it then always takes its own path)
_PLANS: dict = {}
# a bound on the plans kept: one per (shapes, strides, dtype, alignment, options) seen; a training run has a few
MAX_PLANS = 512


def plannable(inputs: tuple, alibi_slopes=None, rng_state=None, attn_mask=None) -> bool:
    """Whether a CUDA call may take a launch plan: no ALiBi, dropout or SDPA mask (their values or random state
    are not in the key), and inputs the kernels read in place (a last dimension of stride 1: otherwise the call
    copies them, which a replay would not). None stands for an absent optional input."""
    return (alibi_slopes is None and rng_state is None and attn_mask is None
            and all(x is None or x.stride(-1) == 1 for x in inputs))


def varlen_plannable(inputs: tuple, max_seqlen_q: int, max_seqlen_k: int, alibi_slopes, rng_state) -> bool:
    """Whether a packed call may take a launch plan (``plannable``): only with both max lengths given as ints and
    cu_seqlens on the GPU. A length to derive, like cu_seqlens on the CPU, is read on the host (and checked), and it
    sizes the grid, so it cannot be keyed."""
    return (DERIVE_MAX_SEQLEN not in (max_seqlen_q, max_seqlen_k) and all(x is None or x.is_cuda for x in inputs)
            and plannable(inputs, alibi_slopes, rng_state))


def planned(phase: str, inputs: tuple, options, call):
    """``call()`` (the ``phase`` op's own path on ``inputs``) through its launch plan, keyed on what decides every
    launch of the call: the options (the op's scalars), the inputs' shapes, strides, dtypes, devices and 16-byte
    alignment (None for an absent one), the current device, the forced tiles and torch's deterministic switch
    (``AttentionOptions.repeatable``)."""
    from triton import knobs

    # a list comprehension, not a generator: this key is most of a short replayed call's host time
    signatures = [None if x is None else (x.shape, x.stride(), x.dtype, x.get_device(), x.data_ptr() % 16 == 0)
                  for x in inputs]
    key = (phase, options, *signatures, torch.cuda.current_device(), configs.forced_configs(), knobs.runtime.debug,
           knobs.compilation.instrumentation_mode, torch.are_deterministic_algorithms_enabled())
    return record_or_replay(key, inputs, call, GradientStreams, tma_workspace)


_PLANS: dict = {}
# a bound on the plans kept: one per (shapes, strides, dtype, alignment, options) seen; a training run has a few
MAX_PLANS = 512


class _HostDescriptor(NamedTuple):
    """What Triton 3.6's ``make_tensordesc_arg`` reads of a host-side TMA descriptor (base, shape, strides,
    padding): a replay makes one over each new base, for that encoding or for Triton's launcher, as building a Gluon
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
    direct: _DirectLaunch | None


class _DirectLaunch(NamedTuple):
    """A step's launch through its compiled kernel's own C launcher, with the arguments expanded as Triton's
    ``wrap_handle_tensordesc`` expands them on every launch: a Python loop over every argument and a TMA descriptor
    encoded per descriptor (five a Hopper decode step). Here the expansion is a template made once, and each
    descriptor's encoding is kept per base address (its shape, strides and block are fixed by the plan's key), so a
    replay writes addresses and cached descriptors into a copy of the template."""

    launcher: object  # the C launcher: (grid, stream, function, flags, scratch, metadata, hooks, *arguments)
    prefix: tuple  # what it takes before the stream and after: see :meth:`run`
    template: list  # the expanded arguments, None where an address or a descriptor goes
    address_slots: tuple  # (expanded position, tensor slot)
    # (expanded position, tensor slot of its base, encode(base) -> the expanded value, {address: value})
    descriptor_slots: tuple

    def run(self, grid: tuple[int, int, int], stream: int, tensors: list, addresses: list) -> None:
        values = self.template.copy()
        for position, slot in self.address_slots:
            values[position] = addresses[slot]
        for position, slot, encode, encoded in self.descriptor_slots:
            value = encoded.get(addresses[slot])
            if value is None:
                if len(encoded) >= _MAX_DESCRIPTORS:
                    encoded.clear()
                value = encoded[addresses[slot]] = encode(tensors[slot])
            values[position] = value
        self.launcher(*grid, stream, *self.prefix, *values)


# descriptors kept per descriptor argument of a plan: a serving loop's cache has one address, its queries a few
_MAX_DESCRIPTORS = 64


def _direct_launch(compiled, values: list, constants: list, tensor_slots: tuple,
                   descriptor_slots: tuple) -> _DirectLaunch | None:
    """The :class:`_DirectLaunch` of a step recorded with argument ``values`` (``constants`` where they are not
    slots), or None where its launcher is not the form it expects (Triton 3.6's
    ``CudaLauncher``: a C launcher, wrapped when the kernel takes descriptors) or the kernel needs scratch memory."""
    launcher = compiled.run
    if getattr(launcher, "global_scratch_size", 1) or getattr(launcher, "profile_scratch_size", 1):
        return None
    c_launcher, metas = launcher.launch, {}
    if descriptor_slots:
        free = dict(zip(getattr(c_launcher.__code__, "co_freevars", ()), c_launcher.__closure__ or (), strict=True))
        if not {"launcher", "tensordesc_indices", "tensordesc_meta"} <= free.keys():
            return None
        indices = sorted(free["tensordesc_indices"].cell_contents)
        metas = dict(zip(indices, free["tensordesc_meta"].cell_contents, strict=True))
        c_launcher = free["launcher"].cell_contents
    from triton.backends.nvidia.driver import make_tensordesc_arg

    descriptors = {d[0]: d for d in descriptor_slots}
    addresses = dict(tensor_slots)
    template, address_slots, encoded_slots = [], [], []
    for position, value in enumerate(values):
        if position in addresses:
            address_slots.append((len(template), addresses[position]))
            template.append(None)
        elif position in descriptors:
            _, slot, *fields = descriptors[position]
            meta = metas.get(position)
            # Triton's expansion: a value that depends on the base's address (the encoded descriptor, or for a
            # descriptor the kernel builds on the device the base itself), then shapes and strides that the plan fixes
            first, *rest = make_tensordesc_arg(value, meta)
            if meta is None:
                address_slots.append((len(template), slot))
            else:
                def encode(base, fields=fields, meta=meta):
                    return make_tensordesc_arg(_HostDescriptor(base, *fields), meta)[0]

                encoded_slots.append((len(template), slot, encode, {value.base.data_ptr(): first}))
            template.extend([None, *rest])
        else:
            template.append(constants[position])
    return _DirectLaunch(c_launcher, (compiled.function, launcher.launch_cooperative_grid, launcher.launch_pdl, None,
                                      None, compiled.packed_metadata, None, None, None),
                         template, tuple(address_slots), tuple(encoded_slots))


class LaunchPlan:
    """A call's launches as templates: the tensors are slots (the call's inputs first, then what the call allocated),
    everything else is the recorded value. ``replay(inputs)`` allocates the call's new tensors, launches each step on
    the stream it was recorded on (the current one, or the second stream that ``fork`` makes) and returns the result's
    tensors. Valid only for calls whose key fixes every value but the tensors (:func:`record_or_replay`)."""

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
            if step.side_stream:
                if streams is None:
                    streams = self.fork(inputs[0].device)
                    side_stream = streams.side.cuda_stream
                with streams.first():  # the workspace of a kernel's descriptors is allocated on its stream
                    _run(step, tensors, addresses, side_stream)
            else:
                _run(step, tensors, addresses, stream)
        if streams is not None:
            streams.join()
        return tuple(tensors[slot] for slot in self.result_slots)


def _run(step: _Step, tensors: list, addresses: list, stream: int) -> None:
    if step.direct is not None:
        step.direct.run(step.grid, stream, tensors, addresses)
        return
    compiled = step.compiled
    compiled.run(*step.grid, stream, compiled.function, compiled.packed_metadata, None, None, None,
                 *_arguments(step, tensors, addresses))


def _arguments(step: _Step, tensors: list, addresses: list) -> list:
    """The step's arguments for Triton's launcher: the recorded values, with the tensors' addresses and descriptors
    over the tensors in their slots."""
    values = step.constants.copy()
    for position, slot in step.tensor_slots:
        values[position] = addresses[slot]
    for position, slot, *rest in step.descriptor_slots:
        values[position] = _HostDescriptor(tensors[slot], *rest)
    return values


def record_or_replay(key, inputs: tuple, call, fork=None, allocator=None):
    """``call()``, which launches kernels on ``inputs`` only (``launch``) and returns a tuple of tensors, through its
    plan for ``key`` once recorded (:func:`planned` builds the key).

    The caller's contract: ``key`` fixes every value the call computes except the tensors' contents and addresses,
    that is, the inputs' shapes, strides, dtypes, device and 16-byte alignment, the options, and every switch the
    call reads; the call's new tensors are ``torch.empty`` ones that its kernels write in full (a replay allocates
    them uninitialized) or made by :func:`zeros`, and it launches its second-stream work inside
    ``fork(device).first()``. The first call of a key runs ``call`` and records its launches; a call that passes a
    kernel a view of its inputs or of a new tensor (a dtype view too), or returns a new tensor that no kernel writes,
    is never replayed.

    Which inputs are one tensor is part of the key: a plan maps each argument to the slot of the input it was, so a
    plan recorded on ``(x, x, x)`` would pass the last input three times to a call with three tensors."""
    if hooked_launches() or getattr(launcher.RECORDING, "active", None) is not None:
        return call()  # a call inside another's recording (a whole decode step around its op) is part of that plan
    key = (key, _same_tensors(inputs))
    plan = _PLANS.get(key, _UNSEEN)
    if plan is None:
        return call()
    if plan is not _UNSEEN:
        return plan.replay(inputs)
    recording = _Recording(torch.cuda.current_stream(), torch.cuda.current_device())
    launcher.RECORDING.active = recording
    try:
        result = call()
    finally:
        launcher.RECORDING.active = None
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
            # a new tensor: its own storage that a kernel writes, or an empty one. Not a view, nor a tensor on the
            # storage of an input or of another new tensor: a dtype view (``x.view(torch.uint8)``) has no _base,
            # and a replay would allocate it apart from the tensor it views
            storage = x.untyped_storage().data_ptr()
            if x._base is not None or storage in storages or not (written or x.numel() == 0):
                return None
            if x.numel():
                storages.add(storage)
            allocations.append((x.size(), x.stride(), x.dtype, x.device, id(x) in self.zeroed))
            slots[id(x)] = slot = len(inputs) + len(allocations) - 1
            return slot

        steps = []
        for compiled, grid, values, side_stream in self.launches:
            constants, tensor_slots, descriptor_slots = list(values), [], []
            for position, value in enumerate(values):
                if isinstance(value, torch.Tensor) and is_fault_buffer(value):
                    constants[position] = value.data_ptr()  # one buffer per device, kept for the process's life
                    continue
                if isinstance(value, torch.Tensor):
                    tensor_slots.append((position, slot_of(value, True)))
                elif isinstance(getattr(value, "base", None), torch.Tensor):
                    # Gluon's descriptors carry a shared-memory layout, Triton's (the Triton forward's) none
                    descriptor_slots.append((position, slot_of(value.base, True), tuple(value.shape),
                                             tuple(value.strides), tuple(value.block_shape),
                                             getattr(value, "layout", None), value.padding))
                else:
                    continue
                constants[position] = None
            if any(slot is None for _, slot in tensor_slots) or any(d[1] is None for d in descriptor_slots):
                return None
            tensor_slots, descriptor_slots = tuple(tensor_slots), tuple(descriptor_slots)
            steps.append(_Step(compiled, grid, constants, tensor_slots, descriptor_slots, side_stream,
                               _direct_launch(compiled, values, constants, tensor_slots, descriptor_slots)))
        result_slots = tuple(slot_of(x, False) for x in result)
        if not steps or any(slot is None for slot in result_slots):
            return None
        needs_allocator = any(compiled.metadata.global_scratch_size > 0 for compiled, *_ in self.launches)
        return LaunchPlan(allocations, steps, result_slots, fork, allocator if needs_allocator else None,
                          self.device_index)
