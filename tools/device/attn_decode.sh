#!/usr/bin/env bash
# Session 23: attn_decode (a one-row pass's attn_prep + attn_split in one kernel, attention.cu; the same bits as
# the two launches) on the GPU: (1) the full check (its self-test compares the kernel with the two launches bit
# for bit: out, caches, RoPE table); (2) the decode graph with it (default) against TURBOSPARK_ATT_DECODE=0,
# alternating, on the three shapes (run 182's bound for prep + combine: 4B 4.2 us, 8B 5.9 us an attention layer);
# (3) cuda_loop's gates on the GPU (decode rows now take attn_decode, verify rows the two launches: greedy
# speculative == sequential says they agree). ~4 minutes with the cold start. Run 183: rejected (8B 4.333 against
# 4.294 ms, 9B 4.227 against 4.200), so the kernel lives in tools/device/wip/attn-decode-prep-fold.patch. Build here:
#   git apply tools/device/wip/attn-decode-prep-fold.patch && cargo build --release -p cuda-backend --bin cuda_check
#   loop=$(cargo test --release -p runtime --test cuda_loop --no-run 2>&1 | grep -o 'target/release/deps/cuda_loop-[a-z0-9]*' | head -1)
#   bash tools/device/pack.sh bins cc=target/release/cuda_check loop=$loop && bash tools/device/pack.sh trim lean
# device (carry [".carry"]): mkdir -p /tmp/b && tar xJf .carry/bins.tar.xz -C /tmp/b && bash tools/device/attn_decode.sh
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
AB="$ROOT/tools/device/segments_ab.sh"
chmod +x /tmp/b/*
echo "#### 1. full check"
CUDA_CHECK_BIN=/tmp/b/cc timeout 150 bash "$ROOT/tools/device/cuda_check.sh" 2>&1 | grep -E "FAIL|RESULT|rc=|one row: attn_decode"
cp "${OUT:-/tmp}/cuda_check.log" "${OUT:-/tmp}/full_check.log" 2>/dev/null
V="X=0 TURBOSPARK_ATT_DECODE=0"
echo "#### 2. A/B, 4B twice"
CUDA_CHECK_CONFIGS=1 VARIANTS="$V $V" bash "$AB" /tmp/b/cc | tee "${OUT:-/tmp}/ab_4b.log"
for shape in qwen3-8b qwen35-9b; do
  echo "#### $shape"
  SHAPE=$shape CUDA_CHECK_CONFIGS=1 VARIANTS="$V $V" bash "$AB" /tmp/b/cc
done
echo "#### 3. cuda_loop on the GPU"
TURBOSPARK_TEST_GPU=1 CUDA_CHECK_BIN=/tmp/b/loop timeout 240 bash "$ROOT/tools/device/cuda_check.sh" --test-threads 1 \
  --skip dflash --skip testbed_drafters 2>&1 | grep -E "^test |test result|panicked" | head -30
