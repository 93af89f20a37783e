#!/usr/bin/env bash
# Prepared for session 20 (not yet run): where a speculative round's time goes on the launch-bound testbed now that
# sequential steps chain (run 163: MTP block 4 1.05x, rounds of 0.26 ms drafting + 0.36 verify + 0.05 rollback for ~4
# tokens against 0.175 ms a chained step). Verify blocks from CUDA graphs (`TURBOSPARK_VERIFY_GRAPHS=1`, off since
# session 2's testbed showed no gain) against direct launches, MTP blocks 1-6 and auto, twice. ~3 minutes with the
# cold start. Build here first:
#   cargo build --release -p turbospark && bash tools/device/pack.sh bins ts=target/release/turbospark
#   bash tools/device/pack.sh trim fixtures
# then on the device (carry [".carry"]), from the repository root:
#   mkdir -p /tmp/b && tar xJf .carry/bins.tar.xz -C /tmp/b && bash tools/device/testbed_spec.sh
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
for i in 1 2; do
  for vg in 0 1; do
    echo "== TURBOSPARK_VERIFY_GRAPHS=$vg"
    TURBOSPARK_VERIFY_GRAPHS=$vg CUDA_CHECK_BIN=/tmp/b/ts timeout 150 bash "$ROOT/tools/device/cuda_check.sh" bench \
      --device cuda --drafter mtp --speculative 1,2,3,4,6,auto --gen-tokens 128 --runs 3 --threads-list 1 2>&1 \
      | grep -E "sequential|mtp \(cuda\)"
  done
done
