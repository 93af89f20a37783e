#!/usr/bin/env bash
# gdn_step in two forms (session 19, run 164): in place with __restrict__ as before the chain, and gdn_step_into for
# chained steps, against the single unrestricted form of run 160 (`wip/gdn-step-one-form.patch`). The checks with the
# testbed (whose GDN layers take the fused step: its chains run gdn_step_into), then the 4B bench twice per build: the
# graph alone, chained greedy steps and whether their tokens equal the stepped ones. ~4 minutes with the cold start.
# Build here first:
#   bash tools/device/build_variants.sh main one=gdn-step-one-form
#   bash tools/device/pack.sh trim fixtures
# then on the device (carry [".carry"]), from the repository root:
#   mkdir -p /tmp/b && tar xJf .carry/bins.tar.xz -C /tmp/b && bash tools/device/gdn_step_forms.sh
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
echo "#### checks with the testbed (qwen3_next / realtok fixtures trimmed for the carry: their checks error)"
CUDA_CHECK_BIN=/tmp/b/main timeout 200 bash "$ROOT/tools/device/cuda_check.sh" --no-bench --testbed models/testbed 2>&1 \
  | grep -E "chain|FAIL|RESULT" | grep -v "qwen3_next\|realtok"
echo "#### 4B: one unrestricted form against the two forms, twice"
CUDA_CHECK_CONFIGS=0,1 VARIANTS="X=0" bash "$ROOT/tools/device/segments_ab.sh" /tmp/b/one /tmp/b/main /tmp/b/one /tmp/b/main
