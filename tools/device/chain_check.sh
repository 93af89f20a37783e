#!/usr/bin/env bash
# Chained greedy steps (crates/cuda/src/chain.rs, session 19) on the H200: the fixtures' chain checks (chains stopped
# after 5 / 1 / 8 tokens == sequential tokens, then the state's next row bitwise) with every other check, the decode
# graph against the build before the chain (gdn_step's state / window now go through separate pointers), the runtime's
# decode-loop gates on the GPU (sequential greedy now chains), and the table (decode tok/s chained and one forward
# call a token, side by side). ~6 minutes with the cold start. Build here first:
#   git diff HEAD HEAD~1 -- crates > tools/device/wip/chain-revert.patch   # (HEAD = the chain commit)
#   bash tools/device/build_variants.sh main old=chain-revert
#   cargo test --release -p runtime --test cuda_loop --no-run   # prints target/release/deps/cuda_loop-HASH
#   bash tools/device/pack.sh bins main=/tmp/b/cc_main old=/tmp/b/cc_old loop=target/release/deps/cuda_loop-HASH
#   bash tools/device/pack.sh trim weights
# then on the device (carry [".carry"]), from the repository root:
#   mkdir -p /tmp/b && tar xJf .carry/bins.tar.xz -C /tmp/b && bash tools/device/chain_check.sh
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${OUT:-/tmp}"
echo "#### full check (main)"
CUDA_CHECK_BIN=/tmp/b/main timeout 200 bash "$ROOT/tools/device/cuda_check.sh" --no-bench 2>&1 | grep -E "chain|FAIL|ERROR|RESULT|rc="
cp "$OUT/cuda_check.log" "$OUT/full_check.log" 2>/dev/null
echo "#### decode graph, the build before the chain against main, twice"
CUDA_CHECK_CONFIGS=0,1 VARIANTS="X=0" bash "$ROOT/tools/device/segments_ab.sh" /tmp/b/old /tmp/b/main /tmp/b/old /tmp/b/main
echo "#### the runtime's decode-loop gates on the GPU (testbed weights trimmed: its tests are skipped)"
TURBOSPARK_TEST_GPU=1 CUDA_CHECK_BIN=/tmp/b/loop timeout 200 bash "$ROOT/tools/device/cuda_check.sh" --skip testbed --test-threads 1 2>&1 | grep -E "^test |test result|panicked" | head -20
echo "#### table (main)"
CUDA_CHECK_BIN=/tmp/b/main timeout 220 bash "$ROOT/tools/device/cuda_check.sh" --only none --no-bench --table 2>&1 | grep -E "table:|D2D|^\| "
