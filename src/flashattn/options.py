"""The options of one attention call, carried as one frozen value from the interface to the launcher."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AttentionOptions:
    """What a single attention call computes, beyond its tensors.

    ``window_left`` / ``window_right`` follow flash-attn: -1 means unbounded on that side, and causal
    attention is stored as ``window_right == 0``. See :func:`flashattn.masks.visible` for the rule.
    """

    softmax_scale: float
    window_left: int = -1
    window_right: int = -1
    softcap: float = 0.0
    dropout_p: float = 0.0
    deterministic: bool = False

    @classmethod
    def build(
        cls,
        head_dim: int,
        softmax_scale: float | None,
        causal: bool,
        window_size: tuple[int, int],
        softcap: float,
        dropout_p: float,
        deterministic: bool,
    ) -> AttentionOptions:
        left, right = (int(w) for w in window_size)
        if causal:
            right = 0
        scale = 1.0 / math.sqrt(head_dim) if softmax_scale is None else float(softmax_scale)
        return cls(scale, left, right, float(softcap), float(dropout_p), bool(deterministic))

    def op_arguments(self) -> tuple[float, int, int, float, float]:
        """The scalars a custom op takes in this object's place (ops take only tensors and scalars), in their order:
        ``ops`` rebuilds the object from them."""
        return self.softmax_scale, self.window_left, self.window_right, self.softcap, self.dropout_p

    @property
    def masked(self) -> bool:
        """Whether a causal or window mask hides part of the scores (tile choices differ then)."""
        return self.window_left >= 0 or self.window_right >= 0


def new_rng_state() -> torch.Tensor:
    """A (seed, offset) pair for the dropout stream, drawn from torch's default generator.

    It lives on the CPU so that drawing it never synchronizes the GPU; ``torch.manual_seed`` makes it
    reproducible. The seed keys a Philox stream; each score (b, h, i, j) takes counter
    ``offset + ((b * H + h) * Sq + i) * Sk + j`` (varlen batches: see ``dropout.py``).
    """
    seed = torch.randint(0, 2**62, (1,), dtype=torch.int64)
    return torch.cat([seed, torch.zeros(1, dtype=torch.int64)])
