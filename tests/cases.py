"""The grids of shapes and options the correctness tests walk."""

import contextlib

import pytest
import torch

from flashattn.testing import Case, VarlenCase

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@contextlib.contextmanager
def deterministic_algorithms(enabled: bool = True):
    """``torch.use_deterministic_algorithms(enabled)`` inside, torch's own setting restored after (warn_only: torch's
    ops without a deterministic form warn where they would raise)."""
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(enabled, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


# torch.compile's backend in the tests: inductor on a CPU spends most of a test building C++ for the ops around
# flashattn's (torch's own concern); "aot_eager" traces the same graph through the fake implementations and autograd
COMPILE_BACKEND = "inductor" if torch.cuda.is_available() else "aot_eager"

OPTIONS = {
    "plain": {},
    "causal": {"causal": True},
    "window": {"window_size": (17, 5)},
    "window-left": {"window_size": (9, -1)},
    "softcap": {"softcap": 2.5},
    "alibi": {"alibi_slopes": "per-head"},
    "dropout": {"dropout_p": 0.17},
    "causal-alibi-softcap": {"causal": True, "alibi_slopes": "per-batch-head", "softcap": 4.0},
    "window-dropout-scale": {"window_size": (6, 0), "dropout_p": 0.3, "softmax_scale": 0.3},
}


def covering(first: list, second: list, *others: list) -> list[tuple]:
    """A pairwise covering grid in place of the cartesian product: every (first, second) pair once, and each
    further axis taking turns so that each of its entries meets every ``first`` and every ``second`` entry.

    The k-th further axis (k = 1, 2, ...) takes its entry (i + k * j) mod its length at the i-th ``first`` and
    j-th ``second`` entry; the assert checks the pairs. Under the interpreter each case costs seconds, and the
    kernels' branches (constexprs) follow each option, dtype and head dim, not their product: a case per pair
    exercises every branch, and every interaction of two parameters, without the near-identical combinations.
    """
    rows = [(a, b, *(axis[(i + k * j) % len(axis)] for k, axis in enumerate(others, start=1)))
            for i, a in enumerate(first) for j, b in enumerate(second)]
    axes = [first, second, *others]
    for x, y in [(0, 1)] + [(z, w) for w in range(2, len(axes)) for z in (0, 1)]:
        met = {(axes[x].index(row[x]), axes[y].index(row[y])) for row in rows}
        assert len(met) == len(axes[x]) * len(axes[y]), f"axes {x} and {y}: {len(met)} pairs met"
    return rows


# pytest-xdist group of the GPU tests whose float64 references take tens of GB: they take
# turns (a lock file per group, tests/conftest.py) while the other workers share the rest of the GPU
GPU_MEMORY_GROUP = "gpu-memory"


# float32 references from this many scores of one (sequence, query head) pair-set up: a few GB with their gradients
HEAVY_SCORES = 1 << 25


def heavy_reference(dtype: torch.dtype, nheads: int, seqlen_q: int, seqlen_k: int, batch: int = 1) -> bool:
    """Whether a float32 case's float64 reference (batch x heads x seqlen_q x seqlen_k scores, per sequence for a
    packed batch) is one to run in GPU_MEMORY_GROUP."""
    return dtype == torch.float32 and batch * nheads * seqlen_q * seqlen_k >= HEAVY_SCORES


def heavy_varlen_reference(shape: tuple, dtype: torch.dtype) -> bool:
    """:func:`heavy_reference` of a packed case (seqlens_q, seqlens_k, nheads, nheads_k, head_dim): its longest
    sequences."""
    return heavy_reference(dtype, shape[2], max(shape[0]), max(shape[1]))


def one_at_a_time(rows: list[tuple], heavy) -> list:
    """``rows`` as pytest parameters, those for which ``heavy(*row)`` holds in the xdist group GPU_MEMORY_GROUP."""
    return [pytest.param(*row, marks=pytest.mark.xdist_group(GPU_MEMORY_GROUP)) if heavy(*row) else row
            for row in rows]


def has_tma(device) -> bool:
    """Whether TMA tensor descriptors run on ``device``: the interpreter's ("cpu") emulates them, a GPU needs
    sm90 or newer."""
    return str(device) == "cpu" or torch.cuda.get_device_capability()[0] >= 9


def second_sequence_nan(tensors, poisoned: bool) -> list[torch.Tensor]:
    """Copies of dense ``tensors``; ``poisoned``: with sequence 1 all NaN, the neighbour of sequence 0's tiles."""
    copies = [x.clone() for x in tensors]
    if poisoned:
        for x in copies:
            x[1] = float("nan")
    return copies


def assert_unchanged_by_nan(where: str, clean: torch.Tensor, poisoned: torch.Tensor, exact: bool = True) -> None:
    """A result computed beside another sequence's NaN: finite (a NaN that leaked fails here) and equal to the clean
    call's; not ``exact`` (a dQ added into float32 in whatever order the key tiles finish): within a bf16 unit of its
    largest value, the roundings that order moves."""
    assert torch.isfinite(poisoned).all(), where
    if exact:
        assert torch.equal(poisoned, clean), where
    else:
        unit = torch.finfo(torch.bfloat16).eps
        torch.testing.assert_close(poisoned, clean, rtol=unit, atol=unit * clean.abs().max().item(), msg=where)


def make_case(shape, option_name: str, device) -> Case:
    batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim = shape
    options = dict(OPTIONS[option_name])
    slopes = options.get("alibi_slopes")
    if slopes == "per-head":
        options["alibi_slopes"] = torch.rand(nheads, device=device) * 0.5
    elif slopes == "per-batch-head":
        options["alibi_slopes"] = torch.rand(batch, nheads, device=device) * 0.5
    return Case(batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, options)


def make_varlen_case(shape, option_name: str, device) -> VarlenCase:
    """A packed case from (seqlens_q, seqlens_k, nheads, nheads_k, head_dim) and an OPTIONS name."""
    seqlens_q, seqlens_k, nheads, nheads_k, head_dim = shape
    options = dict(OPTIONS[option_name])
    slopes = options.get("alibi_slopes")
    if slopes == "per-head":
        options["alibi_slopes"] = torch.rand(nheads, device=device) * 0.5
    elif slopes == "per-batch-head":
        options["alibi_slopes"] = torch.rand(len(seqlens_q), nheads, device=device) * 0.5
    return VarlenCase(seqlens_q, seqlens_k, nheads, nheads_k, head_dim, options)


# (batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim): awkward on purpose
CPU_SHAPES = [
    (2, 1, 1, 2, 1, 40),
    (1, 113, 203, 4, 2, 40),
    (2, 203, 113, 4, 4, 96),
    (1, 77, 77, 6, 1, 200),
    (1, 130, 130, 2, 2, 256),
    (2, 33, 64, 2, 1, 3),
    (1, 1023, 1023, 2, 1, 64),
]

# Under the interpreter every program runs in numpy: small shapes, still ragged against 16-wide tiles.
INTERPRETER_SHAPES = [
    (2, 1, 1, 2, 1, 16),
    (1, 37, 61, 4, 2, 40),
    (2, 61, 37, 2, 2, 96),
    (1, 33, 33, 2, 1, 200),
]

GPU_SHAPES = [
    (2, 1, 1, 2, 1, 64),
    (2, 113, 203, 4, 2, 40),
    (2, 203, 113, 4, 4, 96),
    (1, 1023, 1024, 4, 1, 128),
    (1, 1024, 1023, 2, 2, 200),
    (2, 512, 512, 3, 3, 256),
    (1, 2048, 2048, 4, 2, 64),
    (1, 257, 4099, 2, 1, 128),
    (1, 8192, 8192, 2, 1, 128),
    (1, 4096, 4096, 2, 2, 256),
]
