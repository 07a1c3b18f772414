"""flashattn: FlashAttention (IO-aware exact attention) in pure Python.

Triton kernels on the GPU, blocked PyTorch on the CPU, one flash-attn compatible API.
"""

from .interface import flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func
from .varlen import flash_attn_varlen_func, flash_attn_varlen_kvpacked_func, flash_attn_varlen_qkvpacked_func

__version__ = "0.1.0"

__all__ = [
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "__version__",
]
