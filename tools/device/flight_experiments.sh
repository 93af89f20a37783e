#!/usr/bin/env bash
# The experiments prepared in session 17 beside the in-flight cap (tools/device/README.md, "Where to look next
# (end of session 17)"), in one device call of ~8 minutes with the cold start. Build here first:
#   bash tools/device/build_variants.sh main ph=seg-flight-phases r=seg-ring-64-pages t=seg-dynamic-tail
#   bash tools/device/pack.sh trim weights
# then on the device (carry [".carry"]), from the repository root:
#   mkdir -p /tmp/b && tar xJf .carry/bins.tar.xz -C /tmp/b && bash tools/device/flight_experiments.sh
# Prints: the cap by phase (before the consumers' PDL wait: EARLY; during staging and grid barriers: EDGE),
# the 184 KB ring (36 pages) with the cap, dynamic tails again now that round trips are shorter (run 147 lost
# 0.2 ms to producer 0's claims queued behind the uncapped ring), and the table (the 8B now streams evict-first).
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
AB="$ROOT/tools/device/segments_ab.sh"
echo "#### 4B: the cap by phase (patched binary; X=0 is main's 8 pages throughout), twice"
CUDA_CHECK_CONFIGS=0,1 VARIANTS="X=0 TURBOSPARK_SEG_FLIGHT_EDGE=4 TURBOSPARK_SEG_FLIGHT_EDGE=16 TURBOSPARK_SEG_FLIGHT_EDGE=0 TURBOSPARK_SEG_FLIGHT_EARLY=4 TURBOSPARK_SEG_FLIGHT_EARLY=16 TURBOSPARK_SEG_FLIGHT_EARLY=0 X=0 TURBOSPARK_SEG_FLIGHT_EDGE=4 TURBOSPARK_SEG_FLIGHT_EDGE=16 TURBOSPARK_SEG_FLIGHT_EDGE=0 TURBOSPARK_SEG_FLIGHT_EARLY=4 TURBOSPARK_SEG_FLIGHT_EARLY=16 TURBOSPARK_SEG_FLIGHT_EARLY=0" bash "$AB" /tmp/b/ph
CUDA_CHECK_CONFIGS=0,1 VARIANTS="X=0" bash "$AB" /tmp/b/main
echo "#### 4B trace (main): how much of the producers' waits is the cap"
TRACE=1 CUDA_CHECK_CONFIGS=0,1 VARIANTS="X=0" bash "$AB" /tmp/b/main
echo "#### 4B: the 184 KB ring with the cap (patched binary: 160 KB / 184 KB, 8 and 12 pages in flight), twice"
CUDA_CHECK_CONFIGS=0,1 VARIANTS="X=0 TURBOSPARK_SEG_RING_KB=184 TURBOSPARK_SEG_RING_KB=184,TURBOSPARK_SEG_FLIGHT=12 X=0 TURBOSPARK_SEG_RING_KB=184 TURBOSPARK_SEG_RING_KB=184,TURBOSPARK_SEG_FLIGHT=12" bash "$AB" /tmp/b/r
echo "#### 4B: dynamic tails with the cap (patched binary: off / 4 / 8 rounds, stages 1 .. n-2), twice"
CUDA_CHECK_CONFIGS=0,1 VARIANTS="X=0 TURBOSPARK_SEG_TAIL=4 TURBOSPARK_SEG_TAIL=8 X=0 TURBOSPARK_SEG_TAIL=4 TURBOSPARK_SEG_TAIL=8" bash "$AB" /tmp/b/t
echo "#### the table"
CUDA_CHECK_BIN=/tmp/b/main timeout 200 bash "$ROOT/tools/device/cuda_check.sh" --table 2>&1 | grep -E "D2D|read-only|^\| "
