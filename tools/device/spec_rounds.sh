#!/usr/bin/env bash
# Session 20: testbed_spec.sh and mtp_fed.sh in one call. The fed drafts' checks on qwen3_5 and the testbed
# (cuda_check with wip/mtp-draft-fed.patch), then `turbospark bench --drafter mtp` on the testbed for main and the
# patch, each with verify blocks from CUDA graphs off and on. Build here first:
#   (a worktree of HEAD + wip/mtp-draft-fed.patch: cargo build --release -p turbospark -p cuda-backend, binaries
#    copied to /tmp/b/tsfed and /tmp/b/ccfed), cargo build --release -p turbospark; cp target/release/turbospark /tmp/b/ts
#   bash tools/device/pack.sh bins ts=/tmp/b/ts tsfed=/tmp/b/tsfed fed=/tmp/b/ccfed && bash tools/device/pack.sh trim fixtures
# then on the device (carry [".carry"]): mkdir -p /tmp/b && tar xJf .carry/bins.tar.xz -C /tmp/b && bash tools/device/spec_rounds.sh
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
echo "#### fed drafts: checks (qwen3_5 fixture, testbed)"
CUDA_CHECK_BIN=/tmp/b/fed timeout 240 bash "$ROOT/tools/device/cuda_check.sh" --no-bench --only qwen3_5 \
  --testbed models/testbed 2>&1 | grep -E "mtp\]|RESULT|draft step|rc="
cp "${OUT:-/tmp}/cuda_check.log" "${OUT:-/tmp}/fed_check.log" 2>/dev/null
for bin in ts tsfed; do
  for vg in 0 1; do
    echo "#### $bin TURBOSPARK_VERIFY_GRAPHS=$vg"
    TURBOSPARK_VERIFY_GRAPHS=$vg CUDA_CHECK_BIN=/tmp/b/$bin timeout 150 bash "$ROOT/tools/device/cuda_check.sh" bench \
      --device cuda --drafter mtp --speculative 1,2,3,4,6,auto --gen-tokens 128 --runs 3 --threads-list 1 2>&1 \
      | grep -vE "^== (host|LD_)"
  done
done
