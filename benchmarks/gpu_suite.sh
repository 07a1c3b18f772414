#!/usr/bin/env bash
# The whole test suite on the GPU machine, in shards that each fit one device call (10 minutes, with
# the kernels compiled from scratch on a fresh machine). Run shards 1-4 in turn:
#     SHARD=1 bash benchmarks/gpu_suite.sh
# Shard 4 needs transformers: carry .wheels (see README, "GPU machine") and it installs them to /tmp/hf.
# Logs go to $OUT/suite-<shard>.log; the failures and the pytest summary are printed last.
set -u -o pipefail
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONPATH=src:tests PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
case "${SHARD:?set SHARD=1..4}" in
  1) FILES="tests/test_kernels.py tests/test_api.py tests/test_reference.py tests/test_cpu_path.py tests/test_compile.py" ;;
  2) FILES="tests/test_mask_skip.py tests/test_sdpa.py tests/test_sdpa_override.py tests/test_nn.py" ;;
  3) FILES="tests/test_varlen.py tests/test_varlen_paged.py tests/test_kvcache.py tests/test_combine.py" ;;
  4) if ls .wheels/*.whl > /dev/null 2>&1; then
       pip install -q --no-index --no-deps --target /tmp/hf $(ls .wheels/*.whl | grep -v numpy) > /dev/null 2>&1
       export PYTHONPATH=$PYTHONPATH:/tmp/hf
     fi
     FILES="tests/test_dkdv_split.py tests/test_transformers.py tests/test_measure.py tests/test_iomeasure.py
            tests/test_configs.py tests/test_blocks.py tests/test_bench.py tests/test_bench_decode.py
            tests/test_demo_cli.py tests/test_memory.py tests/test_iomodel.py tests/test_plot_block_sweeps.py" ;;
  *) echo "SHARD must be 1, 2, 3 or 4" >&2; exit 2 ;;
esac
LOG="$OUT/suite-$SHARD.log"
# ncu-based tests profile the GPU: they run alone, after the parallel part
timeout "${SUITE_TIMEOUT:-540}" python3 -m pytest $FILES -n "${WORKERS:-14}" -q -p no:cacheprovider \
  -k "not test_gpu_ncu" > "$LOG" 2>&1
echo "pytest exit $?" >> "$LOG"
if [ "$SHARD" = 4 ]; then
  timeout 120 python3 -m pytest tests/test_iomeasure.py -k test_gpu_ncu -q -p no:cacheprovider >> "$LOG" 2>&1
  echo "ncu tests exit $?" >> "$LOG"
fi
grep -E "^(FAILED|ERROR)" "$LOG" | head -30
grep -E "passed|failed|exit" "$LOG" | tail -4
