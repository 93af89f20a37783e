#!/usr/bin/env bash
# The boundary rule kept in session 18 (a producer copying for a stage its consumers have not yet staged keeps 4
# pages in flight; ~64 KB in the rows): the default against 8 / 16 pages in the rows on all three shapes, the trace,
# the full check and the table. ~5 minutes with the cold start. Build here first:
#   bash tools/device/build_variants.sh main && bash tools/device/pack.sh trim weights
# then on the device (carry [".carry"]), from the repository root:
#   mkdir -p /tmp/b && tar xJf .carry/bins.tar.xz -C /tmp/b && bash tools/device/edge_ahead_check.sh
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
AB="$ROOT/tools/device/segments_ab.sh"
V="X=0 TURBOSPARK_SEG_FLIGHT=8 TURBOSPARK_SEG_FLIGHT=16"
echo "#### 4B, twice"
CUDA_CHECK_CONFIGS=0,1 VARIANTS="$V $V" bash "$AB" /tmp/b/main
for shape in qwen35-9b qwen3-8b; do
  echo "#### $shape"
  SHAPE=$shape CUDA_CHECK_CONFIGS=0,1 VARIANTS="$V" bash "$AB" /tmp/b/main
done
echo "#### 4B trace"
TRACE=1 CUDA_CHECK_CONFIGS=0,1 VARIANTS="X=0" bash "$AB" /tmp/b/main
echo "#### full check"
CUDA_CHECK_BIN=/tmp/b/main timeout 120 bash "$ROOT/tools/device/cuda_check.sh" 2>&1 | grep -E "FAIL|RESULT|rc="
cp "${OUT:-/tmp}/cuda_check.log" "${OUT:-/tmp}/full_check.log" 2>/dev/null
echo "#### the table"
CUDA_CHECK_BIN=/tmp/b/main timeout 200 bash "$ROOT/tools/device/cuda_check.sh" --table 2>&1 | grep -E "D2D|read-only|^\| "
