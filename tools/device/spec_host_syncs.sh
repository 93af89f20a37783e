#!/usr/bin/env bash
# Session 20, run 171: checks and cuda_loop with the un-waited rollback and sampled rows as candidates; sampled
# against greedy decoding (4B shape: fcc2bbb, which copies rows, against this build; testbed); the testbed's MTP and DFlash rounds, this build (ts) against fcc2bbb (ts0), alternating. Build here:
# cargo build --release -p turbospark -p cuda-backend --bin turbospark --bin cuda_check; a worktree build of fcc2bbb's
# turbospark as /tmp/b/ts0; the cuda_loop test binary; pack.sh bins ts=... ts0=... loop=...; pack.sh trim
# fixtures; the DFlash drafter's weights (models/testbed/dflash/model.safetensors) moved aside for the 64 MiB. On the device: mkdir -p /tmp/b && tar xJf .carry/bins.tar.xz -C /tmp/b && bash tools/device/spec_host_syncs.sh
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
export TURBOSPARK_MODEL=$ROOT/models/testbed
echo "#### cuda_loop"
TURBOSPARK_TEST_GPU=1 CUDA_CHECK_BIN=/tmp/b/loop timeout 200 bash tools/device/cuda_check.sh --test-threads 1 2>&1 | grep -E "^test |test result"
B() { CUDA_CHECK_BIN=/tmp/b/$1 timeout 280 bash tools/device/cuda_check.sh bench --device cuda --threads-list 1 "${@:2}" 2>&1 | grep -vE "^== (host|LD_)"; }
for c in 0 1; do
  echo "#### 4B shape: sampled against greedy, TURBOSPARK_CANDIDATES=$c (1: sampled rows come back as candidates)"
  TURBOSPARK_CANDIDATES=$c B ts --shape qwen35-4b --sampled --gen-tokens 64 --prompt-tokens 512 --runs 3 --speculative off | tail -3
done
echo "#### testbed: sampled against greedy"
B ts --sampled --gen-tokens 256 --runs 5 --speculative off | tail -3
for r in 1 2; do
  for bin in ts0 ts; do
    echo "#### $bin MTP"; B $bin --drafter mtp --speculative 2,4,5,auto --gen-tokens 256 --runs 3 | grep -E "sequential|mtp"
  done
done
