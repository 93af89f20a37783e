#!/usr/bin/env bash
# Session 23's second device call: logprobs on the GPU. (1) cuda_loop's gates on the H200 (the new
# logprobs_on_cuda_match_speculation_and_the_cpu_engine among them); (2) logprobs_check.py (the server on CUDA:
# speculating == sequential bit for bit, == the CPU server to bf16 rounding; the 4B's decode with and without
# logprobs). ~5 minutes with the cold start. Build here:
#   cargo build --release -p turbospark
#   loop=$(cargo test --release -p runtime --test cuda_loop --no-run 2>&1 | grep -o 'target/release/deps/cuda_loop-[a-z0-9]*' | head -1)
#   bash tools/device/pack.sh bins ts=target/release/turbospark loop=$loop && bash tools/device/pack.sh trim lean
#   mv .carry-stash/fixtures/tokenizers fixtures/   (qwen3_realtok's tokenizer links into it)
# device (carry [".carry"]): mkdir -p /tmp/b && tar xJf .carry/bins.tar.xz -C /tmp/b && bash tools/device/s23.sh
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
chmod +x /tmp/b/*
echo "#### 1. cuda_loop on the GPU"
TURBOSPARK_TEST_GPU=1 CUDA_CHECK_BIN=/tmp/b/loop timeout 240 bash tools/device/cuda_check.sh --test-threads 1 \
  --skip dflash --skip testbed_drafters 2>&1 | grep -E "^test |test result|panicked|assert" | head -40
echo "#### 2. logprobs through the server"
python3 tools/device/logprobs_check.py /tmp/b 2>&1 | tee "${OUT:-/tmp}/logprobs_check.log" | grep -v "^serve:" 
