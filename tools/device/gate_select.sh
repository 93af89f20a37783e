#!/usr/bin/env bash
# Session 21, run 175: gdn_step forming the gated norm's gates (SEG_GATE_READY) and the faster topk_select, on the
# GPU. ~5 minutes with the cold start. Build here:
#   cargo build --release -p turbospark -p cuda-backend --bin turbospark --bin cuda_check
#   loop=$(cargo test --release -p runtime --test cuda_loop --no-run 2>&1 | grep -o 'target/release/deps/cuda_loop-[a-z0-9]*' | head -1)
#   bash tools/device/pack.sh bins ts=target/release/turbospark cc=target/release/cuda_check loop=$loop
#   bash tools/device/pack.sh trim lean
# then on the device (carry [".carry"]): mkdir -p /tmp/b && tar xJf .carry/bins.tar.xz -C /tmp/b && bash tools/device/gate_select.sh
# (cuda_loop finds its fixtures through the path it was built at: build it in the main checkout, not a worktree.)
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
export TURBOSPARK_MODEL=$ROOT/models/testbed
echo "#### 1. cuda_check, every fixture and the testbed"
CUDA_CHECK_BIN=/tmp/b/cc timeout 300 bash tools/device/cuda_check.sh --no-bench --testbed models/testbed 2>&1 \
  | grep -E "FAIL|ERROR|RESULT|rc=|staged gated" | head -40
cp "${OUT:-/tmp}/cuda_check.log" "${OUT:-/tmp}/gate_select_check.log" 2>/dev/null
echo "#### 2. cuda_loop on the GPU"
TURBOSPARK_TEST_GPU=1 CUDA_CHECK_BIN=/tmp/b/loop timeout 240 bash tools/device/cuda_check.sh --test-threads 1 \
  --skip dflash --skip testbed_drafters 2>&1 | grep -E "^test |test result|panicked" | head -30
echo "#### 3. 4B decode graph: gates formed by gdn_step (X=0) against the staging's (TURBOSPARK_GDN_GATE=0)"
CUDA_CHECK_CONFIGS=0,1 VARIANTS="X=0 TURBOSPARK_GDN_GATE=0 X=0 TURBOSPARK_GDN_GATE=0" \
  bash tools/device/segments_ab.sh /tmp/b/cc
echo "#### 4. selection kernels under ncu (run 174: topk_parts 56 + topk_merge 43 us)"
bash tools/device/ncu_sampled_kernels.sh /tmp/b/ts "topk|argmax" 12
echo "#### 5. 4B sampled against greedy (run 174: 405.0 / 433.5 tok/s, 0.93x)"
for g in 1 0; do
  echo "TURBOSPARK_GDN_GATE=$g"
  TURBOSPARK_GDN_GATE=$g CUDA_CHECK_BIN=/tmp/b/ts timeout 300 bash tools/device/cuda_check.sh bench --device cuda --shape qwen35-4b \
    --sampled --gen-tokens 64 --prompt-tokens 512 --runs 3 --speculative off --threads-list 1 2>&1 | tail -2 | head -1
done
