#!/usr/bin/env bash
# Session 22's device call: (1) run 138's core-overlap what-if re-priced under today's flight caps (the 4B
# decode graph with gdn_step not launched and the GDN segments' consumers held ~4.5 us at entry while the
# producers stream: TURBOSPARK_SEG_WHATIF_CORE_DELAY_CYCLES), with the boundary cap and the rows' cap
# lifted; (2) the server and the C API on the GPU (serve_check.py). Build here:
#   cargo build --release -p cuda-backend --bin cuda_check && cargo build --release -p turbospark -p capi
#   cc -std=c99 -I crates/capi/include crates/capi/tests/c/smoke.c -L target/release -lturbospark -o target/release/smoke
#   bash tools/device/pack.sh bins cc=target/release/cuda_check ts=target/release/turbospark \
#     libturbospark.so=target/release/libturbospark.so smoke=target/release/smoke && bash tools/device/pack.sh trim lean
# device (carry [".carry"]): mkdir -p /tmp/b && tar xJf .carry/bins.tar.xz -C /tmp/b && bash tools/device/s22.sh
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
W="$ROOT/tools/device/whatifs.sh"
D=8900  # ~4.5 us at 1.98 GHz: gdn_step's cost a GDN layer (run 176)
for rep in 1 2; do
  echo "#### round $rep"
  bash "$W" /tmp/b/cc ""
  bash "$W" /tmp/b/cc gdn_step
  echo "## held $D cycles"; TURBOSPARK_SEG_WHATIF_CORE_DELAY_CYCLES=$D bash "$W" /tmp/b/cc gdn_step
  echo "## held, edge cap off"; TURBOSPARK_SEG_WHATIF_CORE_DELAY_CYCLES=$D TURBOSPARK_SEG_FLIGHT_EDGE=0 bash "$W" /tmp/b/cc gdn_step
  echo "## held, no caps"; TURBOSPARK_SEG_WHATIF_CORE_DELAY_CYCLES=$D TURBOSPARK_SEG_FLIGHT_EDGE=0 TURBOSPARK_SEG_FLIGHT=0 bash "$W" /tmp/b/cc gdn_step
done
echo "#### server and C API on cuda"
python3 "$ROOT/tools/device/serve_check.py" /tmp/b
