#!/usr/bin/env bash
# Prepares a device run here, on the CPU machine: the device copies the working tree (tracked files and
# untracked ones git does not ignore) plus what `carry` names, 64 MiB in all, so binaries travel stripped
# and compressed in the ignored .carry/, and the largest tracked files step aside into the ignored
# .carry-stash/ for the run. Run from the repository root:
#   bash tools/device/pack.sh bins cc=target/release/cuda_check [loop=target/release/deps/cuda_loop-HASH ...]
#   bash tools/device/pack.sh trim weights    # testbed weights out: cuda_check, --table, segments_ab.sh runs
#   bash tools/device/pack.sh trim fixtures   # the largest fixtures out: testbed runs (cuda_loop, bench)
#   bash tools/device/pack.sh trim lean       # the DFlash weights and CPU-only fixtures out: every fixture check and
#                                             # the testbed's MTP runs in one call, with ~7 MB of binaries
#   bash tools/device/pack.sh restore         # everything back: before local tests and every commit
#   bash tools/device/pack.sh size            # what the device would receive besides the carry
# On the device (run(carry=[".carry"], ...)): mkdir -p /tmp/b && tar xJf .carry/bins.tar.xz -C /tmp/b, then
# CUDA_CHECK_BIN=/tmp/b/NAME bash tools/device/cuda_check.sh ...
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
STASH=.carry-stash
WEIGHTS=(models/testbed/model-00001-of-00003.safetensors models/testbed/model-00002-of-00003.safetensors
         models/testbed/model-00003-of-00003.safetensors models/testbed/dflash/model.safetensors)
FIXTURES=(fixtures/qwen3_5_vl fixtures/qwen3_next fixtures/tokenizers fixtures/qwen3_realtok)
# What neither cuda_check's fixture checks nor the MTP runs on the testbed read: room for more binaries.
LEAN=(models/testbed/dflash/model.safetensors fixtures/tokenizers fixtures/qwen3_5_vl)

trim() {
  local p
  for p in "$@"; do
    [ -e "$p" ] || continue
    mkdir -p "$STASH/$(dirname "$p")"
    mv "$p" "$STASH/$p"
    echo "stashed $p"
  done
}

case "${1:-}" in
  bins)
    shift
    [ $# -gt 0 ] || { echo "usage: pack.sh bins NAME=PATH ..." >&2; exit 2; }
    tmp=$(mktemp -d)
    for spec in "$@"; do
      name=${spec%%=*} path=${spec#*=}
      [ -x "$path" ] || { echo "not an executable: $path" >&2; exit 2; }
      cp "$path" "$tmp/$name" && strip "$tmp/$name"
    done
    mkdir -p .carry
    tar cJf .carry/bins.tar.xz -C "$tmp" .
    rm -rf "$tmp"
    ls -l .carry/bins.tar.xz
    ;;
  trim)
    case "${2:-}" in
      weights) trim "${WEIGHTS[@]}" ;;
      fixtures) trim "${FIXTURES[@]}" ;;
      lean) trim "${LEAN[@]}" ;;
      *) echo "usage: pack.sh trim weights|fixtures|lean" >&2; exit 2 ;;
    esac
    ;;
  restore)
    for p in "${WEIGHTS[@]}" "${FIXTURES[@]}" "${LEAN[@]}"; do
      if [ -e "$STASH/$p" ] && [ ! -e "$p" ]; then
        mkdir -p "$(dirname "$p")"
        mv "$STASH/$p" "$p"
        echo "restored $p"
      fi
    done
    [ -d "$STASH" ] && find "$STASH" -depth -type d -empty -delete
    git status --short -- models fixtures
    ;;
  size)
    du -sh --exclude=.git --exclude=target --exclude=.carry --exclude="$STASH" --exclude=target-gdn --exclude=target-variants .
    ;;
  *)
    sed -n '2,13p' "${BASH_SOURCE[0]}"
    exit 2
    ;;
esac
