#!/usr/bin/env bash
# Packs what a GPU run needs, here on the CPU machine, and checks it fits what a device run carries
# (64 MiB: the working tree's tracked and untracked-unignored files, plus the ignored paths it is asked
# to carry). The release binaries are built here (CUDA is loaded at run time), stripped and compressed
# into the ignored .carry/bins.tar.xz; nothing of the tree is moved.
#
#   bash tools/device/pack.sh                 # turbospark + cuda_check
#   bash tools/device/pack.sh --tests         # also the runtime's GPU test executables (cuda_loop,
#                                             # sampled_distribution)
#   bash tools/device/pack.sh --baseline REV  # also cuda_check built at git revision REV, as
#                                             # cuda_check_base (for tools/device/ab.sh)
#   then: run(command="bash tools/device/unpack.sh && ...", carry=[".carry"])
#
# On the device, tools/device/unpack.sh extracts them into .carry/bin/, where cuda_check.sh and
# sanitize.sh look first.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
LIMIT=$((64 * 1024 * 1024))

tests=0
baseline=""
while [ $# -gt 0 ]; do
  case "$1" in
    --tests) tests=1 ;;
    --baseline) baseline=${2:?--baseline REV}; shift ;;
    *) sed -n '2,15p' "${BASH_SOURCE[0]}"; exit 2 ;;
  esac
  shift
done

cargo build --release -p turbospark-cli --bin turbospark
cargo build --release -p cuda-lab --bin cuda_check
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp target/release/turbospark target/release/cuda_check "$tmp/"
if [ "$tests" = 1 ]; then
  # Test executables have hashed names: ask cargo for them.
  for t in "runtime cuda_loop" "runtime sampled_distribution"; do
    set -- $t
    exe=$(cargo test --release -p "$1" --test "$2" --no-run --message-format=json 2>/dev/null \
      | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)
    [ -x "$exe" ] || { echo "no test executable for $1/$2" >&2; exit 1; }
    cp "$exe" "$tmp/$2"
  done
fi
if [ -n "$baseline" ]; then
  # Its own worktree and target dir under target/ (ignored), kept for the next baseline build.
  wt=target/baseline-src
  rm -rf "$wt"; git worktree prune
  git worktree add -q --detach "$wt" "$baseline"
  # The CUDA harness lived in cuda-backend before crates/cuda-lab existed.
  pkg=cuda-lab; [ -d "$wt/crates/cuda-lab" ] || pkg=cuda-backend
  (cd "$wt" && CARGO_TARGET_DIR=../baseline-target cargo build --release -p "$pkg" --bin cuda_check)
  cp target/baseline-target/release/cuda_check "$tmp/cuda_check_base"
  git worktree remove --force "$wt"
fi
strip "$tmp"/*
mkdir -p .carry
# xz -9e: similar binaries share a large dictionary (4 binaries 8.1 -> 4.7 MB, 2026-12-05).
tar cf - -C "$tmp" . | xz -9e -T2 > .carry/bins.tar.xz

# Counted in disk blocks, as the device's limit counts them (apparent sizes undercount by ~0.8 MiB: a
# 63.7 MiB total by apparent size was refused on 2026-12-06).
tree=$( { git ls-files -z; git ls-files -z --others --exclude-standard; } | xargs -0 -r du -c -B1 2>/dev/null \
  | awk '$2 == "total" {s += $1} END {print s + 0}')
carry=$(du -s -B1 .carry | cut -f1)
total=$((tree + carry))
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
echo "tree $(mib "$tree") + .carry $(mib "$carry") = $(mib "$total") of $(mib "$LIMIT")"
[ "$total" -le "$LIMIT" ] || { echo "over what a device run carries" >&2; exit 1; }
