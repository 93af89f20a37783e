#!/usr/bin/env bash
# Session 22 (timing only, wrong sums): the upper bound of decode attention as ONE kernel (e.g. a thread-block
# cluster per KV head group: prep, split and combine joined by cluster barriers and DSMEM instead of kernel
# boundaries): the decode graph without attn_prep + attn_combine (their work and two boundaries), and without
# every attention kernel, on the 4B (8 attention layers, d 256) and the 8B (36, d 128). Build here:
#   cargo build --release -p cuda-backend --bin cuda_check && bash tools/device/pack.sh bins cc=target/release/cuda_check
#   bash tools/device/pack.sh trim lean
# device (carry [".carry"]): mkdir -p /tmp/b && tar xJf .carry/bins.tar.xz -C /tmp/b && bash tools/device/attn_fold_whatif.sh
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
W="$ROOT/tools/device/whatifs.sh"
for rep in 1 2; do
  bash "$W" /tmp/b/cc "" attn_prep,attn_combine attn_prep,attn_split_4,attn_combine
  SHAPE=qwen3-8b bash "$W" /tmp/b/cc "" attn_prep,attn_combine attn_prep,attn_split_4_d128,attn_combine
done
