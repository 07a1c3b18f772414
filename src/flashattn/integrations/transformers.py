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
is one, already carries it), and padding masks read tile by tile by the masked kernels.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from ..sdpa import attention_bhle, check_arguments

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
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: query (B, H, Lq, D), key/value (B, Hk, Lk, D) ->
    ((B, Lq, H, D), None). ``attention_mask``: None or the 4-dim bool/float mask of ``sdpa_mask``."""
    check_arguments(query, key, value, attention_mask, dropout, enable_gqa=True)
    q_length = query.shape[2]
    causal_model = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    # as in transformers' sdpa: a mask, when given, already holds the causal part; one query (decoding)
    # sees the whole cache
    is_causal = bool(q_length > 1 and attention_mask is None and causal_model)
    if position_bias is not None:  # a learned additive bias (T5-style), with the mask folded in
        if attention_mask is not None and attention_mask.dtype == torch.bool:
            attention_mask = position_bias.masked_fill(~attention_mask, float("-inf"))
        else:
            attention_mask = position_bias if attention_mask is None else position_bias + attention_mask
    window = sliding_window if is_causal and sliding_window and sliding_window < key.shape[2] else None
    # A causal model's mask hides the keys past each query's position, and every cache keeps the keys in
    # position order with the last query at or before the last key: the bottom-right causal window hides
    # no more than the mask, and lets the kernels skip the tiles above the diagonal.
    out = attention_bhle(query, key, value, attention_mask, dropout, is_causal, scaling, softcap=softcap or 0.0,
                         sliding_window=window, mask_is_causal=bool(causal_model) and attention_mask is not None)
    return out.transpose(1, 2), None  # (B, Lq, H, D), contiguous: the kernels write that layout


def register() -> None:
    """Register the attention function and its mask function (transformers' sdpa masks) under
    ``ATTN_IMPLEMENTATION``. Idempotent; done on import."""
    AttentionInterface.register(ATTN_IMPLEMENTATION, attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)


register()
