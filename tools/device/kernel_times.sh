#!/usr/bin/env bash
# Per-kernel GPU time of decode-graph nodes under Nsight Compute (each node profiled alone, so these are
# isolated durations: no PDL overlap, caches not flushed), for bench configuration CUDA_CHECK_CONFIGS
# (default 1: graphs + PDL + segments) of the 4B shape. Skips the prefills (SKIP launches), profiles COUNT.
# Prints the median duration per kernel name (tools/device/kernel_times_summary.py). Run from the repo root:
#   CUDA_CHECK_BIN=/tmp/b/cc bash tools/device/kernel_times.sh
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "kernel_times: no ncu on this machine"; exit 3; }
OUTD=${OUT:-/tmp}
mkdir -p "$OUTD/kt"
CUDA_CHECK_CONFIGS=${CUDA_CHECK_CONFIGS:-1} OUT="$OUTD/kt" \
  CUDA_CHECK_WRAP="$NCU --graph-profiling node --launch-skip ${SKIP:-2000} --launch-count ${COUNT:-400} --metrics gpu__time_duration.sum --cache-control none --clock-control none --csv --page raw --log-file /tmp/kt.csv" \
  bash "$ROOT/tools/device/cuda_check.sh" --only none "$@" > /dev/null 2>&1
[ -s /tmp/kt.csv ] || { echo "kernel_times: no csv"; tail -20 "$OUTD/kt/cuda_check.log"; exit 4; }
xz -c /tmp/kt.csv > "$OUTD/kernel_times.csv.xz"
python3 "$ROOT/tools/device/kernel_times_summary.py" /tmp/kt.csv
