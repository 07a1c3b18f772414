"""flashattn: FlashAttention (IO-aware exact attention) in pure Python.

Triton kernels on the GPU, blocked PyTorch on the CPU, one flash-attn compatible API.

The submodules ``flashattn.nn`` (attention modules), ``flashattn.distributed`` (ring attention over a process
group) and ``flashattn.integrations`` come with the package;
``flashattn.integrations.transformers`` imports transformers, so it loads on first use.
"""

from . import distributed, integrations, nn
from .faults import raise_recorded_faults
from .interface import flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func
from .kvcache import flash_attn_combine, flash_attn_with_kvcache
from .sdpa import scaled_dot_product_attention, sdpa_override
from .varlen import flash_attn_varlen_func, flash_attn_varlen_kvpacked_func, flash_attn_varlen_qkvpacked_func

__version__ = "0.1.0"

__all__ = [
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
    "flash_attn_combine",
    "scaled_dot_product_attention",
    "sdpa_override",
    "raise_recorded_faults",
    "distributed",
    "integrations",
    "nn",
    "__version__",
]
