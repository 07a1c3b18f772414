"""flashattn as a Hugging Face transformers attention implementation.

Importing this module registers it (transformers 4.5x and 5.x)::

    from flashattn.integrations.transformers import ATTN_IMPLEMENTATION
    model = AutoModelForCausalLM.from_config(config, attn_implementation=ATTN_IMPLEMENTATION)
    model.set_attn_implementation(ATTN_IMPLEMENTATION)  # or switch a loaded model

The name has no "flash" in it: transformers 5 takes names containing "flash" for kernels to fetch from
its hub, which fails offline. The attention function follows transformers' "sdpa" implementation
(the same masks, built by the same mask function, and the same top-left ``is_causal``), computed by
:func:`flashattn.sdpa.attention_bhle`: GQA without repeating key/value heads, the config's softcap on
the scores, the sliding window through the kernels' window when there is no mask (a mask, when there
is one, already carries it, and the kernels skip the tiles it hides entirely), padding masks read tile
by tile by the masked kernels, and attention sinks (``s_aux``, GPT-OSS). As transformers' flash-attention
path does, it also takes packed batches by ``cu_seq_lens_q`` / ``cu_seq_lens_k`` (a
``DataCollatorWithFlattening`` with ``return_flash_attn_kwargs=True``), computed by
:func:`flashattn.flash_attn_varlen_func` without a mask, and a value head dim other than the query's
(multi-head latent attention): the smaller of the two is padded with zeros and the output cropped.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from ..sdpa import attention_bhle, check_arguments
from ..varlen import flash_attn_varlen_func

ATTN_IMPLEMENTATION = "tiled_attention"


def attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    position_bias: torch.Tensor | None = None,
    s_aux: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: query (B, H, Lq, D), key (B, Hk, Lk, D), value (B, Hk, Lk, Dv)
    -> ((B, Lq, H, Dv), None). ``attention_mask``: None or the 4-dim bool/float mask of ``sdpa_mask``."""
    if kwargs.get("output_attentions"):
        warnings.warn(OUTPUT_ATTENTIONS_WARNING, stacklevel=2)
    value_dim = value.shape[-1]
    if scaling is None:
        scaling = query.shape[-1] ** -0.5  # the query's own head dim, before any padding
    query, key, value = _common_head_dim(query, key, value)
    causal_model = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    if kwargs.get("cu_seq_lens_q") is not None:
        # a packed batch: each token sees its own sequence's, so the mask (built without the packing, when the
        # sliding window asked for one) is not needed
        if position_bias is not None:
            raise ValueError("a packed batch (cu_seq_lens_q) takes no position_bias: pass position_ids and an "
                             "attention mask instead of cu_seq_lens_q")
        out = _packed(query, key, value, dropout, scaling, bool(causal_model), sliding_window, softcap, s_aux,
                      kwargs)
        return out[..., :value_dim], None
    check_arguments(query, key, value, attention_mask, dropout, enable_gqa=True)
    # as in transformers' sdpa: a mask, when given, already holds the causal part; one query (decoding)
    # sees the whole cache
    is_causal = bool(query.shape[2] > 1 and attention_mask is None and causal_model)
    if position_bias is not None:  # a learned additive bias (T5-style), with the mask folded in
        if attention_mask is not None and attention_mask.dtype == torch.bool:
            attention_mask = position_bias.masked_fill(~attention_mask, float("-inf"))
        else:
            attention_mask = position_bias if attention_mask is None else position_bias + attention_mask
    window = sliding_window if is_causal and sliding_window and sliding_window < key.shape[2] else None
    out = attention_bhle(query, key, value, attention_mask, dropout, is_causal, scaling, softcap=softcap or 0.0,
                         sliding_window=window, sinks=s_aux)
    # (B, Lq, H, Dv), contiguous where no padding was cropped: the kernels write that layout
    return out.transpose(1, 2)[..., :value_dim], None


OUTPUT_ATTENTIONS_WARNING = ("flashattn never builds the attention matrix: output_attentions=True gets no attention "
                             "weights; use attn_implementation='eager' for them")


def _common_head_dim(query, key, value):
    """query, key and value with one head dim: the smaller of (query and key's, value's) padded with zeros, which
    changes neither the scores nor the output's first value_dim columns."""
    extra = query.shape[-1] - value.shape[-1]
    if extra > 0:
        value = F.pad(value, (0, extra))
    elif extra < 0:
        query, key = F.pad(query, (0, -extra)), F.pad(key, (0, -extra))
    return query, key, value


def _packed(query, key, value, dropout, scaling, causal: bool, sliding_window, softcap, sinks, kwargs):
    """A packed batch (B = 1, its sequences delimited by ``cu_seq_lens_q`` and ``cu_seq_lens_k``) by the varlen
    kernels, with the attention sinks ``sinks`` (or None): (1, total_q, H, D)."""
    if query.shape[0] != 1:
        raise ValueError(f"cu_seq_lens_q delimits the sequences of a packed batch, whose batch size must be 1, got "
                         f"query of shape {tuple(query.shape)}")
    cu_seqlens_k = kwargs.get("cu_seq_lens_k")
    if cu_seqlens_k is None:
        raise ValueError("cu_seq_lens_q was given without cu_seq_lens_k")
    window = (-1, -1)
    if causal and sliding_window:
        window = (sliding_window - 1, 0)
    q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))  # (total, heads, D) views
    cu_seqlens_q = kwargs["cu_seq_lens_q"].to(torch.int32)
    cu_seqlens_k = cu_seqlens_k.to(torch.int32)
    # a 0-d tensor stands for "not given": flash_attn_varlen_func then takes the maximum from cu_seqlens
    max_q, max_k = (cu.new_zeros(()) if kwargs.get(name) is None else kwargs[name]
                    for name, cu in (("max_length_q", cu_seqlens_q), ("max_length_k", cu_seqlens_k)))
    out = flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_q, max_k, dropout_p=dropout,
                                 softmax_scale=scaling, causal=causal, window_size=window, softcap=softcap or 0.0,
                                 learnable_sink=sinks)
    return out.unsqueeze(0)


def register() -> None:
    """Register the attention function and its mask function (transformers' sdpa masks) under
    ``ATTN_IMPLEMENTATION``. Idempotent; done on import."""
    AttentionInterface.register(ATTN_IMPLEMENTATION, attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)


register()
