#!/usr/bin/env bash
# Nsight Compute on the dense and the packed (varlen, equal lengths) forward of the same tokens, hdim 64
# causal: the case where varlen runs at 70-82% of dense although the sm90 SASS of the two is near-identical
# (BENCHMARKS.md, version 3). One profiled launch each, the same sections, side by side. Run from the repo
# root on the GPU machine:
#     SEQLEN=4096 bash benchmarks/ncu_varlen_gap.sh
# Full reports under $OUT/ncu-varlen; the rows that differ most are printed last.
set -u -o pipefail
OUT=${OUT:-gpu-out}
LOGS="$OUT/ncu-varlen"
mkdir -p "$LOGS"
export PYTHONPATH=src PYTHONUNBUFFERED=1
SEQLEN=${SEQLEN:-4096}
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for layout in dense varlen; do
  timeout 240 "$NCU" --kernel-name attention_forward_kernel --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section SchedulerStats --section MemoryWorkloadAnalysis --csv --page details \
    python3 -c "
import torch
from flashattn import flash_attn_func, flash_attn_varlen_func
seqlen, head_dim = $SEQLEN, 64
batch, heads = 16384 // seqlen, 2048 // head_dim
q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device='cuda', dtype=torch.bfloat16) for _ in range(3))
cu = torch.arange(0, batch + 1, device='cuda', dtype=torch.int32) * seqlen
for _ in range(3):
    if '$layout' == 'dense':
        flash_attn_func(q, k, v, causal=True)
    else:
        flash_attn_varlen_func(*(x.flatten(0, 1) for x in (q, k, v)), cu, cu, seqlen, seqlen, causal=True)
torch.cuda.synchronize()
" > "$LOGS/$layout.csv" 2> "$LOGS/$layout.err"
  echo "$layout: exit $?"
done
python3 - "$LOGS" <<'EOF'
import csv, sys
from pathlib import Path

def metrics(path):
    rows = [r for r in csv.reader(Path(path).read_text().splitlines()) if len(r) > 4]
    if not rows:
        raise SystemExit(f"{path}: no ncu metrics (see the .err file beside it)")
    header, body = rows[0], rows[1:]
    name, unit, value = header.index("Metric Name"), header.index("Metric Unit"), header.index("Metric Value")
    return {(r[name], r[unit]): r[value] for r in body}

dense, varlen = (metrics(f"{sys.argv[1]}/{layout}.csv") for layout in ("dense", "varlen"))
def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None
rows = []
for key in dense.keys() & varlen.keys():
    a, b = number(dense[key]), number(varlen[key])
    if a is not None and b is not None and max(abs(a), abs(b)) > 0:
        rows.append((abs(a - b) / max(abs(a), abs(b)), key, dense[key], varlen[key]))
print("| metric | unit | dense | varlen |\n|---|---|---|---|")
for _, (metric, unit), a, b in sorted(rows, reverse=True)[:25]:
    print(f"| {metric} | {unit} | {a} | {b} |")
EOF
