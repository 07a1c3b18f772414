"""The tile table's lookup: head-dim buckets, the long-sequence entries, float32 and SDPA-mask adjustments."""

import torch

from flashattn import configs
from flashattn.configs import LONG_SEQLEN, TileConfig, lookup


def test_causal_hdim128_forward_takes_the_large_tma_tile_only_on_long_sequences():
    short = lookup("hopper", "forward", 128, True, torch.bfloat16, seqlen=LONG_SEQLEN - 1)
    long = lookup("hopper", "forward", 128, True, torch.bfloat16, seqlen=LONG_SEQLEN)
    assert short == TileConfig(128, 64, 8, 3)
    assert long == TileConfig(128, 128, 8, 3, tma=True)
    # entries without a long-sequence variant are the same at any length
    assert lookup("hopper", "forward", 64, True, torch.bfloat16, seqlen=16384) == configs._HOPPER_FORWARD[(64, True)]


def test_head_dims_fall_into_their_padded_bucket():
    assert lookup("hopper", "dq", 96, False, torch.float16) == configs._HOPPER_DQ[(128, False)]
    assert lookup("hopper", "dkdv", 200, True, torch.float16) == configs._HOPPER_DKDV[(256, True)]
    assert lookup("portable", "forward", 3, False, torch.float16) == configs._PORTABLE_FORWARD[(64, False)]


def test_float32_halves_the_tiles_and_drops_a_stage():
    half = lookup("hopper", "forward", 128, False, torch.float32)
    full = configs._HOPPER_FORWARD[(128, False)]
    assert (half.block_m, half.block_n, half.num_stages) == (full.block_m // 2, full.block_n // 2,
                                                             full.num_stages - 1)


def test_an_sdpa_mask_leaves_shared_memory_for_its_tile():
    masked = lookup("hopper", "forward", 128, True, torch.bfloat16, attn_mask=True, seqlen=16384)
    assert masked.block_n <= 64 and masked.num_stages <= 2


def test_use_config_overrides_and_restores():
    forced = TileConfig(32, 32, 4, 1)
    with configs.use_config("dq", forced):
        assert configs.tile_config("dq", 64, False, torch.float16, torch.device("cpu"), interpret=False) == forced
    interpreted = configs.tile_config("dq", 64, False, torch.float16, torch.device("cpu"), interpret=True)
    assert interpreted == configs.INTERPRETER
