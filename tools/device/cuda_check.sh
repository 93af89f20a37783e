#!/usr/bin/env bash
# Runs the prebuilt cuda_check (crates/cuda-lab) on the GPU machine: fixtures on CUDA vs transformers and the
# CPU engine, then batch-1 decode tok/s on a synthetic qwen35-4b. Output is tee'd to $OUT/cuda_check.log.
#
# The binary dlopen()s libcuda.so.1 / libnvrtc.so.13 / libcublas.so.13 at run time; like
# shared/examples/gpuprobe/run_on_device.sh we build LD_LIBRARY_PATH from the toolkit directories
# (/usr/local/cuda*/lib64, targets/x86_64-linux/lib) or, failing those, the torch venv's nvidia wheels,
# then the driver directories. Never a .../stubs directory: cudarc tries libcuda.so before libcuda.so.1
# and the toolkit's stub would win (cuInit -> CUDA_ERROR_STUB_LIBRARY).
# Run from the repository root (fixtures/ is read relative to it). Extra arguments go to cuda_check.
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# The binary: $CUDA_CHECK_BIN, else the one tools/device/unpack.sh extracted, else this tree's build.
if [ -n "${CUDA_CHECK_BIN:-}" ]; then BIN=$CUDA_CHECK_BIN
elif [ -x "$ROOT/.carry/bin/cuda_check" ]; then BIN=$ROOT/.carry/bin/cuda_check
else BIN=$ROOT/target/release/cuda_check; fi
[ -x "$BIN" ] || { echo "cuda_check binary not found at $BIN (build: cargo build --release -p cuda-lab --bin cuda_check)"; exit 3; }
LOG="${OUT:-/tmp}/cuda_check.log"
exec > >(tee "$LOG") 2>&1
export NCCL_NVLS_ENABLE=0

has_cuda_libs() { local f; for f in "$1"/libcuda.so* "$1"/libnvrtc.so* "$1"/libcublas.so*; do [ -e "$f" ] && return 0; done; return 1; }
DIRS=""
add() { local d; for d in "$@"; do case "$d" in *stubs*) continue;; esac
          [ -d "$d" ] && has_cuda_libs "$d" && case ":$DIRS:" in *":$d:"*) ;; *) DIRS="${DIRS:+$DIRS:}$d";; esac; done; }
add "${CUDA_HOME:-/usr/local/cuda}/lib64" /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
    /usr/local/cuda-13*/lib64 /usr/local/cuda-13*/targets/x86_64-linux/lib
if [ -z "$DIRS" ]; then
  for r in /opt/torch/.venv/lib/python3*/site-packages/nvidia /usr/local/lib/python3*/dist-packages/nvidia; do
    [ -d "$r" ] && add "$r"/cu13/lib "$r"/*/lib
  done
fi
add /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu /usr/lib64
export LD_LIBRARY_PATH="$DIRS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# Kernel cubins are cached here (a fresh machine compiles once, ~seconds).
export TURBOSPARK_CUDA_CACHE="${TURBOSPARK_CUDA_CACHE:-/tmp/turbospark-cuda-cache}"

echo "== host: $(uname -r); $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)"
echo "== LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
cd "$ROOT"
t0=$(date +%s)
# CUDA_CHECK_WRAP: a command put in front of the binary (a profiler: tools/device/kernel_times.sh).
${CUDA_CHECK_WRAP:-} "$BIN" "$@"; rc=$?
echo "== cuda_check rc=$rc wall=$(( $(date +%s) - t0 )) s (0 = all passed, 1 = a check failed, 2 = no GPU, 101 = panic)"
exit $rc
