#!/usr/bin/env bash
# One device call that checks and times kernel candidates: the GPU tests of the touched kernels, forward
# tile sweeps (flashattn blocks, each candidate checked against SDPA before it is timed), and a decode
# step with and without programmatic dependent launch. Run from the repo root on the GPU machine:
#     FLASHATTN_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/gpu_kernel_round.sh
# Settings (environment): TESTS (pytest -k expression over tests/test_kernels.py test_kvcache.py
# test_combine.py; empty skips the tests), FORWARD_CANDIDATES and FORWARD_SHAPES ("hdim:seqlen[:causal]"
# words), DECODE_LENS, DECODE_PROFILE (0 skips the per-kernel decode profile). Logs under $OUT/round; a
# short table is printed last and results.tgz holds them.
set -u -o pipefail
OUT=${OUT:-gpu-out}
LOGS="$OUT/round"
mkdir -p "$LOGS"
export PYTHONPATH=src:tests PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
TESTS=${TESTS-"overlapped or chained or fused or test_matches_reference_on_gpu or large_merge"}
FORWARD_CANDIDATES=${FORWARD_CANDIDATES:-"128x128x8x3+tma,128x64x8x3,128x64x8x3+overlap,128x64x8x2+overlap,128x64x8x4+overlap"}
FORWARD_SHAPES=${FORWARD_SHAPES:-"128:4096 128:4096:causal 128:16384 128:16384:causal"}
DECODE_LENS=${DECODE_LENS:-"8192 65536"}
step() { local name=$1 limit=$2; shift 2; echo "== $name"; timeout "$limit" "$@" > "$LOGS/$name.log" 2>&1
         echo "exit $?" >> "$LOGS/$name.log"; }

nvidia-smi --query-gpu=name,driver_version --format=csv > "$LOGS/env.txt" 2>&1
if [ -n "$TESTS" ]; then
  step tests 240 python3 -m pytest tests/test_kernels.py tests/test_kvcache.py tests/test_combine.py -n 14 -q \
    -p no:cacheprovider -k "$TESTS"
fi
for shape in $FORWARD_SHAPES; do
  IFS=: read -r hdim seqlen causal <<< "$shape"
  step "forward-d$hdim-s$seqlen${causal:+-causal}" 120 python3 -m flashattn blocks --head-dim "$hdim" \
    --seqlen "$seqlen" ${causal:+--causal} --candidates "$FORWARD_CANDIDATES"
done
# decode steps: as shipped; without programmatic dependent launch (decode_ops.PROGRAMMATIC_LAUNCH); without
# the append fused into the attention launch (decode_ops.FUSED_APPEND_MAX_TOKENS = 0)
for variant in shipped unchained unfused; do
  step "decode-$variant" 120 python3 -c "import sys; import flashattn.decode_ops as d
if '$variant' == 'unchained': d.PROGRAMMATIC_LAUNCH = False
if '$variant' == 'unfused': d.FUSED_APPEND_MAX_TOKENS = 0
from flashattn.bench import main
sys.exit(main(['--mode', 'decode', '--cache-lens', *'$DECODE_LENS'.split(), '--batches', '1', '4', '16',
               '--out', '$LOGS', '--markdown', '$LOGS/decode-$variant.md']))"
done
[ "${DECODE_PROFILE:-1}" = 1 ] && step decode-profile 90 python3 benchmarks/decode_profile.py --batches 1 4 \
  --cache-lens $DECODE_LENS --num-splits 0 8 16

echo "=== summary"
[ -f "$LOGS/tests.log" ] && grep -E "^(FAILED|ERROR)|passed|failed" "$LOGS/tests.log" | tail -8
for f in "$LOGS"/forward-*.log; do echo "-- $(basename "$f" .log)"; grep -E "^\*? +forward " "$f"; done
for f in "$LOGS"/decode-*.md; do echo "-- $(basename "$f" .md)"; grep -E "^\| [0-9]" "$f"; done
[ -f "$LOGS/decode-profile.log" ] && grep -E "\*\*sum\*\*" "$LOGS/decode-profile.log"
tar czf "$OUT/results.tgz" -C "$OUT" round && rm -rf "$LOGS"
