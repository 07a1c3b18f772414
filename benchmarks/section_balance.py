"""How evenly the Hopper kernels' grids spread their tiles over the SMs, by L2 section budget (no GPU needed).

The forward walks its tiles in L2 sections of (sequence, head) pairs, row tiles longest first inside each
(``kernels/forward_hopper._tile_plan``); the fused backward walks its key tiles in sections of (batch, kv head)
pairs, key blocks longest first inside each (``kernels/backward_hopper.sectioned_key_tile``), except that a grid of one
program a tile without a causal mask takes each pair's key tiles in turn. A persistent grid hands
tiles out from a counter and a grid of one program a tile is dispatched in program order: both are list schedules,
each tile going to the SM that frees up first. This replays that schedule with a tile's cost taken as a fixed
overhead plus its block products (in 64 x 64-row-block units of its width) and prints the busiest SM's time over the
mean: 1.00 is no tail.
Causal tiles are unequal work, so the section size decides how late each section's longest tiles start; equal tiles
balance under any budget.

    python benchmarks/section_balance.py --head-dim 256 --budget-mib 8 16 32
    python benchmarks/section_balance.py --backward --head-dim 64 128 --budget-mib 8 16

The budget is the table's (forward: ``configs.HOPPER_CAUSAL_L2_SECTION_BYTES`` causal, ``HOPPER_L2_SECTION_BYTES``
otherwise; backward: ``HOPPER_L2_SECTION_BYTES``) unless given; the tiles are the table's Hopper entries at each
length (backward: the fused ``dkdv_dq`` ones), on the bench grid's shapes (16k tokens, heads * head dim = 2048,
bf16), one program an SM.
"""

from __future__ import annotations

import argparse
import heapq

import torch

from flashattn import configs
from flashattn.launch.backward import fused_persistent, hopper_dkdv_kernel
from flashattn.launch.common import cdiv
from flashattn.launch.forward import consumer_warpgroups, l2_section_units

SMS = 132  # H200
TILE_OVERHEAD_BLOCKS = 3.0  # a tile's prologue and epilogue, in 64-key block products


def tile_costs(seqlen: int, pairs: int, pairs_per_section: int, rows: int, block_n: int, causal: bool,
               overhead: float = TILE_OVERHEAD_BLOCKS) -> list[float]:
    """Each tile's cost in ``_tile_plan``'s order: sections of pairs, row tiles slowest inside one, causal row tile 0
    the last rows (the longest)."""
    row_tiles = cdiv(seqlen, rows)
    costs = []
    for first in range(0, pairs, pairs_per_section):
        heads = min(pairs_per_section, pairs - first)
        for index in range(row_tiles * heads):
            key_end = max(0, seqlen - rows * (index // heads)) if causal else seqlen
            costs.append(overhead + cdiv(key_end, block_n) * block_n / 64)
    return costs


def key_tile_costs(seqlen: int, pairs: int, pairs_per_section: int, keys: int, block_m: int, causal: bool,
                   overhead: float = TILE_OVERHEAD_BLOCKS) -> list[float]:
    """Each backward key tile's cost in ``sectioned_key_tile``'s order: sections of pairs, key blocks slowest inside
    one; under a causal mask (equal lengths) key tile j sees the query blocks from its first key on."""
    key_tiles = cdiv(seqlen, keys)
    costs = []
    for first in range(0, pairs, pairs_per_section):
        heads = min(pairs_per_section, pairs - first)
        for index in range(key_tiles * heads):
            queries = seqlen - keys * (index // heads) if causal else seqlen
            costs.append(overhead + cdiv(queries, block_m) * block_m / 64)
    return costs


def imbalance(costs: list[float], sms: int = SMS) -> float:
    """The busiest SM's time over the mean when ``costs`` are list-scheduled in order."""
    finish = [0.0] * sms
    for cost in costs:
        heapq.heappush(finish, heapq.heappop(finish) + cost)
    return max(finish) / (sum(costs) / sms)


def grid_imbalance(head_dim: int, seqlen: int, causal: bool, budget: int, tokens: int = 16384,
                   hidden: int = 2048, backward: bool = False) -> float | None:
    """``imbalance`` of the bench grid's forward (``backward``: the fused dK/dV/dQ) at (head_dim, seqlen, causal) under
    an L2 section ``budget``; None where the table takes a Triton tile or the two passes (a grid without sections)."""
    pairs = tokens // seqlen * (hidden // head_dim)
    if backward:
        config = configs.lookup("hopper", "dkdv_dq", head_dim, causal, torch.bfloat16, seqlen=seqlen, hopper=True)
        if config is None or not config.hopper:
            return None
        group_bytes = 2 * seqlen * head_dim * 2  # Q and dO of one query head a pair
        per_section = l2_section_units(pairs, group_bytes, budget) if causal or fused_persistent(config) else 1
        keys = hopper_dkdv_kernel(config, fused=True)[1]
        return imbalance(key_tile_costs(seqlen, pairs, per_section, keys, config.block_m, causal))
    config = configs.lookup("hopper", "forward", head_dim, causal, torch.bfloat16, seqlen=seqlen, hopper=True)
    if not config.hopper:
        return None
    kv_pair_bytes = 2 * seqlen * head_dim * 2
    per_section = l2_section_units(pairs, kv_pair_bytes, budget)
    rows = 64 * consumer_warpgroups(config)
    return imbalance(tile_costs(seqlen, pairs, per_section, rows, config.block_n, causal))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head-dim", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--seqlen", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--budget-mib", type=float, nargs="+", help="section budgets (default: the table's)")
    parser.add_argument("--non-causal", action="store_true")
    parser.add_argument("--backward", action="store_true", help="the fused dK/dV/dQ grid's key tiles")
    args = parser.parse_args(argv)
    causal = not args.non_causal
    default = (configs.HOPPER_CAUSAL_L2_SECTION_BYTES if causal and not args.backward
               else configs.HOPPER_L2_SECTION_BYTES)
    budgets = [int(mib * 2**20) for mib in args.budget_mib] if args.budget_mib else [default]
    print("| head dim | seqlen | " + " | ".join(f"{b / 2**20:g} MiB" for b in budgets) + " |")
    print("|---|---|" + "---|" * len(budgets))
    for head_dim in args.head_dim:
        for seqlen in args.seqlen:
            values = (grid_imbalance(head_dim, seqlen, causal, b, backward=args.backward) for b in budgets)
            cells = ("-" if value is None else f"{value:.3f}" for value in values)
            print(f"| {head_dim} | {seqlen} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
