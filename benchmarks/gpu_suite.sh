#!/usr/bin/env bash
# The test suite on a GPU machine (one H200, 16 cores), and the benchmarks.
#     SKIP_BENCH=1 bash benchmarks/gpu_suite.sh     # every test (over 550 s on a cold Triton cache: past one
#                                                   # 10-minute device call with the Nsight Compute tests)
#     PARTS=2 SHARD=1 SKIP_BENCH=1 bash benchmarks/gpu_suite.sh; then SHARD=2   # the same in two calls
#     bash benchmarks/gpu_suite.sh                  # every test, then the benchmarks (dense, varlen, decode)
#     SHARD=1 bash benchmarks/gpu_suite.sh ... SHARD=5   # one fifth of the tests (PARTS=5), no benchmark
#     GPUS=2 bash benchmarks/gpu_suite.sh           # every test, in GPUS parts at once, part i on GPU i - 1 (a
#                                                   # machine of 2 H200s: about 400 s on a cold cache); no benchmark
# The tests run in WORKERS (default 14) pytest-xdist workers that share the GPU, compile kernels into one Triton cache
# (a cold cache's compiles are most of a first run) and steal work from each other; the tests of one xdist_group take
# turns (a lock file per group, tests/conftest.py), so those that take tens of GB of GPU memory (float32 references of
# long sequences: tests/cases.py, GPU_MEMORY_GROUP) run one at a time. SHARD splits the run by a hash of the test id
# (tests/conftest.py: FLASHATTN_TEST_SHARD), each part a PARTS-th of every test file. TESTS picks test files or folders
# (default tests). test_transformers needs transformers: wheels under .wheels/ are installed to /tmp/hf. The Nsight
# Compute tests profile the GPU and run alone, after the whole run or part 5's.
# The benchmarks write benchmarks/results/<gpu>-<mode>.json (BENCH_OUT: another folder; SKIP_BENCH=1: none), their
# commit from git ("-dirty" past it) or FLASHATTN_COMMIT, for a copy of the tree whose .git is not its own;
# `python benchmarks/report.py` then regenerates BENCHMARKS.md and the README's summary from them.
# Logs go to $OUT (default gpu-out): suite[-<part>].log, bench-<mode>.log; failures and pytest's summary last.
set -u -o pipefail
OUT=${OUT:-gpu-out}
PARTS=${PARTS:-5}
TESTS=${TESTS:-tests}
mkdir -p "$OUT"
export PYTHONPATH=src:tests PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
SHARD=${SHARD:-}
if [ "${GPUS:-1}" -gt 1 ] && [ -z "$SHARD" ]; then
  for part in $(seq 1 "$GPUS"); do
    CUDA_VISIBLE_DEVICES=$((part - 1)) GPUS=1 PARTS=$GPUS SHARD=$part SKIP_BENCH=1 bash "$0" > "$OUT/part-$part.txt" 2>&1 &
  done
  wait
  for part in $(seq 1 "$GPUS"); do echo "== part $part"; cat "$OUT/part-$part.txt"; done
  exit 0
fi
case "$SHARD" in
  "") LOG="$OUT/suite.log" ;;
  [1-5]) LOG="$OUT/suite-$SHARD.log"; export FLASHATTN_TEST_SHARD="$SHARD/$PARTS" ;;
  *) echo "SHARD must be 1 to $PARTS, or unset for the whole suite" >&2; exit 2 ;;
esac
if ls .wheels/*.whl > /dev/null 2>&1; then
  pip install -q --no-index --no-deps --target /tmp/hf $(ls .wheels/*.whl | grep -v numpy) > /dev/null 2>&1
  export PYTHONPATH=$PYTHONPATH:/tmp/hf
fi
start=$SECONDS
timeout -s INT "${SUITE_TIMEOUT:-545}" python3 -m pytest $TESTS -n "${WORKERS:-14}" --dist worksteal -q \
  -p no:cacheprovider -k "not test_gpu_ncu" --durations=25 > "$LOG" 2>&1
echo "pytest exit $?" >> "$LOG"
if [ "$SHARD" = "" ] || [ "$SHARD" = "$PARTS" ]; then
  timeout 45 python3 -m pytest tests/test_iomeasure.py -k test_gpu_ncu -q -p no:cacheprovider >> "$LOG" 2>&1
  echo "ncu tests exit $?" >> "$LOG"
fi
echo "tests: $((SECONDS - start)) s" >> "$LOG"
grep -E "^(FAILED|ERROR)" "$LOG" | head -30
grep -E "passed|failed|exit|^tests:" "$LOG" | tail -5

if [ "$SHARD" = "" ] && [ "${SKIP_BENCH:-0}" != 1 ]; then
  BENCH_OUT=${BENCH_OUT:-benchmarks/results}
  # dense: the full grid, flashattn against cuDNN and FA4 (where installed); varlen: packed against dense calls on the same tokens; decode: the KV cache
  declare -A BENCH_ARGS=(
    [dense]=""
    [varlen]="--providers flashattn --varlen --head-dims 128 --seqlens 512 1024 16384"
    [decode]="--mode decode --cache-lens 4096 8192 16384 131072 --batches 1 4 8 16 64"
  )
  for mode in dense varlen decode; do
    timeout "${BENCH_TIMEOUT:-900}" python3 -m flashattn.tools.bench ${BENCH_ARGS[$mode]} --out "$BENCH_OUT" \
      > "$OUT/bench-$mode.log" 2>&1
    echo "bench $mode exit $?: $(grep '^results:' "$OUT/bench-$mode.log")"
  done
fi
