#!/usr/bin/env bash
# Runs kernels-hip's IndexerTopK, SparseMlaAttention and CacheIndexerKeys kernels on the CPU
# through emu.h (a thread per HIP thread, one-lane waves) against references in the test
# files. Needs g++ with C++20 (std::barrier); no GPU, no ROCm. Run from the repository root:
#   crates/vt-hip/tests/cpu-emu/run.sh
# This checks the kernels' logic (indexing, masking, the selection's tie rule, the online
# softmax); not wave-level behaviour, the memory model or anything about AMD hardware.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../../.." && pwd)"
out="${TMPDIR:-/tmp}/vt-hip-cpu-emu"
mkdir -p "$out"
rc=0
for op in indexer_top_k sparse_mla_attention cache_indexer_keys; do
  # The dynamic shared memory declaration becomes emu.h's buffer; nothing else is changed.
  sed 's/extern __shared__ float smem\[\];/float* smem = emu_dyn_smem;/' "$root/kernels-hip/$op.hip" >"$out/$op.hip.cpp"
  g++ -std=c++20 -O1 -pthread -Wall -Wno-unused-function -I "$here" -I "$root/kernels-hip" -I "$out" \
    "$here/$op.cpp" -o "$out/$op"
  "$out/$op" || rc=1
done
exit $rc
