#!/usr/bin/env bash
# Sourced by a device call's script: run_tests NAME LIMIT PYTEST_ARGS... runs the GPU-marked tests among
# PYTEST_ARGS on 8 workers (WORKERS overrides) within LIMIT seconds, logs to $OUT/tests-NAME.log and prints the
# exit status with pytest's last line (124: the limit cut the run), then the first 20 failures and errors.
run_tests() {
  local name=$1 limit=$2
  shift 2
  timeout "$limit" python3 -m pytest -q -m gpu -n "${WORKERS:-8}" -p no:cacheprovider "$@" > "$OUT/tests-$name.log" 2>&1
  echo "$name tests exit $?: $(tail -1 "$OUT/tests-$name.log")"
  grep -E "^(FAILED|ERROR)" "$OUT/tests-$name.log" | head -20
}
