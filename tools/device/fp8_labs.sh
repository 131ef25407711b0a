#!/usr/bin/env bash
# One GPU call: lab builds of the dequantizing fp8 decode kernels (which the sparse op runs over
# the fp8 cache) against the kernels' own build, on the sparse decode rows, with FlashMLA in
# the same call. Each lab is a line of $LABS, "NAME HEADER DEFINE=VALUE..." (the header under
# kernels-cuda/mla_decode_attention/ with those defines on top, tools/device/labs.sh; several
# headers joined by '+' each get all the defines). No default: the twenty-eighth session's
# labs (the pair's fence ahead of its loads, MLA_PAIR_ARRIVE_FIRST; the single-CTA producer's
# next-tile offsets a tile ahead, MLA_FP8_IDX_AHEAD; rows allocating in L1, MLA_FP8_ROW_L1)
# are the kernels' own code since (docs/perf.md, "Twenty-eighth session"). E.g.
#   LABS="mine wgmma_fp8_sm90.cuh MY_SWITCH=1" bash tools/device/fp8_labs.sh
#  1. Each lab's correctness: the sparse and fp8 decode suites through its overlay; memcheck
#     and synccheck over the sparse fp8-cache test through the first lab.
#  2. `xtask bench sparse --only decode`: the kernels' build, each lab, the kernels' build
#     again (FlashMLA's times beside each).
# Needs, carried: $BIN (default .dev/bin: xtask, sparse_mla, mla_decode_fp8 from
# tools/device/stage.sh), .dev/kcache.tar.xz (it holds labs.sh's LAB_BUILDS) and
# .peer/flashmla.tar.xz.
# Usage (in the repository root, on the GPU machine): LABS="..." bash tools/device/fp8_labs.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
BIN=${BIN:-.dev/bin}
LABS=${LABS:?"name the labs: LABS=\"NAME HEADER DEFINE=VALUE...\" (see the header)"}
mkdir -p "$OUT"
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee -a "$S" || true
source tools/device/lib.sh  # step, san, lab_overlay, FLASHMLA_DIR
names=()
while read -r name header defs; do
  [ -n "$name" ] || continue
  for h in ${header//+/ }; do lab_overlay "/tmp/lab_$name" "$h" $defs; done  # HEADER: one or h1+h2
  names+=("$name")
done <<< "$LABS"
flashmla_build
trap '(cd "$OUT" && tar czf logs_labs.tgz --remove-files ./*.log ./*.json 2>/dev/null); kcache_report' EXIT

# 1. The labs' correctness.
for l in "${names[@]}"; do
  VT_CUDA_KERNELS_DIR=/tmp/lab_$l step "${l}_sparse_tests" 120 "$BIN/sparse_mla" --test-threads 1
  VT_CUDA_KERNELS_DIR=/tmp/lab_$l step "${l}_fp8_tests" 120 "$BIN/mla_decode_fp8" --test-threads 1
done
VT_CUDA_KERNELS_DIR=/tmp/lab_${names[0]} san "${names[0]}_sparse_memcheck" 120 memcheck sparse_mla \
  sparse_mla_fp8_cache_matches_reference_for_head_counts_and_topk
VT_CUDA_KERNELS_DIR=/tmp/lab_${names[0]} san "${names[0]}_sparse_synccheck" 120 synccheck sparse_mla \
  sparse_mla_fp8_cache_matches_reference_for_head_counts_and_topk

# 2. Kernels' build / labs / kernels' build, FlashMLA beside them.
flashmla_built
PYTHONPATH="$FLASHMLA_DIR${PYTHONPATH:+:$PYTHONPATH}" \
  step sparse_peer 120 python3 tools/peers/flashmla_sparse.py --json "$OUT/flashmla_sparse.json" --only decode
for v in main "${names[@]}" main2; do
  dir=()
  case $v in main | main2) ;; *) dir=(env VT_CUDA_KERNELS_DIR="/tmp/lab_$v") ;; esac
  step "sparse_$v" 150 ${dir[@]+"${dir[@]}"} "$BIN/xtask" bench sparse --only decode --iters 5 \
    --peer "$OUT/flashmla_sparse.json"
  grep -E "^decode" "$OUT/sparse_$v.log" | cut -c1-200 | sed "s/^/$v: /" | tee -a "$S"
done
