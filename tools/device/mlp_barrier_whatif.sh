#!/usr/bin/env bash
# Prepared in session 21 (not yet run): what the grid barrier between an MLP's gate_up and down stages costs, the
# upper bound of a barrier-free MLP (each block's slice of the intermediate times down's matching columns, partials
# reduced in a fixed order: "Where to look next (end of session 21)"). Timing only: with
# TURBOSPARK_SEG_WHATIF_NO_MLP_BARRIER=1 the down stage stages an input other blocks are still writing (wrong sums;
# the "identical" lines will say DIFFER). TURBOSPARK_SEG_DEBUG=2 drops every grid barrier (the bound of all of them).
# ~4 minutes with the cold start. Build here:
#   cargo build --release -p cuda-backend --bin cuda_check && bash tools/device/pack.sh bins cc=target/release/cuda_check
#   bash tools/device/pack.sh trim lean
# then on the device (carry [".carry"]): mkdir -p /tmp/b && tar xJf .carry/bins.tar.xz -C /tmp/b && bash tools/device/mlp_barrier_whatif.sh
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
V="X=0 TURBOSPARK_SEG_WHATIF_NO_MLP_BARRIER=1 TURBOSPARK_SEG_DEBUG=2 X=0 TURBOSPARK_SEG_WHATIF_NO_MLP_BARRIER=1"
for shape in qwen35-4b qwen3-8b; do
  echo "#### $shape"
  SHAPE=$shape CUDA_CHECK_CONFIGS=1 VARIANTS="$V" bash "$ROOT/tools/device/segments_ab.sh" /tmp/b/cc 2>&1 \
    | grep -E "^== |decode graph alone"
done
