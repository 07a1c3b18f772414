"""What skipping the tiles an SDPA mask hides saves: flashattn's SDPA with ``ops.SKIP_HIDDEN_TILES`` on and off.

For each mask (a causal bool mask, 4 documents, half the batch padded, a dense random mask, none with
``is_causal`` as the floor) it times the forward and forward + backward on the local GPU with the tiles
skipped and computed, and the host's block maps alone (``mask_blocks``: the per-call cost of skipping).
Prints a Markdown table.

    PYTHONPATH=src python3 benchmarks/mask_skip.py --seqlen 4096 --head-dim 128
"""

from __future__ import annotations

import argparse
import functools

import torch

from flashattn import configs, ops, scaled_dot_product_attention
from flashattn.demo import median_seconds


def masks(batch: int, seqlen: int, device) -> dict[str, torch.Tensor | None]:
    i = torch.arange(seqlen, device=device)[:, None]
    j = torch.arange(seqlen, device=device)[None, :]
    lengths = torch.tensor([seqlen if b % 2 == 0 else seqlen // 2 for b in range(batch)], device=device)
    return {
        "is_causal (no mask)": None,
        "causal bool": j <= i,
        "4 documents": i * 4 // seqlen == j * 4 // seqlen,
        "padding (half the batch 50%)": (j < lengths.view(-1, 1, 1, 1)),
        "dense random": torch.rand(seqlen, seqlen, device=device) > 0.1,
    }


def host_block_maps(mask: torch.Tensor, q: torch.Tensor, head_dim: int) -> None:
    """The block maps of one forward and one backward call, as ``ops`` builds them."""
    seqlen_k = mask.shape[-1]
    forward, dkdv, dq = (configs.tile_config(phase, head_dim, True, q.dtype, q.device, False, attn_mask=True)
                         for phase in ("forward", "dkdv", "dq"))
    ops._block_map_arguments(mask, q, seqlen_k, (forward.block_m, forward.block_n, False))
    ops._block_map_arguments(mask, q, seqlen_k, (dkdv.block_m, dkdv.block_n, True), (dq.block_m, dq.block_n, False))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--seqlen", type=int, default=4096)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("mask_skip.py: timings need a CUDA GPU")
    device = torch.device("cuda")
    dtype = getattr(torch, args.dtype)
    shape = (args.batch, args.heads, args.seqlen, args.head_dim)
    query, key, value = (torch.randn(shape, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    dout = torch.randn(shape, device=device, dtype=dtype)
    print(f"B={args.batch} H={args.heads} L={args.seqlen} E={args.head_dim} {args.dtype}, "
          f"{torch.cuda.get_device_name()}\n")
    print("| mask | fwd skip ms | fwd all ms | fwd+bwd skip ms | fwd+bwd all ms | block maps ms |")
    print("|---|---|---|---|---|---|")
    for name, mask in masks(args.batch, args.seqlen, device).items():
        is_causal = mask is None

        def forward(mask=mask, is_causal=is_causal):
            return scaled_dot_product_attention(query, key, value, attn_mask=mask, is_causal=is_causal)

        def forward_backward(forward=forward):
            return torch.autograd.grad(forward(), (query, key, value), dout)

        row = []
        for timed in (forward, forward_backward):
            for skip in (True, False):
                ops.SKIP_HIDDEN_TILES = skip
                row.append(median_seconds(timed, device) * 1e3)
        ops.SKIP_HIDDEN_TILES = True
        maps_ms = float("nan")
        if mask is not None:
            maps = functools.partial(host_block_maps, mask[(None,) * (4 - mask.dim())], query.transpose(1, 2),
                                     args.head_dim)
            maps_ms = median_seconds(maps, device) * 1e3
        print(f"| {name} | " + " | ".join(f"{ms:.3f}" for ms in row) + f" | {maps_ms:.3f} |")


if __name__ == "__main__":
    main()
