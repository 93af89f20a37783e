#!/usr/bin/env bash
# Session 21, run 177: the third form of the candidate selection (chunks of 2048 for top-k 20, the merge's layout
# by a warp scan) on the GPU: its kernels under ncu (run 176: topk_parts 40 + topk_merge 31 us), cuda_loop's seeded
# sampled gates through it (cuda_check has no candidates check: not run), 4B sampled against greedy. ~5 minutes with the cold start. Build:
#   cargo build --release -p turbospark -p cuda-backend --bin turbospark --bin cuda_check
#   loop=$(cargo test --release -p runtime --test cuda_loop --no-run 2>&1 | grep -o 'target/release/deps/cuda_loop-[a-z0-9]*' | head -1)
#   bash tools/device/pack.sh bins ts=target/release/turbospark cc=target/release/cuda_check loop=$loop && bash tools/device/pack.sh trim lean
# then on the device (carry [".carry"]): mkdir -p /tmp/b && tar xJf .carry/bins.tar.xz -C /tmp/b && bash tools/device/topk_v3.sh
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
export TURBOSPARK_MODEL=$ROOT/models/testbed
echo "#### 1. topk kernels under ncu"
bash tools/device/ncu_sampled_kernels.sh /tmp/b/ts "topk" 8
echo "#### 2. cuda_loop on the GPU"
TURBOSPARK_TEST_GPU=1 CUDA_CHECK_BIN=/tmp/b/loop timeout 240 bash tools/device/cuda_check.sh --test-threads 1 \
  --skip dflash --skip testbed_drafters --skip real_tokenizer 2>&1 | grep -E "^test |test result|panicked" | head -30
echo "#### 3. 4B sampled against greedy, twice (run 176: 415.1 / 412.1 against 433.9)"
for r in 1 2; do
  CUDA_CHECK_BIN=/tmp/b/ts timeout 300 bash tools/device/cuda_check.sh bench --device cuda --shape qwen35-4b --sampled \
    --gen-tokens 64 --prompt-tokens 512 --runs 3 --speculative off --threads-list 1 2>&1 | tail -2 | head -1
done
