#!/usr/bin/env bash
# On the GPU machine: extracts the binaries tools/device/pack.sh packed into .carry/bin/ (where
# cuda_check.sh and sanitize.sh look first) and lists them.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
[ -f .carry/bins.tar.xz ] || { echo "no .carry/bins.tar.xz: run tools/device/pack.sh here and carry .carry" >&2; exit 2; }
mkdir -p .carry/bin
tar xJf .carry/bins.tar.xz -C .carry/bin
ls -l .carry/bin
