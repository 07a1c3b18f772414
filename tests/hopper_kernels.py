"""What the tests of the Hopper kernels share: the sm90 guard, and a forced config whose launches are counted."""

from __future__ import annotations

import contextlib

import pytest
import torch

from flashattn import configs


def _on_hopper() -> bool:
    return torch.cuda.is_available() and configs.gpu_family(torch.device("cuda")) == "hopper"


hopper = pytest.mark.skipif(not _on_hopper(), reason="the Hopper kernels are built for sm90")


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
