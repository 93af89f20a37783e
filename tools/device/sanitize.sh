#!/usr/bin/env bash
# Runs the prebuilt cuda_check's kernel self-test (every kernel, small shapes, the bitwise batch-invariance
# checks) under compute-sanitizer: racecheck (shared-memory hazards between threads of a block) and
# memcheck (out-of-bounds / misaligned device accesses). These are the two kinds of bug the kernel
# simulator (cuda_check --simulate) cannot see: it runs blocks one at a time and host memory has no
# bounds. Each tool is time-bounded ($SANITIZE_TIMEOUT s, default 100); output is tee'd to
# $OUT/sanitize.log. Skipped (exit 0) when compute-sanitizer is not installed.
# Run after tools/device/cuda_check.sh (same library path set-up), from the repository root; the binary
# is built by `cargo build --release -p cuda-lab --bin cuda_check`.
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# The binary: $CUDA_CHECK_BIN, else the one tools/device/unpack.sh extracted, else this tree's build.
if [ -n "${CUDA_CHECK_BIN:-}" ]; then BIN=$CUDA_CHECK_BIN
elif [ -x "$ROOT/.carry/bin/cuda_check" ]; then BIN=$ROOT/.carry/bin/cuda_check
else BIN=$ROOT/target/release/cuda_check; fi
LOG="${OUT:-/tmp}/sanitize.log"
exec > >(tee "$LOG") 2>&1
SAN="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)"
[ -n "$SAN" ] && [ -x "$SAN" ] || { echo "== compute-sanitizer not found; skipped"; exit 0; }
DIRS=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/nvidia/lib64 /usr/local/nvidia/lib; do
  [ -d "$d" ] && DIRS="${DIRS:+$DIRS:}$d"
done
export LD_LIBRARY_PATH="$DIRS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TURBOSPARK_CUDA_CACHE="${TURBOSPARK_CUDA_CACHE:-/tmp/turbospark-cuda-cache}"
cd "$ROOT"
rc=0
for tool in racecheck memcheck; do
  echo "== compute-sanitizer --tool $tool: kernel self-test"
  timeout "${SANITIZE_TIMEOUT:-100}" "$SAN" --tool "$tool" --error-exitcode 9 "$BIN" --no-bench --only none
  r=$?
  echo "== $tool rc=$r (0 = clean, 9 = sanitizer errors, 124 = timed out)"
  [ $r -eq 0 ] || rc=1
done
exit $rc
