"""Two Q tiles forced on a small dense non-causal call whose keys fill no 128-key block (64 x 89 tokens, 4 heads:
256 tiles, so that persistent programs reuse a Q buffer): wrong (sequence, head) pairs against a float32
reference. Small enough for compute-sanitizer's racecheck and synccheck. argv: an optional kernel file to swap in
(benchmarks/varlen_fwd_ab.py's NAME=PATH), and "one" for one Q tile as a control (calls A-G ran before 8283a10, whose
rule gave one Q tile there; the script then forced two unless "one" was given; from call H the rule gives two)."""
import sys

import torch

sys.path.insert(0, "benchmarks")
from module_file import load_module_file  # noqa: E402

import flashattn.kernels.forward_hopper as current  # noqa: E402
from flashattn import flash_attn_func, launcher, ops  # noqa: E402

BATCH, SEQLEN, HEADS, HDIM = 64, 89, 4, 128
args = sys.argv[1:]
if "one" in args:
    ops._forward_q_buffers = lambda config, head_dim: 1
for path in (a for a in args if a.endswith(".py")):
    current.attention_forward_hopper_kernel = load_module_file(path, "variant").attention_forward_hopper_kernel
launcher.clear_plans()
torch.manual_seed(1)
q, k, v = (torch.randn(BATCH, SEQLEN, HEADS, HDIM, device="cuda", dtype=torch.bfloat16) for _ in range(3))
expected = torch.nn.functional.scaled_dot_product_attention(*(x.transpose(1, 2).float() for x in (q, k, v)))
out = flash_attn_func(q, k, v)
torch.cuda.synchronize()
error = (out.float() - expected.transpose(1, 2)).abs()
wrong = ((error.amax(dim=(1, 3)) > 0.05) | error.isnan().any(dim=3).any(dim=1)).sum().item()
print(f"{' '.join(args) or 'two Q tiles'}: {wrong} wrong pairs of {BATCH * HEADS}, max error {error.max().item():.3e}")
