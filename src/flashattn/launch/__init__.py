"""The launch layer: allocate outputs, choose tiles from ``configs``, launch the kernels; launch plans replay a call's
launches for later calls of the same signature."""

from .plans import clear_plans

__all__ = ["clear_plans"]
