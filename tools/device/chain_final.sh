#!/usr/bin/env bash
# Session 19's closing call (run 162): the full check (every fixture; testbed weights trimmed), the 4B bench's "decode graph
# alone" beside "chained greedy steps" (what still separates chained steps), the runtime's decode-loop gates on the GPU,
# and the table. ~6 minutes with the cold start. Build here first:
#   cargo build --release -p cuda-backend --bin cuda_check
#   cargo test --release -p runtime --test cuda_loop --no-run   # prints target/release/deps/cuda_loop-HASH
#   bash tools/device/pack.sh bins cc=target/release/cuda_check loop=target/release/deps/cuda_loop-HASH
#   bash tools/device/pack.sh trim weights
# then on the device (carry [".carry"]), from the repository root:
#   mkdir -p /tmp/b && tar xJf .carry/bins.tar.xz -C /tmp/b && bash tools/device/chain_final.sh
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${OUT:-/tmp}"
echo "#### full check"
CUDA_CHECK_BIN=/tmp/b/cc timeout 200 bash "$ROOT/tools/device/cuda_check.sh" --no-bench 2>&1 | grep -E "chain|FAIL|ERROR|RESULT|rc="
cp "$OUT/cuda_check.log" "$OUT/full_check.log" 2>/dev/null
echo "#### 4B bench: the graph alone, chained greedy steps, twice"
for i in 1 2; do
  CUDA_CHECK_CONFIGS=0,1 CUDA_CHECK_BIN=/tmp/b/cc timeout 150 bash "$ROOT/tools/device/cuda_check.sh" --only none 2>&1 \
    | grep -E "decode graph alone|chained greedy|host costs|identical|DIFFER" | grep -v "seg=false"
done
echo "#### the runtime's decode-loop gates on the GPU (testbed weights trimmed: its tests are skipped)"
TURBOSPARK_TEST_GPU=1 CUDA_CHECK_BIN=/tmp/b/loop timeout 200 bash "$ROOT/tools/device/cuda_check.sh" --skip testbed --test-threads 1 2>&1 | grep -E "^test |test result|panicked" | head -20
echo "#### table"
CUDA_CHECK_BIN=/tmp/b/cc timeout 220 bash "$ROOT/tools/device/cuda_check.sh" --only none --no-bench --table 2>&1 | grep -E "table:|D2D|^\| "
