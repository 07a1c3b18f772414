#!/usr/bin/env bash
# Call A: the fused merge (the last split of a tile merges the partials). GPU tests of the decode paths, then the
# step time with the fused merge (table) against the combine launch (+combine), auto split count, twice.
set -u
export PYTHONUNBUFFERED=1 FLASHATTN_COMMIT=${FLASHATTN_COMMIT:-unknown}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv > "$OUT/gpu.txt"
export PYTHONPATH=src:tests
source benchmarks/gpu_tests.sh
run_tests decode 200 tests/test_kvcache.py tests/test_combine.py tests/test_launch_plans.py tests/test_bench_decode.py
export PYTHONPATH=src
for round in 1 2; do
  timeout 150 python3 benchmarks/decode_splits.py --cache-lens 4096 8192 16384 65536 --batches 1 2 4 8 16 \
    --configs 64x4x3+combine --auto-only --out "$OUT/ab-contiguous-$round.json" > "$OUT/ab-contiguous-$round.log" 2>&1
  echo "contiguous round $round exit $?"
  timeout 60 python3 benchmarks/decode_splits.py --cache-lens 4096 8192 16384 --batches 1 4 8 16 --page-size 256 \
    --configs 64x4x3+combine --auto-only --out "$OUT/ab-paged-$round.json" > "$OUT/ab-paged-$round.log" 2>&1
  echo "paged round $round exit $?"
done
python3 - "$OUT" <<'PY'
import json, sys, glob, collections
rows = collections.defaultdict(list)
for path in sorted(glob.glob(sys.argv[1] + "/ab-*.json")):
    for result in json.load(open(path))["results"]:
        c = result["case"]; auto = str(result["auto"])
        fused = result["configs"]["table"]["us"][auto]; comb = result["configs"]["64x4x3+combine"]["us"][auto]
        rows[(c["page_size"] or 0, c["cache_len"], c["batch"], auto)].append((fused, comb))
print("| pages | cache | batch | splits | fused merge us | combine launch us | fused/combine |")
print("|---|---|---|---|---|---|---|")
for (p, n, b, s), runs in sorted(rows.items()):
    f = " / ".join(f"{x[0]:.1f}" for x in runs); c = " / ".join(f"{x[1]:.1f}" for x in runs)
    ratio = sum(x[0] for x in runs) / sum(x[1] for x in runs)
    print(f"| {p or '-'} | {n} | {b} | {s} | {f} | {c} | {ratio:.3f} |")
PY
