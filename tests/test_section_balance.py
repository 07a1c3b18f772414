"""benchmarks/section_balance.py: the list schedule of the Hopper forward's sectioned tiles, which predicts the tail
that small L2 sections leave on causal grids."""

from __future__ import annotations

import benchmark_scripts
import pytest

from flashattn import configs


@pytest.fixture(scope="module")
def balance():
    return benchmark_scripts.load("section_balance")


def test_equal_tiles_in_whole_waves_balance(balance):
    assert balance.imbalance([1.0] * 264, sms=132) == 1.0
    assert balance.imbalance([1.0] * 133, sms=132) == pytest.approx(132 / 133 * 2)  # one tile left for a second wave


def test_tile_costs_follow_the_plan_order(balance):
    # two pairs a section, 4 row tiles of 128 rows over 512 keys in 64-key blocks: causal longest first, pairs
    # fastest inside a section
    costs = balance.tile_costs(512, 2, 2, 128, 64, True, overhead=0.0)
    assert costs == [8, 8, 6, 6, 4, 4, 2, 2]
    assert balance.tile_costs(512, 2, 1, 128, 64, False, overhead=0.0) == [8] * 8


def test_causal_hdim_256_tail_under_small_sections(balance):
    # hdim 256 causal 4k: 8 MiB sections of 2 pairs leave a tail of about 10%; the causal budget removes it
    small = balance.grid_imbalance(256, 4096, True, 8 << 20)
    table = balance.grid_imbalance(256, 4096, True, configs.HOPPER_CAUSAL_L2_SECTION_BYTES)
    assert small > 1.08
    assert table < 1.01
    assert balance.grid_imbalance(64, 256, True, 8 << 20, backward=True) is None  # the two passes: no sections


def test_backward_key_tiles_follow_the_plan_order(balance):
    # 2 pairs a section, 512 keys in 128-key tiles over 64-row query blocks: causal longest first, pairs fastest
    costs = balance.key_tile_costs(512, 2, 2, 128, 64, True, overhead=0.0)
    assert costs == [8, 8, 6, 6, 4, 4, 2, 2]
    # the fused kernel's one-tile form at hdim 128, in sections: no tail at 4k causal (each pair's key tiles in turn,
    # one pair a section, left 1.065)
    assert balance.grid_imbalance(128, 4096, True, 8 << 20, backward=True) < 1.01
    assert balance.imbalance(balance.key_tile_costs(4096, 64, 1, 128, 64, True)) > 1.05
    # equal tiles: only the last wave's rounding (2048 tiles on 132 SMs)
    assert balance.grid_imbalance(128, 4096, False, 8 << 20, backward=True) == pytest.approx(16 / (2048 / 132))
