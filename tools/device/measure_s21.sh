#!/usr/bin/env bash
# Session 21, run 176: the selection kernels timed alone under ncu (run 175's listing caught only argmax), what the
# mixer cores cost now (what-ifs, timing only), 4B sampled against greedy, and the table. ~7 minutes with the cold
# start. Build here:
#   cargo build --release -p turbospark -p cuda-backend --bin turbospark --bin cuda_check
#   bash tools/device/pack.sh bins ts=target/release/turbospark cc=target/release/cuda_check && bash tools/device/pack.sh trim lean
# then on the device (carry [".carry"]): mkdir -p /tmp/b && tar xJf .carry/bins.tar.xz -C /tmp/b && bash tools/device/measure_s21.sh
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
echo "#### 1. topk kernels under ncu (run 174, before the warp-aggregated select: topk_parts 56 + topk_merge 43 us)"
bash tools/device/ncu_sampled_kernels.sh /tmp/b/ts "topk" 8
echo "#### 2. what the mixer cores cost now (run 125, at 2.543 ms: attention 13.5 us a layer, gdn_step 5.0)"
bash tools/device/whatifs.sh /tmp/b/cc "" gdn_step attn_prep,attn_split_1,attn_split_2,attn_split_4,attn_combine attn_prep ""
echo "#### 3. 4B sampled against greedy, twice (run 175: 413.2 / 433.6, 0.95x)"
for r in 1 2; do
  CUDA_CHECK_BIN=/tmp/b/ts timeout 300 bash tools/device/cuda_check.sh bench --device cuda --shape qwen35-4b --sampled \
    --gen-tokens 64 --prompt-tokens 512 --runs 3 --speculative off --threads-list 1 2>&1 | tail -2 | head -1
done
echo "#### 4. table"
CUDA_CHECK_BIN=/tmp/b/cc timeout 240 bash tools/device/cuda_check.sh --only none --no-bench --table 2>&1 | grep -E "table:|D2D|^\| "
