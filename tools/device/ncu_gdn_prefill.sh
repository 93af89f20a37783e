#!/bin/bash
# ncu over the chunked GDN kernels of the 4B bench's first prefill passes (the self-test's small launches skipped).
exec /usr/local/cuda/bin/ncu --kernel-name regex:"gdn_chunk|gdn_conv_prep|gated_rmsnorm" --launch-skip 60 --launch-count 12 \
  --metrics gpu__time_duration.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__registers_per_thread,launch__grid_size,launch__block_size,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum \
  "$(dirname "$0")/cuda_check" "$@"
