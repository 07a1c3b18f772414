"""Between padded batches and packed tokens: flash-attn's ``flash_attn.bert_padding`` helpers, same names, arguments
and returns, for the varlen functions.

A padded batch (batch, seqlen, ...) with a (batch, seqlen) mask of the tokens that count becomes the packed
(total, ...) rows that :func:`flashattn.flash_attn_varlen_func` takes, with the ``cu_seqlens`` and ``max_seqlen``
that describe them; :func:`pad_input` puts the packed output back, zeros at the padding::

    x, indices, cu_seqlens, max_seqlen, _ = unpad_input(hidden, attention_mask)
    q, k, v = (t.unflatten(-1, (nheads, head_dim)) for t in project(x).chunk(3, -1))
    out = flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, causal=True)
    out = pad_input(out.flatten(-2), indices, batch, seqlen)

Gathers and scatters are differentiable (torch's indexing: a gather's gradient is a scatter into zeros, and the
reverse). ``unpad_input`` reads the mask's lengths on the host (``max_seqlen`` is an int), one synchronization.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def index_first_axis(input: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:  # noqa: A002 (flash-attn's name)
    """The rows ``input[indices]`` of ``input`` (first, ...): (len(indices), ...)."""
    _check_indices(indices)
    return input[indices]


def index_put_first_axis(values: torch.Tensor, indices: torch.Tensor, first_axis_dim: int) -> torch.Tensor:
    """A zero tensor of ``first_axis_dim`` rows with ``values`` (len(indices), ...) at the rows ``indices``."""
    _check_indices(indices)
    if values.dim() < 1 or values.shape[0] != indices.shape[0]:
        raise ValueError(f"values must have one row per index ({indices.shape[0]}), got shape {tuple(values.shape)}")
    return values.new_zeros(first_axis_dim, *values.shape[1:]).index_put((indices,), values)


def unpad_input(hidden_states: torch.Tensor, attention_mask: torch.Tensor, unused_mask: torch.Tensor | None = None):
    """The tokens of a padded batch packed: ``hidden_states`` (batch, seqlen, ...), ``attention_mask`` (batch,
    seqlen), nonzero at the tokens that count; ``unused_mask``, of the same shape, marks more tokens to keep in the
    packed rows (at the ends of their sequences, as padding the kernels are told to skip by ``seqused``).

    Returns (the kept rows (total, ...), their indices in the flattened (batch * seqlen) batch (int64), cu_seqlens
    (int32, batch + 1), the longest sequence (int), seqused (int32, batch): each sequence's tokens in
    ``attention_mask``)."""
    _check_mask("attention_mask", attention_mask, hidden_states)
    used = attention_mask.bool()
    kept = used
    if unused_mask is not None:
        _check_mask("unused_mask", unused_mask, hidden_states)
        kept = kept | unused_mask.bool()
    lengths = kept.sum(-1, dtype=torch.int32)
    indices = kept.flatten().nonzero().flatten()
    cu_seqlens = F.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))
    rows = hidden_states.flatten(0, 1)[indices]
    return rows, indices, cu_seqlens, int(lengths.max()), used.sum(-1, dtype=torch.int32)


def pad_input(hidden_states: torch.Tensor, indices: torch.Tensor, batch: int, seqlen: int) -> torch.Tensor:
    """The packed rows ``hidden_states`` (total, ...) back at ``indices`` of a (batch, seqlen, ...) batch, zeros
    elsewhere: :func:`unpad_input` undone."""
    return index_put_first_axis(hidden_states, indices, batch * seqlen).unflatten(0, (batch, seqlen))


def unpad_input_for_concatenated_sequences(hidden_states: torch.Tensor, attention_mask_in_length: torch.Tensor):
    """Packed rows for a batch whose rows each hold several sequences one after another: ``attention_mask_in_length``
    (batch, seqlen) lists each row's sequence lengths first, zeros after (``[[2, 3, 0, 0, 0, 0], [3, 2, 0, 0, 0,
    0]]``: two rows of two sequences each, one token of padding a row). Every sequence becomes one of the packed
    batch's.

    Returns (the rows (total, ...), their indices in the flattened batch, cu_seqlens (int32, sequences + 1), the
    longest sequence (int))."""
    _check_mask("attention_mask_in_length", attention_mask_in_length, hidden_states)
    if attention_mask_in_length.is_floating_point() or (attention_mask_in_length < 0).any():
        raise ValueError("attention_mask_in_length must hold non-negative integer lengths")
    seqlen = attention_mask_in_length.shape[1]
    row_totals = attention_mask_in_length.sum(-1)
    if (row_totals > seqlen).any():
        raise ValueError(f"attention_mask_in_length: a row's lengths must sum to at most seqlen = {seqlen}, got "
                         f"{row_totals.max().item()}")
    positions = torch.arange(seqlen, device=hidden_states.device)
    kept = positions < row_totals[:, None]
    lengths = attention_mask_in_length.flatten()
    lengths = lengths[lengths > 0].to(torch.int32)
    indices = kept.flatten().nonzero().flatten()
    cu_seqlens = F.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))
    return hidden_states.flatten(0, 1)[indices], indices, cu_seqlens, int(lengths.max()) if len(lengths) else 0


def _check_mask(name: str, mask, hidden_states: torch.Tensor) -> None:
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(mask).__name__}")
    if mask.dim() != 2 or hidden_states.dim() < 2 or mask.shape != hidden_states.shape[:2]:
        raise ValueError(f"{name} must be (batch, seqlen) = hidden_states.shape[:2] "
                         f"{tuple(hidden_states.shape[:2])}, got shape {tuple(mask.shape)}")
    if mask.is_complex():
        raise TypeError(f"{name} must be bool or a real number per token, got {mask.dtype}")
    if mask.device != hidden_states.device:
        raise ValueError(f"{name} must be on hidden_states' device {hidden_states.device}, got {mask.device}")


def _check_indices(indices) -> None:
    # torch's indexing bounds-checks the values; a 2-d index tensor would index otherwise than by rows
    if not isinstance(indices, torch.Tensor) or indices.dim() != 1:
        raise TypeError("indices must be a 1-d integer tensor")
