"""Compare the SASS of the Gluon forward's builds between the tree's kernel file and another (argv[1])."""
import sys

sys.path.insert(0, "benchmarks")  # run from the repository root
import sass_report  # noqa: E402
import torch  # noqa: E402
from module_file import load_module_file  # noqa: E402

import flashattn.kernels.forward_hopper as current  # noqa: E402
from flashattn import configs  # noqa: E402

other = load_module_file(sys.argv[1], "flashattn.kernels.forward_hopper_other").attention_forward_hopper_kernel
tree = current.attention_forward_hopper_kernel
captured = []
original = sass_report.report_cubin


def capture(cubin, *args, **kwargs):
    """report_cubin, keeping the build's instruction texts (addresses dropped) for the comparison."""
    captured.append([text for _, text in sass_report.instructions(sass_report.disassemble(cubin))])
    return original(cubin, *args, **kwargs)


sass_report.report_cubin = capture
builds = []
for head_dim in (64, 128, 256):
    for causal in (False, True):
        for varlen in (False, True):
            for seqlen in (1024, 16384):
                config = configs.lookup("hopper", "forward", head_dim, causal, torch.bfloat16, seqlen=seqlen,
                                        warp_specialized=True, packed=varlen)
                if config.warp_specialized and (head_dim, causal, varlen, config) not in builds:
                    builds.append((head_dim, causal, varlen, config))
for head_dim, causal, varlen, config in builds:
    sass = []
    for kernel in (tree, other):
        current.attention_forward_hopper_kernel = kernel
        captured.clear()
        sass_report.ws_forward_report(head_dim, causal, config, varlen=varlen)
        sass.append(captured[0])
    same = sass[0] == sass[1]
    print(f"hdim {head_dim} causal {causal} varlen {varlen} {config}: {len(sass[0])} / {len(sass[1])} instructions,"
          f" {'identical' if same else 'different'}"
          + ("" if same else f"; same multiset: {sorted(sass[0]) == sorted(sass[1])}"), flush=True)
