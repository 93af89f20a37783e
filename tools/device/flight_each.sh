#!/usr/bin/env bash
# Caps between the multiples of 4 pages (`wip/seg-flight-each.patch`, rebased in session 18 on the boundary rule:
# TURBOSPARK_SEG_FLIGHT_EACH gives each producer warp its own copies in flight in the rows, ':'-separated, e.g.
# 2:2:1:1 = 6 pages a block; run 153 lost these variants to segments_ab.sh's comma split). Run 155-156: 8 / 12 / 16
# pages 4B 2.409 / 2.376 / 2.373 ms, 8B 4.313 / 4.314 / 4.335, 9B flat. One call, ~5 minutes with the cold start.
# Build here first:
#   bash tools/device/build_variants.sh main e=seg-flight-each
#   bash tools/device/pack.sh trim weights
# then on the device (carry [".carry"]), from the repository root:
#   mkdir -p /tmp/b && tar xJf .carry/bins.tar.xz -C /tmp/b && bash tools/device/flight_each.sh
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
AB="$ROOT/tools/device/segments_ab.sh"
# (X=0: main's ~64 KB (12 pages of the 4B's 5 KB, 8 of the 9B's / 8B's 8 KB); the others 6, 7, 9, 10, 11 pages.)
V="X=0 TURBOSPARK_SEG_FLIGHT_EACH=2:2:1:1 TURBOSPARK_SEG_FLIGHT_EACH=2:2:2:1 TURBOSPARK_SEG_FLIGHT_EACH=3:2:2:2 TURBOSPARK_SEG_FLIGHT_EACH=3:3:2:2 TURBOSPARK_SEG_FLIGHT_EACH=3:3:3:2"
echo "#### 4B, twice"
CUDA_CHECK_CONFIGS=0,1 VARIANTS="$V $V" bash "$AB" /tmp/b/e
for shape in qwen35-9b qwen3-8b; do
  echo "#### $shape"
  SHAPE=$shape CUDA_CHECK_CONFIGS=0,1 VARIANTS="$V" bash "$AB" /tmp/b/e
done
