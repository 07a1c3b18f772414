"""What the tests of the Hopper kernels share: the sm90 guard, and a forced config whose launches are counted."""

from __future__ import annotations

import contextlib

import pytest
import torch

from flashattn import configs


def _on_hopper() -> bool:
    return torch.cuda.is_available() and configs.gpu_family(torch.device("cuda")) == "hopper"


hopper = pytest.mark.skipif(not _on_hopper(), reason="the Hopper kernels are built for sm90")


def gpu_cases(shapes: list[tuple[int, ...]]):
    """A Hopper GPU test's cases: each of ``shapes`` (ids such as 1x113x203x4x2x128), plain and causal."""
    def mark(test):
        test = pytest.mark.parametrize("shape", shapes, ids=lambda s: "x".join(map(str, s)))(test)
        test = pytest.mark.parametrize("option", ["plain", "causal"])(test)
        return pytest.mark.gpu(hopper(test))
    return mark


@contextlib.contextmanager
def forced_launch(monkeypatch, phase: str, module, launcher: str, tile: configs.TileConfig | None,
                  expect_launch: bool = True):
    """Run under ``tile`` for ``phase`` (None: the table's choice) and check that ``module.<launcher>`` ran (or, with
    ``expect_launch`` false, did not)."""
    launches = []
    launch = getattr(module, launcher)

    def counting(*args, **kwargs):
        launches.append(1)
        return launch(*args, **kwargs)

    monkeypatch.setattr(module, launcher, counting)
    with configs.use_config(phase, tile) if tile is not None else contextlib.nullcontext():
        yield
    assert bool(launches) == expect_launch, f"{launcher} launches: {len(launches)}"
