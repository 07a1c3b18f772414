#!/usr/bin/env bash
# Call A: causal Gluon forward tiles counted back from the last row, consumers outside the sequence idle.
# GPU tests of the two Gluon kernels that share the tile plan, then an A/B of the hdim-64 forward against the
# session-19 kernels (base_src: src/flashattn at 4938753), alternating, then the ratios against SDPA.
set -u
export PYTHONUNBUFFERED=1 FLASHATTN_COMMIT=${FLASHATTN_COMMIT:-unknown}
mkdir -p "$OUT"
HERE=benchmarks/results/20261123-session20
source benchmarks/gpu_tests.sh
PYTHONPATH=src:tests:benchmarks run_tests fwd 200 tests/test_forward_hopper.py tests/test_dq_hopper.py tests/test_api.py
bench() {  # bench NAME SRC PROVIDERS...
  local name=$1 src=$2; shift 2
  PYTHONPATH=$src timeout 120 python3 -m flashattn bench --providers "$@" --head-dims 64 --modes fwd \
    --seqlens 2048 4096 8192 16384 --out "$OUT/bench-$name" --markdown "$OUT/grid-$name.md" > "$OUT/bench-$name.log" 2>&1
  echo "bench $name exit $?"
}
bench base1 $HERE/base_src flashattn
bench new1 src flashattn
bench base2 $HERE/base_src flashattn
bench new2 src flashattn
bench ratios src flashattn sdpa_flash sdpa_cudnn
python3 - "$OUT" <<'PY'
import json, sys, glob
out = sys.argv[1]
rows = {}
for name in ["base1", "new1", "base2", "new2"]:
    for f in glob.glob(f"{out}/bench-{name}/*.json"):
        for r in json.load(open(f))["results"]:
            if r.get("provider") != "flashattn" or not r.get("fwd_tflops"): continue
            key = (r["case"]["head_dim"], r["case"]["causal"], r["case"]["seqlen"])
            rows.setdefault(key, {})[name] = r["fwd_tflops"]
print("hdim causal seqlen | base1 new1 base2 new2 | new/base")
for key in sorted(rows):
    v = rows[key]; b = [v.get("base1"), v.get("base2")]; n = [v.get("new1"), v.get("new2")]
    ratio = (sum(x for x in n if x) / max(1, len([x for x in n if x]))) / (sum(x for x in b if x) / max(1, len([x for x in b if x]))) if all(b) and all(n) else float("nan")
    print(*key, "|", *[f"{v.get(k, 0):.1f}" for k in ["base1", "new1", "base2", "new2"]], "|", f"{ratio:.3f}")
PY
tail -20 "$OUT/grid-ratios.md"
