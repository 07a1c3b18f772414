"""The tile table's lookup: head-dim buckets, the long- and short-sequence entries, float32 and SDPA-mask
adjustments."""

import torch

from flashattn import configs
from flashattn.configs import LONG_SEQLEN, SHORT_SEQLEN, SHORTEST_SEQLEN, TileConfig, lookup


def test_causal_hdim128_forward_takes_the_large_tma_tile_only_on_long_sequences():
    short = lookup("hopper", "forward", 128, True, torch.bfloat16, seqlen=LONG_SEQLEN - 1)
    long = lookup("hopper", "forward", 128, True, torch.bfloat16, seqlen=LONG_SEQLEN)
    assert short == TileConfig(128, 64, 8, 3, tma=True)
    assert long == TileConfig(128, 128, 8, 3, tma=True)
    # entries without a long-sequence variant are the same at any length
    assert lookup("hopper", "forward", 64, True, torch.bfloat16, seqlen=16384) == (
        configs.HOPPER_FORWARD.base[(64, True)])


def test_short_forward_tiles_apply_only_when_the_length_is_known_and_short():
    # hdim 128 without a mask: 64-key blocks when short; hdim 256's short entry is its base tile
    short = lookup("hopper", "forward", 128, False, torch.bfloat16, seqlen=SHORT_SEQLEN)
    medium = lookup("hopper", "forward", 128, False, torch.bfloat16, seqlen=SHORT_SEQLEN + 1)
    unknown = lookup("hopper", "forward", 128, False, torch.bfloat16)
    assert short == TileConfig(128, 64, 8, 3, tma=True) and medium.block_n == 128 and unknown == medium
    # the causal hdim-64/128 forward takes 64 x 64 tiles when short; hdim 256 causal and the backward
    # phases keep their one config
    for head_dim in (64, 128):
        short = lookup("hopper", "forward", head_dim, True, torch.bfloat16, seqlen=SHORT_SEQLEN)
        medium = lookup("hopper", "forward", head_dim, True, torch.bfloat16, seqlen=SHORT_SEQLEN + 1)
        assert short == TileConfig(64, 64, 4, 3, tma=True)
        assert medium == configs.HOPPER_FORWARD.base[(head_dim, True)]
    assert lookup("hopper", "forward", 256, True, torch.bfloat16, seqlen=512) == (
        configs.HOPPER_FORWARD.base[(256, True)])
    assert lookup("hopper", "dkdv", 128, False, torch.bfloat16, seqlen=512) == configs.HOPPER_DKDV.base[(128, False)]


def test_every_sm90_forward_tile_takes_tma_but_shortest_causal_hdim_64():
    tables = (configs.HOPPER_FORWARD.base, configs.HOPPER_FORWARD.short, configs.HOPPER_FORWARD.shortest,
              configs.HOPPER_FORWARD.long)
    pointer_tiles = [(key, tile) for table in tables for key, tile in table.items() if not tile.tma]
    assert pointer_tiles == [((64, True), configs.HOPPER_FORWARD.shortest[(64, True)])]


def test_shortest_causal_hdim128_forward_takes_32_key_blocks():
    shortest = lookup("hopper", "forward", 128, True, torch.bfloat16, seqlen=SHORTEST_SEQLEN)
    short = lookup("hopper", "forward", 128, True, torch.bfloat16, seqlen=SHORTEST_SEQLEN + 1)
    assert shortest == TileConfig(64, 32, 4, 3, tma=True, max_registers=168)
    assert short == TileConfig(64, 64, 4, 3, tma=True)
    # for a call that fits it, the Hopper kernel's persistent grid: 64-row tiles up to 512 tokens, 128 past
    assert lookup("hopper", "forward", 128, True, torch.bfloat16, seqlen=SHORTEST_SEQLEN,
                  hopper=True) == configs.HOPPER_FORWARD.hopper_shortest[(128, True)]
    assert lookup("hopper", "forward", 128, True, torch.bfloat16, seqlen=SHORTEST_SEQLEN + 1,
                  hopper=True) == configs.HOPPER_FORWARD.hopper_short[(128, True)]
    # hdim 64: the short tile on pointer loads
    assert lookup("hopper", "forward", 64, True, torch.bfloat16, seqlen=SHORTEST_SEQLEN) == TileConfig(64, 64, 4, 3)


def test_short_causal_hdim128_dkdv_drops_tma():
    short = lookup("hopper", "dkdv", 128, True, torch.bfloat16, seqlen=SHORT_SEQLEN)
    medium = lookup("hopper", "dkdv", 128, True, torch.bfloat16, seqlen=SHORT_SEQLEN + 1)
    unknown = lookup("hopper", "dkdv", 128, True, torch.bfloat16)
    assert not short.tma and short.mask_every_block and medium.tma and unknown == medium


def test_head_dims_fall_into_their_padded_bucket():
    assert lookup("hopper", "dq", 96, False, torch.float16) == configs.HOPPER_DQ.base[(128, False)]
    assert lookup("hopper", "dkdv", 200, True, torch.float16) == configs.HOPPER_DKDV.base[(256, True)]
    assert lookup("portable", "forward", 3, False, torch.float16) == configs.PORTABLE_FORWARD.base[(64, False)]


def test_float32_halves_the_tiles_and_drops_a_stage():
    half = lookup("hopper", "forward", 128, False, torch.float32)
    full = configs.HOPPER_FORWARD.base[(128, False)]
    assert (half.block_m, half.block_n, half.num_stages) == (full.block_m // 2, full.block_n // 2,
                                                             full.num_stages - 1)


