#!/usr/bin/env bash
# Nsight Compute's time of each kernel matching REGEX over a short sampled 4B bench (the first COUNT launches),
# one "name ns" line each: ncu_sampled_kernels.sh TURBOSPARK_BIN REGEX COUNT. Run from the repository root.
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
csv=/tmp/ncu-$$.csv
CUDA_CHECK_BIN=$1 CUDA_CHECK_WRAP="$NCU -k regex:$2 --launch-count $3 --metrics gpu__time_duration.sum --csv --page raw --log-file $csv" \
  timeout 300 bash "$ROOT/tools/device/cuda_check.sh" bench --device cuda --shape qwen35-4b --sampled --gen-tokens 6 \
  --prompt-tokens 64 --runs 1 --speculative off --threads-list 1 > /dev/null 2>&1
python3 - "$csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
hdr = next((r for r in rows if "Kernel Name" in r), None)
for r in rows:
    if hdr and len(r) == len(hdr) and r is not hdr:
        d = dict(zip(hdr, r))
        print(d.get("Kernel Name"), d.get("gpu__time_duration.sum"), "ns")
PY
