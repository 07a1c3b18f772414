"""Index faults recorded by the kernels, reported without making the host wait for the GPU.

Every index a kernel reads from a tensor (a KV cache's ``cache_seqlens``, ``cache_batch_idx``, ``cache_leftpad`` and
``block_table``, a packed call's ``cu_seqlens``) is clamped into its valid range before it addresses memory, so a bad
value never reads or writes outside the tensors a call was given; a bad write target writes nothing. The KV cache's
indices are also reported: where the caller asked for it
(``check_indices="deferred"``, the default of :func:`flashattn.flash_attn_with_kvcache`), the kernel also records the
fault: slot ``i`` of a small int32 buffer per device takes ``1 +`` the batch element whose index ``FAULT_ARGUMENTS[i]``
was out of range. Recording is a store on the device, never a synchronization, so it works inside CUDA graphs.

:func:`raise_recorded_faults` reads the buffer (that read waits for the GPU), clears it, and raises naming the
arguments. The library calls it where it synchronizes anyway; a loop that never synchronizes (a CUDA graph replayed
token after token) calls it itself, e.g. every few hundred steps or at the end of a request.
"""

from __future__ import annotations

import torch

FAULT_ARGUMENTS = ("cache_seqlens", "cache_batch_idx", "cache_leftpad", "block_table")
"""The slots of the fault buffer, in order; kernels name them by index (``SLOT_*``)."""

SLOT_CACHE_SEQLENS, SLOT_CACHE_BATCH_IDX, SLOT_CACHE_LEFTPAD, SLOT_BLOCK_TABLE = range(len(FAULT_ARGUMENTS))

EXPECTED = {
    "cache_seqlens": "0 <= cache_seqlens and cache_seqlens + seqlen_new <= the cache capacity",
    "cache_batch_idx": "0 <= cache_batch_idx < the cache's rows (block_table's rows when paged)",
    "cache_leftpad": "0 <= cache_leftpad <= cache_seqlens",
    "block_table": "the pages a sequence uses in [0, num_pages)",
}

_buffers: dict[torch.device, torch.Tensor] = {}


def _device(device: torch.device | str) -> torch.device:
    """``device`` as the buffers are keyed: "cuda" is the current CUDA device."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def fault_buffer(device: torch.device) -> torch.Tensor:
    """The device's fault buffer (int32, one slot per argument), created zeroed on first use.

    Create it before capturing a CUDA graph (any call that records does): one created during capture would be
    zeroed by every replay."""
    device = _device(device)
    buffer = _buffers.get(device)
    if buffer is None:
        buffer = _buffers[device] = torch.zeros(len(FAULT_ARGUMENTS), dtype=torch.int32, device=device)
    return buffer


def is_fault_buffer(x: torch.Tensor) -> bool:
    """Whether ``x`` is a device's fault buffer (launch plans pass it by address: it is never freed)."""
    return any(x is buffer for buffer in _buffers.values())


def pending_buffer(device: torch.device) -> torch.Tensor | None:
    """The device's fault buffer if a call has made one (something may be recorded there), else None."""
    return _buffers.get(_device(device))


def raise_recorded_faults(device: torch.device | str | None = None) -> None:
    """Raise ``ValueError`` naming every argument whose index a kernel found out of range since the last call.

    Reads (waiting for the GPU) and clears the fault buffer of ``device``, or of every device used so far. Calls whose
    indices were faulty computed with the indices clamped into range: their outputs are not meaningful, but nothing
    outside the tensors they were given was read or written.
    """
    for dev in list(_buffers) if device is None else [_device(device)]:
        buffer = _buffers.get(dev)
        if buffer is not None:
            raise_from_values(dev, buffer.tolist())


def raise_from_values(device: torch.device, recorded: list[int]) -> None:
    """Raise for the faults of ``recorded``, a host copy of the device's fault buffer (which is then cleared): what
    :func:`raise_recorded_faults` does, for a caller that copied the buffer along with values of its own."""
    if not any(recorded):
        return
    _buffers[_device(device)].zero_()
    problems = [f"{name} out of range at batch element {entry - 1} (on {device}; maybe others too), expected "
                f"{EXPECTED[name]}" for name, entry in zip(FAULT_ARGUMENTS, recorded, strict=True) if entry]
    raise ValueError("flashattn recorded out-of-range indices (clamped into range, so the outputs of those calls are "
                     "not meaningful): " + "; ".join(problems))
