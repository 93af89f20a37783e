#!/usr/bin/env bash
# On the GPU machine: the same cuda_check measurement with two binaries, alternating A B A B (so the
# machine's drift touches both alike), printing each run's decode lines; a kernel or layout change is
# judged only by pairs from one call. Run from the repository root after tools/device/unpack.sh.
#   bash tools/device/ab.sh .carry/bin/cuda_check_base .carry/bin/cuda_check [ROUNDS] [-- CUDA_CHECK ARGS]
# Default: 2 rounds of `--only none` (the qwen35-4b decode graph and chained greedy tok/s).
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
A=${1:?binary A}; B=${2:?binary B}; shift 2
ROUNDS=2
if [ $# -gt 0 ] && [ "$1" != "--" ]; then ROUNDS=$1; shift; fi
[ "${1:-}" = "--" ] && shift
ARGS=("$@"); [ ${#ARGS[@]} -eq 0 ] && ARGS=(--only none)
O=${OUT:-/tmp}
for i in $(seq 1 "$ROUNDS"); do
  for side in A B; do
    bin=$A; [ "$side" = B ] && bin=$B
    mkdir -p "$O/ab-$side$i"
    echo "=== $side #$i ($bin ${ARGS[*]})"
    OUT=$O/ab-$side$i CUDA_CHECK_BIN=$bin bash tools/device/cuda_check.sh "${ARGS[@]}" >/dev/null 2>&1
    grep -E "tok/s|graph alone|chained|rc=" "$O/ab-$side$i/cuda_check.log" | cut -c1-240
  done
done
