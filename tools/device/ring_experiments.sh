#!/usr/bin/env bash
# The segment ring's experiments prepared in session 16 (tools/device/README.md, "Where to look next (end of
# session 16)"), in one device call of ~6 minutes. Build here first:
#   bash tools/device/build_variants.sh main o=seg-producer-ooo r=seg-ring-64-pages
#   bash tools/device/pack.sh trim weights
# then on the device (carry [".carry"]), from the repository root:
#   mkdir -p /tmp/b && tar xJf .carry/bins.tar.xz -C /tmp/b && bash tools/device/ring_experiments.sh
# Prints: the coupling of main's ring (trace), out-of-order producers on / off, the 184 KB ring, the
# pure stream's floor (no arithmetic, barrier, staging or mixer cores; timing only), and the table with the
# read-only stream rate (6d1b4f9) beside the copy rate. ~8 minutes with the cold start.
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
AB="$ROOT/tools/device/segments_ab.sh"
echo "#### 4B: main's trace (the producers' waits coupled to a consumer's)"
TRACE=1 CUDA_CHECK_CONFIGS=0,1 VARIANTS="X=0" bash "$AB" /tmp/b/main
echo "#### 4B: out-of-order producers (patched binary, off / on), main"
CUDA_CHECK_CONFIGS=0,1 VARIANTS="X=0 TURBOSPARK_SEG_OOO=1 X=0 TURBOSPARK_SEG_OOO=1" bash "$AB" /tmp/b/o
CUDA_CHECK_CONFIGS=0,1 VARIANTS="X=0" bash "$AB" /tmp/b/main
TRACE=1 CUDA_CHECK_CONFIGS=0,1 VARIANTS="TURBOSPARK_SEG_OOO=1" bash "$AB" /tmp/b/o
echo "#### 4B: the 184 KB ring (patched binary, 160 / 184 KB)"
CUDA_CHECK_CONFIGS=0,1 VARIANTS="X=0 TURBOSPARK_SEG_RING_KB=184 X=0 TURBOSPARK_SEG_RING_KB=184" bash "$AB" /tmp/b/r
echo "#### 9B / 8B: out-of-order producers"
for shape in qwen35-9b qwen3-8b; do
  SHAPE=$shape CUDA_CHECK_CONFIGS=0,1 VARIANTS="X=0 TURBOSPARK_SEG_OOO=1" bash "$AB" /tmp/b/o
done
echo "#### 4B: the pure stream's floor (timing only)"
TURBOSPARK_SEG_DEBUG=14 bash "$ROOT/tools/device/whatifs.sh" /tmp/b/main "" gdn_step,attn_prep,attn_split_4,attn_combine
echo "#### the table (with the read-only stream rate beside the copy rate)"
CUDA_CHECK_BIN=/tmp/b/main timeout 200 bash "$ROOT/tools/device/cuda_check.sh" --table 2>&1 | grep -E "D2D|read-only|^\| "
