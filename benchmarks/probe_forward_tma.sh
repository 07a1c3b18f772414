#!/usr/bin/env bash
# Forward tile sweep with the sm90 option (TMA descriptors) on the GPU machine:
# every (head dim, causal) at seqlen 4096 (16k tokens, heads * head dim = 2048), each candidate checked
# against SDPA before it is timed (flashattn blocks). Usage: bash benchmarks/probe_forward_tma.sh
# Logs and JSON under $OUT (or ./gpu-out); the best rows are printed last.
set -u -o pipefail
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONPATH=src PYTHONUNBUFFERED=1
SEQLEN=${SEQLEN:-4096}
declare -A CANDIDATES=(
  [64]="128x64x8x3,128x64x8x3+tma,256x64x8x2,256x64x8x2+tma,256x128x8x2+tma"
  [128]="128x128x8x3+tma,128x64x8x3,256x32x8x3+tma,128x64x8x4+tma"
  [256]="128x64x8x2,128x64x8x2+tma,128x32x8x3+tma,64x64x4x2+tma"
)
for d in ${HEAD_DIMS:-64 128 256}; do
  for causal in "" "--causal"; do
    tag="d${d}${causal:+-causal}-s${SEQLEN}"
    timeout 240 python3 -m flashattn blocks --seqlen "$SEQLEN" --head-dim "$d" $causal \
      --candidates "${CANDIDATES[$d]}" --json > "$OUT/blocks-$tag.json" 2> "$OUT/blocks-$tag.log"
    echo "$tag exit $?" >> "$OUT/blocks-$tag.log"
  done
done
python3 - "$OUT" <<'PY'
import json, pathlib, sys
for path in sorted(pathlib.Path(sys.argv[1]).glob("blocks-*.json")):
    try:
        rows = json.loads(path.read_text())["results"]
    except Exception as error:  # a crashed run leaves no JSON
        print(path.stem, "no result:", error)
        continue
    cells = "  ".join(f"{r['config']}={r['tflops']:.0f}" if r["tflops"] else f"{r['config']}={r['status']}" for r in rows)
    print(f"{path.stem:18} {cells}")
PY
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout 200 python3 -m pytest tests/test_kernels.py::test_tma_forward_matches_reference -n 8 -q \
    -p no:cacheprovider > "$OUT/tests-tma.log" 2>&1
  echo "=== TMA tests ==="; tail -3 "$OUT/tests-tma.log"
fi
