#!/usr/bin/env bash
# A/B of the decode-step GEMV segments on the GPU machine, in one call: for each cuda_check binary given
# (e.g. main's and a branch's) and each environment variant, the 4B-shaped bench's decode-graph
# time with segments off and on, and whether segments reproduce the per-GEMV launches' tokens and logits
# bit for bit. ~8 s of GPU time per line. Run from the repository root:
#   bash tools/device/segments_ab.sh /tmp/b/cc_main /tmp/b/cc_branch
# Variants (segment.rs Config; a binary ignores the variables it does not know): the default (X=0) and
# TURBOSPARK_SEG_PREFETCH=0 (no L2 prefetch of the GDN state); others, e.g. TURBOSPARK_SEG_REGCAP=1 or
# TURBOSPARK_CARVEOUT=100, through VARIANTS (comma-separated variables per variant, README runs 83-88).
# SHAPE=qwen35-9b (or qwen3-8b) benches that synth shape instead of the 4B.
# TRACE=1 also prints each variant's stage trace of a 4B GDN layer's segment (~10 s more per line).
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VARIANTS=${VARIANTS:-"X=0 TURBOSPARK_SEG_PREFETCH=0 X=0 TURBOSPARK_SEG_PREFETCH=0"}
for bin in "$@"; do
  for v in $VARIANTS; do
    echo "== $bin $v"
    env ${v//,/ } CUDA_CHECK_BIN="$bin" timeout 120 bash "$ROOT/tools/device/cuda_check.sh" --only none ${SHAPE:+--shape $SHAPE} 2>&1 \
      | grep -E "decode graph alone|identical|DIFFER|ERROR|FAIL|segments (Ok|Err)|\[kernel\] segment of|verify round of  [148] rows \(argmax" \
      | grep -v "pdl=false\|tc=true\|tensor_core_gemv=true" | sed 's/ per step on the GPU//; s/ vs [0-9.]* ms per token.*//'
    if [ -n "${TRACE:-}" ]; then
      # The trace kernels' stamps of a 4B GDN layer's segment (un-graphed launches; segment_trace.rs).
      env ${v//,/ } TURBOSPARK_SEG_TRACE=1 CUDA_CHECK_CONFIGS=4 CUDA_CHECK_BIN="$bin" timeout 120 \
        bash "$ROOT/tools/device/cuda_check.sh" --only none ${SHAPE:+--shape $SHAPE} 2>&1 \
        | grep -A8 "segment trace.*18432x2560 swiglu normed, 2560x9216, 10240"
    fi
  done
done
