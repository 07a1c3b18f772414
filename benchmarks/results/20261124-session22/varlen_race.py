"""Call C: which change makes the persistent Gluon forward's packed non-causal tests fail (call B: 4 of 8
persistent varlen cases, one (sequence, head) tile's rows wrong each time). Each variant kernel (argv NAME=PATH,
plus the tree's "new", "new-q1": the tree with one Q buffer, "new-narrow": without 16-byte stores) runs the test's
packed cases REPEAT times with fresh inputs; prints the failures per variant and case."""
import importlib.util
import os
import sys

import torch
from cases import make_varlen_case

import flashattn.kernels.forward_hopper as current
from flashattn import configs, launcher, ops
from flashattn.testing import check_varlen_against_reference

kernels = {"new": current.attention_forward_hopper_kernel}
for argument in sys.argv[1:]:
    name, path = argument.split("=", 1)
    spec = importlib.util.spec_from_file_location(f"variant_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    kernels[name] = module.attention_forward_hopper_kernel
kernels["new-q1"] = current.attention_forward_hopper_kernel
kernels["new-narrow"] = current.attention_forward_hopper_kernel
q_buffers, wide = ops._forward_q_buffers, ops._room_for_wide_stores
repeat = int(os.environ.get("REPEAT", "5"))
tiles = {"n128-s2-persistent": (configs.TileConfig(128, 128, 8, 2, warp_specialized=True, persistent=True), 128),
         "n128-s3-consumers3-persistent": (configs.TileConfig(128, 128, 8, 3, warp_specialized=True,
                                                              three_consumers=True, persistent=True), 64)}
seqlens = {"mixed": ([1, 300, 129, 0, 64], [5, 300, 700, 3, 64]), "equal": ([1000, 17], [1000, 17])}
for name, kernel in kernels.items():
    current.attention_forward_hopper_kernel = kernel
    ops._forward_q_buffers = (lambda config, head_dim: 1) if name == "new-q1" else q_buffers
    ops._room_for_wide_stores = (lambda config, head_dim, tiles: False) if name == "new-narrow" else wide
    launcher.clear_plans()
    for tile_name, (tile, head_dim) in tiles.items():
        for lens_name, lens in seqlens.items():
            for option in ("plain", "causal"):
                failures = 0
                for seed in range(repeat):
                    torch.manual_seed(seed)
                    case = make_varlen_case((*lens, 4, 2, head_dim), option, "cuda")
                    try:
                        with configs.use_config("forward", tile):
                            check_varlen_against_reference(case, torch.bfloat16, "cuda", backward=False)
                    except AssertionError as error:
                        failures += 1
                        detail = str(error).splitlines()[-1]
                print(f"{name:14s} {tile_name:30s} {lens_name:6s} {option:7s} failures {failures}/{repeat}"
                      + (f"  last: {detail}" if failures else ""), flush=True)
