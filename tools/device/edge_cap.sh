#!/usr/bin/env bash
# The in-flight cap at a stage boundary (session 18; run 152 measured 4 pages there: 4B 2.448 ms against 2.497):
# the new default against the old rule, with the rows' cap at 12 / 16, no copies at all at a boundary, and a
# boundary that starts as soon as a producer copies ahead of the consumers' stage; 4B twice, 9B and 8B once; the
# trace; the full check and the table. ~8 minutes with the cold start. Build here first:
#   bash tools/device/build_variants.sh main && bash tools/device/pack.sh trim weights
# then on the device (carry [".carry"]), from the repository root:
#   mkdir -p /tmp/b && tar xJf .carry/bins.tar.xz -C /tmp/b && bash tools/device/edge_cap.sh
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
AB="$ROOT/tools/device/segments_ab.sh"
V="X=0 TURBOSPARK_SEG_FLIGHT_EDGE=8 TURBOSPARK_SEG_FLIGHT=12 TURBOSPARK_SEG_FLIGHT=16 TURBOSPARK_SEG_EDGE_PAUSE=1 TURBOSPARK_SEG_EDGE_AHEAD=1 TURBOSPARK_SEG_EDGE_AHEAD=1,TURBOSPARK_SEG_FLIGHT=12"
echo "#### 4B, twice"
CUDA_CHECK_CONFIGS=0,1 VARIANTS="$V $V" bash "$AB" /tmp/b/main
for shape in qwen35-9b qwen3-8b; do
  echo "#### $shape"
  SHAPE=$shape CUDA_CHECK_CONFIGS=0,1 VARIANTS="X=0 TURBOSPARK_SEG_FLIGHT_EDGE=8 TURBOSPARK_SEG_FLIGHT=12 TURBOSPARK_SEG_EDGE_AHEAD=1" bash "$AB" /tmp/b/main
done
echo "#### 4B trace"
TRACE=1 CUDA_CHECK_CONFIGS=0,1 VARIANTS="X=0" bash "$AB" /tmp/b/main
echo "#### full check"
CUDA_CHECK_BIN=/tmp/b/main timeout 120 bash "$ROOT/tools/device/cuda_check.sh" 2>&1 | grep -E "FAIL|RESULT|rc="
cp "${OUT:-/tmp}/cuda_check.log" "${OUT:-/tmp}/full_check.log" 2>/dev/null
echo "#### the table"
CUDA_CHECK_BIN=/tmp/b/main timeout 200 bash "$ROOT/tools/device/cuda_check.sh" --table 2>&1 | grep -E "D2D|read-only|^\| "
