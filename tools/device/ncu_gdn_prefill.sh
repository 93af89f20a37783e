#!/bin/bash
# Nsight Compute over the chunked GDN kernels of the 4B bench's first prefill pass: gdn_chunk_prep and
# gdn_chunk_state of two layers. The skip passes the self-test's small launches of them (~20; run 26 with
# a regex that also matched gdn_conv_prep / gated_rmsnorm landed inside the self-test: those two also run
# in every decode step, so time them with the bench's profile instead).
# Use as the binary of cuda_check.sh, next to a stripped cuda_check:
#   CUDA_CHECK_BIN=$PWD/.carry/ncu_gdn_prefill.sh bash tools/device/cuda_check.sh --only none
exec /usr/local/cuda/bin/ncu --kernel-name regex:"gdn_chunk" --launch-skip 60 --launch-count 4 \
  --metrics gpu__time_duration.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,launch__registers_per_thread,launch__grid_size,launch__block_size,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum \
  --section WarpStateStats \
  "$(dirname "$0")/cuda_check" "$@"
