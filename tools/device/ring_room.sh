#!/usr/bin/env bash
# A larger weight ring (session 18, `wip/seg-ring-room.patch`): run 157 measured the 4B step at 2.480 / 2.425 / 2.377 ms
# with 128 / 144 / 160 KB rings, so more pages should bank more across a boundary. The patch lets a launch's ring take
# what its staged input leaves of the device's shared memory (64-bit page parities; x16 keeps 32 and runs only rings of
# <= 32 pages), with TURBOSPARK_SEG_RING_KB up to 224. Run 158: kept, as the default (224 KB, trimmed per launch). On the 4B (5 KB pages, 36 KB input
# room) 184 and 224 both give 36 pages (180 KB); the 9B / 8B (8 KB pages, 48 KB room) gain only in segments without
# the 12288-wide input. ~6 minutes with the cold start. Build here first:
#   bash tools/device/build_variants.sh main room=seg-ring-room && bash tools/device/pack.sh trim weights
# then on the device (carry [".carry"]), from the repository root:
#   mkdir -p /tmp/b && tar xJf .carry/bins.tar.xz -C /tmp/b && bash tools/device/ring_room.sh
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
AB="$ROOT/tools/device/segments_ab.sh"
echo "#### 4B, twice: main, main with the boundary ending at the barrier (not after the staging); the patch at 160 KB (the 64-bit parities' cost), 184 KB, 224 KB"
for i in 1 2; do
  CUDA_CHECK_CONFIGS=0,1 VARIANTS="X=0 TURBOSPARK_SEG_EDGE_TO_BARRIER=1" bash "$AB" /tmp/b/main
  CUDA_CHECK_CONFIGS=0,1 VARIANTS="X=0 TURBOSPARK_SEG_RING_KB=184 TURBOSPARK_SEG_RING_KB=224" bash "$AB" /tmp/b/room
done
for shape in qwen35-9b qwen3-8b; do
  echo "#### $shape"
  SHAPE=$shape CUDA_CHECK_CONFIGS=0,1 VARIANTS="X=0" bash "$AB" /tmp/b/main
  SHAPE=$shape CUDA_CHECK_CONFIGS=0,1 VARIANTS="X=0 TURBOSPARK_SEG_RING_KB=224" bash "$AB" /tmp/b/room
done
echo "#### 4B trace, 160 / 224 KB (pages banked across the boundaries)"
TRACE=1 CUDA_CHECK_CONFIGS=0,1 VARIANTS="X=0 TURBOSPARK_SEG_RING_KB=224" bash "$AB" /tmp/b/room
echo "#### full check and table, 224 KB"
TURBOSPARK_SEG_RING_KB=224 CUDA_CHECK_BIN=/tmp/b/room timeout 120 bash "$ROOT/tools/device/cuda_check.sh" 2>&1 | grep -E "FAIL|RESULT|rc="
TURBOSPARK_SEG_RING_KB=224 CUDA_CHECK_BIN=/tmp/b/room timeout 200 bash "$ROOT/tools/device/cuda_check.sh" --table 2>&1 | grep -E "D2D|read-only|^\| "
