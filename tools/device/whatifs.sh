#!/usr/bin/env bash
# What-ifs on the GPU machine: the decode graph's time with the named kernels not launched
# (TURBOSPARK_SKIP_KERNELS, buf.rs; timing only, every result after one is wrong), one line per kernel set,
# segments on. Kernel sets are separated by spaces, kernels within a set by commas (which is why these
# cannot go through segments_ab.sh's VARIANTS). Run from the repository root:
#   SHAPE=qwen3-8b bash tools/device/whatifs.sh /tmp/b/main "" attn_prep attn_prep,attn_split_4,attn_combine
# ("" is the baseline). Run 125 priced the 8B's attention at 14.7 us a layer this way.
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bin=$1
shift
for set in "$@"; do
  echo "== ${SHAPE:-qwen35-4b} without: ${set:-(nothing)}"
  TURBOSPARK_SKIP_KERNELS="$set" CUDA_CHECK_CONFIGS=1 CUDA_CHECK_BIN="$bin" timeout 150 \
    bash "$ROOT/tools/device/cuda_check.sh" --only none ${SHAPE:+--shape $SHAPE} 2>&1 \
    | grep -E "decode graph alone|ERROR|panic" | sed 's/ per step on the GPU//'
done
