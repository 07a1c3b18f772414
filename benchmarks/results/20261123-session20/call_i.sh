#!/usr/bin/env bash
# Call I: why the hdim-64 causal 16k backward reads lower in full grids (fwd+bwd) than in backward-only runs: the
# cell timed both ways, twice, with flashattn and sdpa_flash, while nvidia-smi samples the SM clock and power.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src
mkdir -p "$OUT"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active \
  --format=csv -lms 200 > "$OUT/smi.csv" 2>&1 &
SMI=$!
for round in 1 2; do
  for modes in "fwd bwd" "bwd"; do
    tag=$(echo "$modes" | tr ' ' '+')-$round
    echo "start $tag $(date +%T.%N)" >> "$OUT/marks.txt"
    timeout 100 python3 -m flashattn bench --providers flashattn sdpa_flash --head-dims 64 --seqlens 16384 8192 \
      --causal yes --modes $modes --out "$OUT/bench-$tag" --markdown "$OUT/grid-$tag.md" > "$OUT/bench-$tag.log" 2>&1
    echo "end $tag $(date +%T.%N)" >> "$OUT/marks.txt"
    echo "== $tag"; grep -E "^\| (8192|16384)" "$OUT/grid-$tag.md"
  done
done
kill $SMI
python3 - "$OUT" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1] + "/smi.csv")))[1:]
clocks = [int(r[1].split()[0]) for r in rows if len(r) > 2 and r[1].strip().split()[0].isdigit()]
power = [float(r[2].split()[0]) for r in rows if len(r) > 2 and r[2].strip().split()[0].replace('.', '').isdigit()]
print("SM clock MHz min/median/max", min(clocks), sorted(clocks)[len(clocks) // 2], max(clocks),
      "power W max", max(power), "samples", len(clocks))
PY
