#!/usr/bin/env bash
# Nsight Compute over decode-graph segment kernels (each graph node profiled alone): warp states, the
# scheduler, memory and the per-instruction stall samples, to see what holds the consumers and producers.
# KERNEL (default gemv_segment_c8p4_x10: the 4B's GDN-layer segments), SKIP matching launches (past the
# self-test's), COUNT of them. Writes $OUT/ncu_segment_details.txt and $OUT/ncu_segment_sass.csv.xz.
# Run from the repository root: CUDA_CHECK_BIN=/tmp/b/cc bash tools/device/ncu_segment.sh
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "ncu_segment: no ncu on this machine"; exit 3; }
OUTD=${OUT:-/tmp}
mkdir -p "$OUTD/ncu"
rm -f /tmp/seg.ncu-rep
CUDA_CHECK_CONFIGS=${CUDA_CHECK_CONFIGS:-1} OUT="$OUTD/ncu" \
  CUDA_CHECK_WRAP="$NCU --graph-profiling node --kernel-name ${KERNEL:-gemv_segment_c8p4_x10} --launch-skip ${SKIP:-100} --launch-count ${COUNT:-2} --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section SourceCounters --section LaunchStats --import-source no -o /tmp/seg" \
  bash "$ROOT/tools/device/cuda_check.sh" --only none "$@" > /dev/null 2>&1
[ -s /tmp/seg.ncu-rep ] || { echo "ncu_segment: no report"; tail -20 "$OUTD/ncu/cuda_check.log"; exit 4; }
"$NCU" --import /tmp/seg.ncu-rep --page details > "$OUTD/ncu_segment_details.txt" 2>&1
"$NCU" --import /tmp/seg.ncu-rep --page source --print-source sass --csv 2>&1 | xz > "$OUTD/ncu_segment_sass.csv.xz"
grep -E "gemv_segment|Duration|Warp Cycles Per Issued|Issue Slot|No Eligible|Stall|Memory Throughput|DRAM Throughput" \
  "$OUTD/ncu_segment_details.txt" | head -60