def test_float32_wider_than_128_takes_small_tiles_on_four_warps():
    """Exact fp32 products hold whole rows of the head dim in each thread: at 200 and 256 every phase takes the same
    small tile, which ptxas compiles in a fraction of the halved tile's time."""
    for phase in ("forward", "dkdv", "dq"):
        for head_dim, masked in ((200, False), (256, True)):
            config = lookup("hopper", phase, head_dim, masked, torch.float32)
            assert (config.block_m, config.block_n, config.num_warps, config.num_stages) == (32, 16, 4, 1)
            assert config.max_registers is None


def test_an_sdpa_mask_leaves_shared_memory_for_its_tile():
    masked = lookup("hopper", "forward", 128, True, torch.bfloat16, attn_mask=True, seqlen=16384)
    assert masked.block_n <= 64 and masked.num_stages <= 2


def test_use_config_overrides_and_restores():
    forced = TileConfig(32, 32, 4, 1)
    with configs.use_config("dq", forced):
        assert configs.tile_config("dq", 64, False, torch.float16, torch.device("cpu"), interpret=False) == forced
    interpreted = configs.tile_config("dq", 64, False, torch.float16, torch.device("cpu"), interpret=True)
    assert interpreted == configs.INTERPRETER


def test_register_caps_reach_the_launch_and_are_dropped_where_the_tiles_change():
    capped = lookup("hopper", "forward", 64, True, torch.bfloat16, seqlen=4096)
    assert capped.max_registers == 128
    assert configs.launch_options(capped) == dict(num_warps=8, num_stages=3, maxnreg=128)
    assert "maxnreg" not in configs.launch_options(TileConfig(64, 64, 4, 2))
    # float32 and an SDPA mask change what a thread holds: the cap measured for bf16 tiles does not apply
    assert lookup("hopper", "forward", 64, True, torch.float32).max_registers is None
    assert lookup("hopper", "forward", 64, False, torch.bfloat16, attn_mask=True).max_registers is None


def test_short_non_causal_hdim256_dq_keeps_the_one_stage_tile_without_tma():
    short = lookup("hopper", "dq", 256, False, torch.bfloat16, seqlen=SHORT_SEQLEN)
    medium = lookup("hopper", "dq", 256, False, torch.bfloat16, seqlen=SHORT_SEQLEN + 1)
    unknown = lookup("hopper", "dq", 256, False, torch.bfloat16)
    assert short == TileConfig(128, 64, 8, 1)
    assert medium == TileConfig(64, 64, 4, 2, tma=True) and unknown == medium
    # the causal entry takes TMA at every length
    assert lookup("hopper", "dq", 256, True, torch.bfloat16, seqlen=512).tma


def test_hopper_forward_entries_only_where_the_call_fits():
    ws = lookup("hopper", "forward", 128, False, torch.bfloat16, seqlen=4096, hopper=True)
    assert ws.hopper and ws == configs.HOPPER_FORWARD.hopper[(128, False)]
    # a call the Hopper kernel does not cover keeps the Triton table
    assert lookup("hopper", "forward", 128, False, torch.bfloat16, seqlen=4096) == (
        configs.HOPPER_FORWARD.base[(128, False)])
    # hdim 64: three consumers past 1k, causal or not; causal up to 1k on 64-row tiles of one consumer, two programs
    # an SM
    assert lookup("hopper", "forward", 64, False, torch.bfloat16, seqlen=4096, hopper=True).three_consumers
    for seqlen in (SHORT_SEQLEN + 1, 2048, 16384, 0):  # 0: a length not known, as for the other buckets
        assert lookup("hopper", "forward", 64, True, torch.bfloat16, seqlen=seqlen, hopper=True) == \
            configs.HOPPER_FORWARD.hopper[(64, True)]
    for head_dim, seqlen in ((64, SHORT_SEQLEN), (64, SHORTEST_SEQLEN), (128, SHORTEST_SEQLEN)):
        one_consumer = lookup("hopper", "forward", head_dim, True, torch.bfloat16, seqlen=seqlen, hopper=True)
        assert one_consumer.hopper and one_consumer.block_m == 64 and one_consumer.num_warps == 4
    assert not lookup("hopper", "forward", 64, True, torch.bfloat16, seqlen=2048).hopper
    # up to 1k tokens every other Hopper entry is a persistent grid
    for head_dim, causal in ((64, False), (64, True), (128, False), (128, True), (256, False), (256, True)):
        for seqlen in (SHORTEST_SEQLEN, SHORT_SEQLEN):
            short = lookup("hopper", "forward", head_dim, causal, torch.bfloat16, seqlen=seqlen,
                           hopper=True)
            assert short.hopper and short.persistent, (head_dim, causal, seqlen)
    # causal hdim 128: persistent up to 8k, one program a tile from there; hdim 64 and non-causal 128 persistent at
    # every length
    for head_dim, causal in ((64, False), (64, True), (128, False), (128, True)):
        for seqlen in (2048, LONG_SEQLEN - 1, LONG_SEQLEN, 16384):
            config = lookup("hopper", "forward", head_dim, causal, torch.bfloat16, seqlen=seqlen,
                            hopper=True)
            persistent = not (head_dim == 128 and causal and seqlen >= LONG_SEQLEN)
            assert config.hopper and config.persistent == persistent, (head_dim, causal, seqlen)
    # packed calls keep the persistent grid past LONG_SEQLEN: their sequences are shorter than the longest
    for head_dim, causal in ((64, False), (128, False), (128, True)):
        config = lookup("hopper", "forward", head_dim, causal, torch.bfloat16, seqlen=16384, hopper=True,
                        packed=True)
        assert config.hopper and config.persistent, (head_dim, causal)
    assert not lookup("portable", "forward", 128, False, torch.bfloat16, hopper=True).hopper
