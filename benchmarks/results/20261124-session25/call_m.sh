#!/usr/bin/env bash
# Call M: call D found the programs of a long one-wave step (64k batch 16: 128 programs on 132 SMs) ending up to 58 us
# apart. Two or three splits per (sequence, kv head) there: more, shorter programs, the later ones taken by the SMs
# that finish first (and the 4 idle SMs used), for a merge launch (about 2 us). With the append.
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
export PYTHONPATH=src
timeout 200 python3 benchmarks/decode_gluon_ab.py --cache-lens 16384 65536 131072 --batches 16 \
  --variants auto auto+s2 auto+s3 --rounds 3 --append > "$OUT/ab-splits-16.log" 2>&1
echo "ab 16 exit $?"
timeout 150 python3 benchmarks/decode_gluon_ab.py --cache-lens 65536 131072 --batches 32 \
  --variants auto auto+s2 --rounds 3 --append > "$OUT/ab-splits-32.log" 2>&1
echo "ab 32 exit $?"
grep -E "Error|Traceback" -A3 "$OUT"/ab-*.log | head -20
grep -h "^|" "$OUT/ab-splits-16.log" "$OUT/ab-splits-32.log"
