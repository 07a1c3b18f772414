"""Call E: the persistent Gluon forward's packed non-causal failures (calls B-D) under one change at a time, MODE:
tree (two Q buffers), q1 (one), narrow (no 16-byte stores), static (tiles in the static order, no counter). One
process a mode, so that an illegal address in one leaves the others to run."""
import os

import torch
from cases import make_varlen_case

from flashattn import configs, ops
from flashattn.testing import check_varlen_against_reference

mode = os.environ["MODE"]
constexprs = ops.warp_specialized_constexprs


def patched(config, head_dim, causal, is_varlen):
    values = constexprs(config, head_dim, causal, is_varlen)
    if mode == "q1":
        values["Q_BUFFERS"] = 1
        values["WIDE_STORES"] = ops._room_for_wide_stores(config, head_dim, 1)
    elif mode == "narrow":
        values["WIDE_STORES"] = False
    elif mode == "static":
        values["DYNAMIC_TILES"] = False
    return values


ops.warp_specialized_constexprs = patched
tiles = {"n128-s2-persistent": (configs.TileConfig(128, 128, 8, 2, warp_specialized=True, persistent=True), 128),
         "n128-s3-consumers3-persistent": (configs.TileConfig(128, 128, 8, 3, warp_specialized=True,
                                                              three_consumers=True, persistent=True), 64)}
seqlens = {"mixed": ([1, 300, 129, 0, 64], [5, 300, 700, 3, 64]), "equal": ([1000, 17], [1000, 17]),
           "short": ([17] * 40 + [300], [23] * 40 + [250])}
for tile_name, (tile, head_dim) in tiles.items():
    for lens_name, lens in seqlens.items():
        failures, detail = 0, ""
        for seed in range(2):
            torch.manual_seed(seed)
            case = make_varlen_case((*lens, 4, 2, head_dim), "plain", "cuda")
            try:
                with configs.use_config("forward", tile):
                    check_varlen_against_reference(case, torch.bfloat16, "cuda", backward=False)
            except AssertionError as error:
                failures += 1
                detail = str(error).splitlines()[-1]
        print(f"{mode:7s} {tile_name:30s} {lens_name:6s} failures {failures}/2 {detail}", flush=True)
