#!/usr/bin/env bash
# Builds one cuda_check per variant of HEAD, here on the CPU machine, for a same-call A/B on the device.
# A variant is NAME=PATCH+PATCH... (patches tools/device/wip/PATCH.patch, applied in order to a detached
# worktree of HEAD), or NAME alone for HEAD as it is. Binaries land in /tmp/b/cc_NAME and are packed
# into .carry/bins.tar.xz (pack.sh bins); then `pack.sh trim weights` and, on the device,
#   mkdir -p /tmp/b && tar xJf .carry/bins.tar.xz -C /tmp/b
#   VARIANTS="X=0" bash tools/device/segments_ab.sh /tmp/b/main /tmp/b/cp ...
# Example: bash tools/device/build_variants.sh main cp=seg-cp-async c12=seg-cp-async+seg-c12-held
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
# One target directory for every worktree: each variant rebuilds only what its patches touch.
export CARGO_TARGET_DIR="$ROOT/target-variants"
mkdir -p /tmp/b
specs=()
for spec in "$@"; do
  name=${spec%%=*}
  wt=$(mktemp -d /tmp/variant-XXXX)
  git worktree add -q --detach "$wt" HEAD
  if [ "$spec" != "$name" ]; then
    IFS=+ read -ra patches <<< "${spec#*=}"
    for p in "${patches[@]}"; do git -C "$wt" apply "$ROOT/tools/device/wip/$p.patch"; done
  fi
  (cd "$wt" && cargo build --release -p cuda-backend --bin cuda_check 2>&1 | tail -1)
  cp "$CARGO_TARGET_DIR/release/cuda_check" "/tmp/b/cc_$name"
  git worktree remove --force "$wt"
  specs+=("$name=/tmp/b/cc_$name")
  echo "built $name: /tmp/b/cc_$name"
done
bash "$ROOT/tools/device/pack.sh" bins "${specs[@]}"
