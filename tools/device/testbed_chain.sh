#!/usr/bin/env bash
# The embedded testbed on the H200 through `turbospark bench` (session 19, run 163): sequential greedy chained and with
# TURBOSPARK_CHAIN=0, and the MTP head's blocks against the chained sequential. ~3 minutes with the cold start.
# Build here first:
#   cargo build --release -p turbospark && bash tools/device/pack.sh bins ts=target/release/turbospark
#   bash tools/device/pack.sh trim fixtures
# then on the device (carry [".carry"]), from the repository root:
#   mkdir -p /tmp/b && tar xJf .carry/bins.tar.xz -C /tmp/b && bash tools/device/testbed_chain.sh
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
for chain in 1 0 1 0; do
  echo "== sequential, TURBOSPARK_CHAIN=$chain"
  TURBOSPARK_CHAIN=$chain CUDA_CHECK_BIN=/tmp/b/ts timeout 120 bash "$ROOT/tools/device/cuda_check.sh" bench --device cuda \
    --speculative off --gen-tokens 256 --prompt-tokens 64 --runs 5 --threads-list 1 2>&1 | grep -E "^ +1 \|"
done
echo "== MTP blocks against the chained sequential (the default prompt, 128 tokens)"
CUDA_CHECK_BIN=/tmp/b/ts timeout 200 bash "$ROOT/tools/device/cuda_check.sh" bench --device cuda --drafter mtp \
  --gen-tokens 128 --runs 3 --threads-list 1 2>&1 | grep -vE "^== (host|LD_)"
