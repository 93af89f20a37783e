#!/usr/bin/env bash
# Chained greedy steps with the token pair written to mapped host memory by the argmax kernel (no copy between
# steps; session 19, run 161): the chain checks on the fixtures and the testbed, `turbospark bench` on the testbed
# (sequential greedy through the runtime, chained and TURBOSPARK_CHAIN=0, twice), and the table (chained and one
# forward call a token side by side). ~5 minutes with the cold start. Build here first:
#   cargo build --release -p cuda-backend --bin cuda_check && cargo build --release -p turbospark
#   bash tools/device/pack.sh bins cc=target/release/cuda_check ts=target/release/turbospark
#   bash tools/device/pack.sh trim fixtures
# then on the device (carry [".carry"]), from the repository root:
#   mkdir -p /tmp/b && tar xJf .carry/bins.tar.xz -C /tmp/b && bash tools/device/chain_table.sh
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${OUT:-/tmp}"
echo "#### checks (qwen3_next / realtok fixtures trimmed for the carry: their checks error)"
CUDA_CHECK_BIN=/tmp/b/cc timeout 200 bash "$ROOT/tools/device/cuda_check.sh" --no-bench --testbed models/testbed 2>&1 | grep -E "chain|FAIL|RESULT|rc="
cp "$OUT/cuda_check.log" "$OUT/full_check.log" 2>/dev/null
echo "#### turbospark bench on the testbed, sequential greedy: chained, then TURBOSPARK_CHAIN=0, twice"
for i in 1 2; do
  for chain in 1 0; do
    echo "== TURBOSPARK_CHAIN=$chain"
    TURBOSPARK_CHAIN=$chain CUDA_CHECK_BIN=/tmp/b/ts timeout 120 bash "$ROOT/tools/device/cuda_check.sh" bench --device cuda \
      --speculative off --gen-tokens 256 --prompt-tokens 64 --runs 5 --threads-list 1 2>&1 | grep -vE "^== (host|LD_)"
  done
done
echo "#### table"
CUDA_CHECK_BIN=/tmp/b/cc timeout 220 bash "$ROOT/tools/device/cuda_check.sh" --only none --no-bench --table 2>&1 | grep -E "table:|D2D|^\| "
