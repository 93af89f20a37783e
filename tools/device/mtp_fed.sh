#!/usr/bin/env bash
# Prepared in session 19 (not yet run): the MTP head's plain-argmax drafts fed on the device
# (`wip/mtp-draft-fed.patch`): the first draft's argmax and each draft step's become the next step's token and
# position (argmax_rows' counter mode writes each pair to mapped host memory), all k steps queued before one wait,
# instead of a host round trip per draft (run 163's testbed rounds: 0.26 ms drafting for 4 drafts). Tested here:
# the emulated cuda_loop gates (a wrong fed draft fails gpu_mtp_drafts_what_the_host_head_drafts_on_the_testbed)
# and the simulator's cuda_check MTP checks ("proposals fed on the device ... equal ok"). ~4 minutes with the cold
# start. Build here first:
#   bash tools/device/build_variants.sh fed=mtp-draft-fed && bash tools/device/pack.sh trim fixtures
# then on the device (carry [".carry"]), from the repository root:
#   mkdir -p /tmp/b && tar xJf .carry/bins.tar.xz -C /tmp/b && bash tools/device/mtp_fed.sh
# Read: "one draft step (logits to the host): graph X ms" against "one draft step fed on the device: Y ms", per
# checkpoint, and every "equal ok". If it pays, apply the patch, then `turbospark bench --drafter mtp` on the testbed
# (tools/device/testbed_chain.sh's last command) against run 163's blocks.
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CUDA_CHECK_BIN=/tmp/b/fed timeout 300 bash "$ROOT/tools/device/cuda_check.sh" --no-bench --testbed models/testbed 2>&1 \
  | grep -E "mtp\]|RESULT" | grep -v "qwen3_next"
