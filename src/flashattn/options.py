"""The options of one attention call, carried as one frozen value from the interface to the launcher."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PositionFrame:
    """Where a call's queries and keys sit in a larger attention problem (a ring step's pair of chunks).

    Query row i of the call is row ``query_start + i`` of a problem of ``seqlen_q`` queries, key row j is key
    ``key_start + j`` of ``seqlen_k`` keys. Masks and ALiBi then follow the larger problem's positions (its
    bottom-right alignment), and dropout its random stream: score (b, h, i, j) takes the counter the larger
    problem gives score (b, h, query_start + i, key_start + j). Without a frame a call is its own problem.
    """

    query_start: int
    key_start: int
    seqlen_q: int
    seqlen_k: int

    def diagonal_shift(self, seqlen_q: int, seqlen_k: int) -> int:
        """How far the frame moves the diagonal of a call of seqlen_q x seqlen_k: query i's diagonal key is
        ``i + seqlen_k - seqlen_q + shift`` in the call's rows (see :func:`flashattn.masks.visible`)."""
        return (self.query_start - self.key_start + self.seqlen_k - self.seqlen_q) - (seqlen_k - seqlen_q)

    def dropout_offset(self) -> int:
        """What the frame adds to the dropout counter of the call's score (b, h, 0, 0) in the larger problem,
        beyond the strides (``dropout.py``): the counter of (b, h, i, j) is then
        ``offset + ((b * H + h) * seqlen_q + i) * seqlen_k + j``, the frame's lengths as strides."""
        return self.query_start * self.seqlen_k + self.key_start


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
    frame: PositionFrame | None = None

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
        left, right = (max(int(w), -1) for w in window_size)  # any negative side is unbounded: -1
        if causal:
            right = 0
        scale = 1.0 / math.sqrt(head_dim) if softmax_scale is None else float(softmax_scale)
        return cls(scale, left, right, float(softcap), float(dropout_p), bool(deterministic))

    @property
    def repeatable(self) -> bool:
        """Whether the backward must be bitwise repeatable: ``deterministic``, or torch's own switch
        (``torch.use_deterministic_algorithms(True)``), read when the backward runs: a program that torch.export
        traced keeps no ``deterministic`` of its own."""
        return self.deterministic or torch.are_deterministic_algorithms_enabled()

    def op_arguments(self) -> tuple[float, int, int, float, float]:
        """The scalars a custom op takes in this object's place (ops take only tensors and scalars), in their order:
        ``ops`` rebuilds the object from them."""
        return self.softmax_scale, self.window_left, self.window_right, self.softcap, self.dropout_p

    def frame_argument(self) -> list[int] | None:
        """The frame as a custom op takes it (query_start, key_start, seqlen_q, seqlen_k), or None."""
        return None if self.frame is None else list(dataclasses.astuple(self.frame))

    def with_frame(self, frame: list[int] | None) -> AttentionOptions:
        """This object with the frame a custom op was given (``frame_argument``)."""
        return self if frame is None else dataclasses.replace(self, frame=PositionFrame(*frame))

    def diagonal_shift(self, seqlen_q: int, seqlen_k: int) -> int:
        """The frame's shift of the diagonal for a call of these lengths (0 without a frame)."""
        return 0 if self.frame is None else self.frame.diagonal_shift(seqlen_q, seqlen_k)

    @property
    def masked(self) -> bool:
        """Whether a causal or window mask hides part of the scores (tile choices differ then)."""
        return self.window_left >= 0 or self.window_right >= 0


def new_rng_state(device: torch.device | None = None) -> torch.Tensor:
    """A (seed, offset) pair for the dropout stream of a call on ``device``, drawn from torch's default generator.

    It lives on the CPU so that drawing it never synchronizes the GPU; ``torch.manual_seed`` makes it
    reproducible. The seed keys a Philox stream; each score (b, h, i, j) takes counter
    ``offset + ((b * H + h) * Sq + i) * Sk + j`` (varlen batches: see ``dropout.py``). The kernels take the pair as
    launch arguments, so a CUDA graph would replay one seed: a call with dropout is refused while its stream captures.
    """
    # (a compiled graph draws the pair as one of its ops, and a graph holding this CPU tensor is not captured)
    on_gpu = device is not None and device.type == "cuda" and not torch.compiler.is_compiling()
    if on_gpu and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("dropout_p > 0 cannot be captured in a CUDA graph: the dropout seed is drawn on the host "
                           "when the call runs, so every replay would drop the same scores; capture the call with "
                           "dropout_p=0, or run it outside the graph")
    seed = torch.randint(0, 2**62, (1,), dtype=torch.int64)
    return torch.cat([seed, torch.zeros(1, dtype=torch.int64)])


@dataclass(frozen=True)
class FP8Options:
    """What a trainable FP8 call (``fp8.flash_attn_func``) computes: the attention's options and the quantizer's.

    ``seed``: the rotation's signs are hashed from it, the same on any device; None draws them from torch's default
    generator at each call (``fp8_quantize.random_signs``).
    """

    attention: AttentionOptions
    hadamard: bool = True
    seed: int | None = None
    granularity: str = "block"
