#!/usr/bin/env bash
# Builds, here, what tools/device/next_call.sh runs on the device: HEAD's turbospark (ts) and HEAD with
# wip/topk-two-stage.patch + wip/argmax-two-stage.patch (turbospark ts2, cuda_check cc2, the cuda_loop test binary
# loop2), packed into .carry/bins.tar.xz, and the tree trimmed lean (DFlash weights and CPU-only fixtures aside:
# 57 MiB + ~6.5 MiB of binaries). After the call: bash tools/device/pack.sh restore.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
mkdir -p /tmp/b
cargo build --release -p turbospark 2>&1 | tail -1
cp target/release/turbospark /tmp/b/ts
wt=$(mktemp -d /tmp/next-call-XXXX)
git worktree add -q --detach "$wt" HEAD
git -C "$wt" apply "$ROOT/tools/device/wip/topk-two-stage.patch"
git -C "$wt" add -A && git -C "$wt" -c user.email=b@b -c user.name=b commit -qm topk
git -C "$wt" apply --3way "$ROOT/tools/device/wip/argmax-two-stage.patch"
export CARGO_TARGET_DIR="$ROOT/target-variants"
(cd "$wt" && cargo build --release -p turbospark -p cuda-backend --bin turbospark --bin cuda_check 2>&1 | tail -1)
cp "$CARGO_TARGET_DIR/release/turbospark" /tmp/b/ts2
cp "$CARGO_TARGET_DIR/release/cuda_check" /tmp/b/cc2
loop=$(cd "$wt" && cargo test --release -p runtime --test cuda_loop --no-run 2>&1 | grep -o 'target-variants/release/deps/cuda_loop-[a-z0-9]*' | head -1)
cp "$ROOT/$loop" /tmp/b/loop2
git worktree remove --force "$wt"
bash tools/device/pack.sh bins ts=/tmp/b/ts ts2=/tmp/b/ts2 cc2=/tmp/b/cc2 loop2=/tmp/b/loop2
bash tools/device/pack.sh trim lean
bash tools/device/pack.sh size
