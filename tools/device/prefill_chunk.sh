#!/usr/bin/env bash
# Session 22: the runtime prefills in the backend's chunk (CUDA: one pass, max_pass_rows 512) instead of 256.
# (1) the decode-loop gates on the GPU (cuda_loop: greedy speculative == sequential, stops, seeded sampling,
# GPU == CPU with the real tokenizer, prefix reuse) with the new chunk; (2) the 4B through the server
# (serve_4b.py: 512-token prefill was 23.9k tok/s in 256-row chunks, run 180). Build here:
#   cargo build --release -p turbospark && cargo test --release -p runtime --test cuda_loop --no-run
#   bash tools/device/pack.sh bins ts=target/release/turbospark loop=target/release/deps/cuda_loop-HASH
#   bash tools/device/pack.sh trim lean && mv .carry-stash/fixtures/tokenizers fixtures/   (the Qwen3 tokenizer)
# device (carry [".carry"]): mkdir -p /tmp/b && tar xJf .carry/bins.tar.xz -C /tmp/b && bash tools/device/prefill_chunk.sh
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
chmod +x /tmp/b/*
TURBOSPARK_TEST_GPU=1 CUDA_CHECK_BIN=/tmp/b/loop timeout 240 bash "$ROOT/tools/device/cuda_check.sh" --test-threads 1 2>&1 \
  | grep -E "^test |test result|panicked" | head -30
python3 "$ROOT/tools/device/serve_4b.py" /tmp/b
