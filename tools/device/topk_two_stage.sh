#!/usr/bin/env bash
# Prepared in session 20 (not yet run; its device time was spent): the two-kernel candidate selection
# (`wip/topk-two-stage.patch`: per chunk of 8192 logits in shared memory, then a merge of the chunks' sets) against
# main's one-block kernel, which ncu timed at 294 us a 151936-logit row (run 173: 0.28 ms of a 2.59 ms sampled
# 4B step). Simulator-tested (the kernels against a sort at 151936 / 20011 / 1001 logits, mutation-checked; the
# simulated forward's candidates shape the row's distribution; emulated cuda_loop seeded gates). ~5 minutes with
# the cold start. Build here first (a worktree of HEAD + the patch):
#   wt=$(mktemp -d) && git worktree add -q --detach $wt HEAD && git -C $wt apply $PWD/tools/device/wip/topk-two-stage.patch
#   (cd $wt && CARGO_TARGET_DIR=$PWD/../tt cargo build --release -p turbospark && \
#    CARGO_TARGET_DIR=$PWD/../tt cargo test --release -p runtime --test cuda_loop --no-run)
#   copy its turbospark to /tmp/b/ts2 and its cuda_loop test binary to /tmp/b/loop2; main's turbospark to /tmp/b/ts
#   bash tools/device/pack.sh bins ts=/tmp/b/ts ts2=/tmp/b/ts2 loop2=/tmp/b/loop2 && bash tools/device/pack.sh trim fixtures
# then on the device (carry [".carry"]): mkdir -p /tmp/b && tar xJf .carry/bins.tar.xz -C /tmp/b && bash tools/device/topk_two_stage.sh
# Read: the seeded sampled gates pass (the candidates path against the CPU engine's tokens), topk_parts + topk_merge
# microseconds against topk_candidates', and sampled / greedy for ts2 against ts. If they pass and pay: apply the patch.
# The same call can take `wip/argmax-two-stage.patch` (argmax_rows split the same way: 24-27 us of each greedy 4B
# step in run 173; applies on HEAD alone, or with --3way after the topk patch): build its cuda_check as
# `bash tools/device/build_variants.sh main arg=argmax-two-stage` and add, with ARGMAX=1:
#   full checks (chains, fed drafts: `CUDA_CHECK_BIN=/tmp/b/cc_arg bash tools/device/cuda_check.sh --no-bench --only qwen3_5
#   --testbed models/testbed`) and the decode graph A/B (`VARIANTS="X=0" bash tools/device/segments_ab.sh /tmp/b/cc_main
#   /tmp/b/cc_arg /tmp/b/cc_main /tmp/b/cc_arg`, which needs `pack.sh trim weights`: a separate call from the testbed runs).
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
export TURBOSPARK_MODEL=$ROOT/models/testbed
echo "#### cuda_loop with the patch (GPU)"
TURBOSPARK_TEST_GPU=1 CUDA_CHECK_BIN=/tmp/b/loop2 timeout 200 bash tools/device/cuda_check.sh --test-threads 1 2>&1 | grep -E "^test |test result"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
for bin in ts ts2; do
  echo "#### $bin: selection kernels under ncu (isolated, clocks locked)"
  CUDA_CHECK_BIN=/tmp/b/$bin CUDA_CHECK_WRAP="$NCU -k regex:topk --launch-count 12 --metrics gpu__time_duration.sum --csv --page raw --log-file /tmp/topk_$bin.csv" \
    timeout 300 bash tools/device/cuda_check.sh bench --device cuda --shape qwen35-4b --sampled --gen-tokens 6 --prompt-tokens 64 \
    --runs 1 --speculative off --threads-list 1 > /dev/null 2>&1
  grep -o '"topk[a-z_]*".*' /tmp/topk_$bin.csv | awk -F'","' '{print $1, $NF}' | head -12
done
for bin in ts ts2 ts ts2; do
  echo "#### $bin: 4B sampled against greedy"
  CUDA_CHECK_BIN=/tmp/b/$bin timeout 300 bash tools/device/cuda_check.sh bench --device cuda --shape qwen35-4b --sampled \
    --gen-tokens 64 --prompt-tokens 512 --runs 3 --speculative off --threads-list 1 2>&1 | tail -2 | head -1
done
