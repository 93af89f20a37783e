#!/usr/bin/env bash
# Caps between the multiples of 4 pages (session 17, `wip/seg-flight-each.patch`: TURBOSPARK_SEG_FLIGHT_EACH gives
# each producer warp its own copies in flight, e.g. 2,2,1,1 = 6 pages a block): run 148-149 measured 4 / 8 / 12
# pages (4B 2.867 / 2.486 / 2.510 ms; 8B 4.709 / 4.540 / 4.591), so the optimum is somewhere in 5-11. One call,
# ~6 minutes with the cold start. Build here first:
#   bash tools/device/build_variants.sh main e=seg-flight-each
#   bash tools/device/pack.sh trim weights
# then on the device (carry [".carry"]), from the repository root:
#   mkdir -p /tmp/b && tar xJf .carry/bins.tar.xz -C /tmp/b && bash tools/device/flight_each.sh
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
AB="$ROOT/tools/device/segments_ab.sh"
# (X=0: main's 8 pages; the others 6, 7, 9, 10 pages.)
V="X=0 TURBOSPARK_SEG_FLIGHT_EACH=2,2,1,1 TURBOSPARK_SEG_FLIGHT_EACH=2,2,2,1 TURBOSPARK_SEG_FLIGHT_EACH=3,2,2,2 TURBOSPARK_SEG_FLIGHT_EACH=3,3,2,2"
echo "#### 4B, twice"
CUDA_CHECK_CONFIGS=0,1 VARIANTS="$V $V" bash "$AB" /tmp/b/e
for shape in qwen35-9b qwen3-8b; do
  echo "#### $shape"
  SHAPE=$shape CUDA_CHECK_CONFIGS=0,1 VARIANTS="$V" bash "$AB" /tmp/b/e
done
