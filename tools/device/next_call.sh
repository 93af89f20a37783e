#!/usr/bin/env bash
# Prepared at the end of session 20 for the next session's first device call (~7 minutes with the cold start):
# everything session 20 could not run. Build here: bash tools/device/next_call_build.sh; then on the device
# (carry [".carry"]): mkdir -p /tmp/b && tar xJf .carry/bins.tar.xz -C /tmp/b && bash tools/device/next_call.sh
# 1. cuda_check with both wip patches on every fixture (qwen3, qwen3_5, qwen3_next, the real tokenizer) and the
#    testbed: session 20's checks ran qwen3_5 and the testbed only (the tapped decode graph, graph rollbacks).
# 2. cuda_loop with both patches on the GPU (the seeded sampled gates through the two-stage candidates; chains and
#    greedy gates through the two-stage argmax); the DFlash gates skipped (weights trimmed).
# 3. The selection kernels' microseconds under ncu (one-block topk_candidates 294 us, argmax_rows 25 us: run 173).
# 4. 4B sampled / greedy, HEAD against the patches, alternating.
# 5. The testbed's MTP `auto` with the tuner's bound (twice the largest timed block), against run 171's.
# Read the "identical"/"ok"/"FAIL" lines first; apply a patch only if its checks pass and it pays.
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
export TURBOSPARK_MODEL=$ROOT/models/testbed
echo "#### 1. cuda_check (patches), every fixture and the testbed"
CUDA_CHECK_BIN=/tmp/b/cc2 timeout 300 bash tools/device/cuda_check.sh --no-bench --testbed models/testbed 2>&1 \
  | grep -E "FAIL|ERROR|identical|RESULT|rc=|decode graph|chained|tap|rollback" | head -60
cp "${OUT:-/tmp}/cuda_check.log" "${OUT:-/tmp}/next_call_check.log" 2>/dev/null
echo "#### 2. cuda_loop (patches)"
TURBOSPARK_TEST_GPU=1 CUDA_CHECK_BIN=/tmp/b/loop2 timeout 240 bash tools/device/cuda_check.sh --test-threads 1 \
  --skip dflash --skip testbed_drafters 2>&1 | grep -E "^test |test result"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
for bin in ts ts2; do
  echo "#### 3. $bin: selection kernels under ncu"
  CUDA_CHECK_BIN=/tmp/b/$bin CUDA_CHECK_WRAP="$NCU -k regex:topk|argmax --launch-count 16 --metrics gpu__time_duration.sum --csv --page raw --log-file /tmp/sel_$bin.csv" \
    timeout 300 bash tools/device/cuda_check.sh bench --device cuda --shape qwen35-4b --sampled --gen-tokens 6 --prompt-tokens 64 \
    --runs 1 --speculative off --threads-list 1 > /dev/null 2>&1
  python3 - "$bin" <<'PY'
import csv, sys
rows = list(csv.reader(open(f"/tmp/sel_{sys.argv[1]}.csv")))
hdr = next((r for r in rows if "Kernel Name" in r), None)
for r in rows:
    if hdr and len(r) == len(hdr) and r is not hdr:
        d = dict(zip(hdr, r))
        print(d.get("Kernel Name"), d.get("gpu__time_duration.sum"), "ns")
PY
done
for bin in ts ts2; do
  echo "#### 4. $bin: 4B sampled against greedy (greedy: the argmax patch end to end)"
  CUDA_CHECK_BIN=/tmp/b/$bin timeout 300 bash tools/device/cuda_check.sh bench --device cuda --shape qwen35-4b --sampled \
    --gen-tokens 64 --prompt-tokens 512 --runs 3 --speculative off --threads-list 1 2>&1 | tail -2 | head -1
done
echo "#### 5. testbed MTP (HEAD: the tuner's bound)"
CUDA_CHECK_BIN=/tmp/b/ts timeout 200 bash tools/device/cuda_check.sh bench --device cuda --drafter mtp \
  --speculative 2,4,5,auto --gen-tokens 256 --runs 3 --threads-list 1 2>&1 | grep -E "sequential|mtp"
