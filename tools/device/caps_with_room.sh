#!/usr/bin/env bash
# The in-flight caps again with the ring as large as fits (session 19, run 165): the 4B's 36-page ring (180 KB) may
# move the rows' optimum (12 pages of 5 KB, run 155 on a 32-page ring) or the boundary's (4 pages). Env knobs only.
# ~4 minutes with the cold start. Build here first:
#   cargo build --release -p cuda-backend --bin cuda_check && bash tools/device/pack.sh bins cc=target/release/cuda_check
#   bash tools/device/pack.sh trim weights
# then on the device (carry [".carry"]), from the repository root:
#   mkdir -p /tmp/b && tar xJf .carry/bins.tar.xz -C /tmp/b && bash tools/device/caps_with_room.sh
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CUDA_CHECK_CONFIGS=0,1 VARIANTS="X=0 TURBOSPARK_SEG_FLIGHT=16 TURBOSPARK_SEG_FLIGHT=20 TURBOSPARK_SEG_FLIGHT=8 \
TURBOSPARK_SEG_FLIGHT_EDGE=8 TURBOSPARK_SEG_FLIGHT=16,TURBOSPARK_SEG_FLIGHT_EDGE=8 X=0" \
  bash "$ROOT/tools/device/segments_ab.sh" /tmp/b/cc
