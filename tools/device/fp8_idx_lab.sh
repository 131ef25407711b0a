#!/usr/bin/env bash
# One GPU call: two lab builds of kernels-cuda/mla_decode_attention/wgmma_fp8_sm90.cuh (the
# dequantizing 64-row fp8 kernel, which the sparse op runs over the fp8 cache; docs/perf.md,
# "Twenty-fifth session", and docs/sparse-design.md steps D1 / D2) against the kernels' own
# build, on the sparse decode rows, with FlashMLA in the same call:
#   idx:    MLA_FP8_IDX_AHEAD=1, tile t + 1's row offsets (a sparse call's indices) a tile ahead;
#   idx_l1: that and MLA_FP8_ROW_L1=1, the rows allocating in L1.
#  1. The labs' correctness: the sparse and fp8 decode suites through each overlay; memcheck and
#     synccheck over the sparse fp8-cache test (idx_l1).
#  2. `xtask bench sparse --only decode`: the kernels' build, idx, idx_l1, the kernels' build
#     again (FlashMLA's times beside each).
# Needs, carried: $BIN (default .dev/bin: xtask, sparse_mla, mla_decode_fp8 from
# tools/device/stage.sh), .dev/kcache.tar.xz (it holds this lab's build) and
# .peer/flashmla.tar.xz.
# Usage (in the repository root, on the GPU machine): bash tools/device/fp8_idx_lab.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
BIN=${BIN:-.dev/bin}
LAB=${LAB:-/tmp/fp8_idx_lab}
LAB2=${LAB2:-/tmp/fp8_idx_l1_lab}
mkdir -p "$OUT"
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee -a "$S" || true
source tools/device/lib.sh  # step, san, lab_overlay, FLASHMLA_DIR
lab_overlay "$LAB" wgmma_fp8_sm90.cuh MLA_FP8_IDX_AHEAD=1
lab_overlay "$LAB2" wgmma_fp8_sm90.cuh MLA_FP8_IDX_AHEAD=1 MLA_FP8_ROW_L1=1
bash tools/peers/build_flashmla.sh "$FLASHMLA_DIR" > "$OUT/flashmla_build.log" 2>&1 &
BUILD=$!
trap '(cd "$OUT" && tar czf logs_idx.tgz --remove-files ./*.log ./*.json 2>/dev/null); kcache_report' EXIT

# 1. The labs' correctness.
for l in idx idx_l1; do
  d=$LAB
  [ "$l" = idx_l1 ] && d=$LAB2
  VT_CUDA_KERNELS_DIR=$d step "${l}_sparse_tests" 120 "$BIN/sparse_mla" --test-threads 1
  VT_CUDA_KERNELS_DIR=$d step "${l}_fp8_tests" 120 "$BIN/mla_decode_fp8" --test-threads 1
done
VT_CUDA_KERNELS_DIR=$LAB2 san idx_l1_sparse_memcheck 120 memcheck sparse_mla \
  sparse_mla_fp8_cache_matches_reference_for_head_counts_and_topk
VT_CUDA_KERNELS_DIR=$LAB2 san idx_l1_sparse_synccheck 120 synccheck sparse_mla \
  sparse_mla_fp8_cache_matches_reference_for_head_counts_and_topk

# 2. Kernels' build / lab / kernels' build, FlashMLA beside them.
wait "$BUILD"
tail -1 "$OUT/flashmla_build.log" | tee -a "$S"
PYTHONPATH="$FLASHMLA_DIR${PYTHONPATH:+:$PYTHONPATH}" \
  step sparse_peer 120 python3 tools/peers/flashmla_sparse.py --json "$OUT/flashmla_sparse.json" --only decode
for v in main idx idx_l1 main2; do
  dir=()
  [ "$v" = idx ] && dir=(env VT_CUDA_KERNELS_DIR="$LAB")
  [ "$v" = idx_l1 ] && dir=(env VT_CUDA_KERNELS_DIR="$LAB2")
  step "sparse_$v" 150 ${dir[@]+"${dir[@]}"} "$BIN/xtask" bench sparse --only decode --iters 5 \
    --peer "$OUT/flashmla_sparse.json"
  grep -E "^decode" "$OUT/sparse_$v.log" | cut -c1-200 | sed "s/^/$v: /" | tee -a "$S"
done
