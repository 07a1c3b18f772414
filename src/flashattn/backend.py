"""Which implementation runs a call: the ops dispatch by device, and ``FLASHATTN_BACKEND`` overrides it.

``FLASHATTN_BACKEND=torch`` runs the PyTorch path on any device; ``FLASHATTN_BACKEND=triton`` runs the Triton
kernels, on CPU tensors only under Triton's interpreter (``TRITON_INTERPRET=1``, set before triton is imported).
"""

from __future__ import annotations

import os

import torch

from .configs import gpu_family


def backend_override() -> str | None:
    """The value of FLASHATTN_BACKEND ('torch' or 'triton'), or None to dispatch by device."""
    value = os.environ.get("FLASHATTN_BACKEND", "").strip().lower()
    if value in ("", "auto"):
        return None
    if value not in ("torch", "triton"):
        raise ValueError(f"FLASHATTN_BACKEND must be 'torch', 'triton' or unset, got {value!r}")
    return value


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def backend_for_cpu_tensors() -> str:
    """'torch', or 'triton' where FLASHATTN_BACKEND=triton asks for the kernels on CPU tensors.

    Only Triton's interpreter runs kernels on CPU tensors; compiled for a GPU, a launch would be handed host
    pointers, so that case is refused here with what to change.
    """
    backend = backend_override() or "torch"
    if backend == "triton" and not interpreting():
        raise ValueError("FLASHATTN_BACKEND=triton got CPU tensors: the Triton kernels run on CPU tensors only "
                         "under Triton's interpreter (TRITON_INTERPRET=1, set before triton is imported). "
                         "Move the tensors to the GPU, or unset FLASHATTN_BACKEND for the PyTorch path.")
    return backend


def description(device_type: str) -> str:
    """Which implementation flash_attn_func would run on tensors of this device type, and why."""
    override = backend_override()  # raises ValueError on a bad FLASHATTN_BACKEND
    if override == "torch":
        return "torch (blocked PyTorch), forced by FLASHATTN_BACKEND=torch"
    if override == "triton":
        if device_type == "cpu" and not interpreting():
            return "triton, forced by FLASHATTN_BACKEND=triton (CPU tensors also need TRITON_INTERPRET=1)"
        return "triton, forced by FLASHATTN_BACKEND=triton"
    if device_type == "cuda":
        if gpu_family(torch.device("cuda")) == "hopper":
            return ("triton (default on CUDA); on this sm90 GPU the forward at head dim 128 / 256 and non-causal 64 "
                    "from 2k tokens, the dQ at head dim 128 / 256 and the dK/dV at head dim 256 (16-bit, causal or "
                    "no mask) run the Hopper kernels")
        return "triton (default on CUDA)"
    return "torch (blocked PyTorch, default on CPU)"
