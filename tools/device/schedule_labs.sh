#!/usr/bin/env bash
# One GPU call: a knob of the decode kernels (by default the split-KV schedule's, in
# kernels-cuda/mla_decode_attention/schedule.cuh; HEADER names another header) as lab builds,
# written on the GPU machine from this checkout's header with a define prepended and run through
# VT_CUDA_KERNELS_DIR, against the embedded build in the same call (main first and last),
# FlashMLA beside them when PEER=1 (the default).
# - KNOB=MLA_SEG_COST (default; twenty-ninth session): the cost-stream cut, each sequence start
#   weighing SEG_COST tiles, so parts that cross a sequence boundary get fewer tiles.
# - KNOB=MLA_SPLIT_COST (twentieth session): the whole-sequence threshold.
# - HEADER=wgmma_3wg_sm90.cuh KNOB=NAME COSTS=1: a lab switch of the three-warpgroup kernel
#   (the twenty-ninth session's W3_OWNQ ran so; SAN_TEST=three_warpgroup_kernel_matches_reference
#   for the sanitizers when it changes a hand-over).
# Each lab first runs the decode suite and the sparse suite through its overlay (the schedule
# decides which parts write which partials: a wrong cut fails the mixed-length tests) and
# memcheck, racecheck and synccheck over $SAN_TEST (default: the mixed-length test) through the
# first lab, then
# `xtask bench decode` (and the sparse decode rows when SPARSE=1).
# Needs, carried: xtask, mla_decode_attention, sparse_mla from tools/device/stage.sh in $BIN
# (default .dev/bin); .peer/flashmla.tar.xz for the peer; .dev/kcache.tar.xz optional.
# Usage (in the repository root, on the GPU machine):
#   KNOB=MLA_SEG_COST COSTS="4 6 8" bash tools/device/schedule_labs.sh [BENCH ARGS...]
# (default bench args: the whole decode table, 20 iterations).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
BIN=${BIN:-.dev/bin}
LAB=${LAB:-/tmp/schedule_lab}
HEADER=${HEADER:-schedule.cuh}
KNOB=${KNOB:-MLA_SEG_COST}
COSTS=${COSTS:-"4 6 8"}
PEER=${PEER:-1}
SPARSE=${SPARSE:-1}
SAN_TEST=${SAN_TEST:-decode_attention_matches_reference_for_mixed_lengths_up_to_32k}
mkdir -p "$OUT"
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee -a "$S" || true
source tools/device/lib.sh  # step, san, lab_overlay, FLASHMLA_DIR
ARGS=("$@")
[ ${#ARGS[@]} -eq 0 ] && ARGS=(--iters 20)
PEERARG=()
trap '(cd "$OUT" && tar czf logs_sched.tgz --remove-files ./*.log ./*.json 2>/dev/null); kcache_report' EXIT
if [ "$PEER" = 1 ]; then
  flashmla_build
fi
for c in $COSTS; do
  lab_overlay "$LAB/c$c" "$HEADER" "$KNOB=$c"
  VT_CUDA_KERNELS_DIR=$LAB/c$c step "c${c}_decode_tests" 120 "$BIN/mla_decode_attention" --test-threads 1
  VT_CUDA_KERNELS_DIR=$LAB/c$c step "c${c}_sparse_tests" 120 "$BIN/sparse_mla" --test-threads 1
done
first=${COSTS%% *}
for tool in memcheck racecheck synccheck; do
  VT_CUDA_KERNELS_DIR=$LAB/c$first san "c${first}_decode_$tool" 150 $tool mla_decode_attention "$SAN_TEST"
done
if [ "$PEER" = 1 ]; then
  flashmla_built
  PYTHONPATH="$FLASHMLA_DIR${PYTHONPATH:+:$PYTHONPATH}" \
    step peer 90 python3 tools/peers/flashmla_decode.py --json "$OUT/flashmla.json"
  [ -s "$OUT/flashmla.json" ] && PEERARG=(--peer "$OUT/flashmla.json")
  if [ "$SPARSE" = 1 ]; then
    PYTHONPATH="$FLASHMLA_DIR${PYTHONPATH:+:$PYTHONPATH}" \
      step sparse_peer 90 python3 tools/peers/flashmla_sparse.py --json "$OUT/flashmla_sparse.json" --only decode
  fi
fi
runs=(main_1 $(for c in $COSTS; do echo c$c; done) main_2)
for v in "${runs[@]}"; do
  dir=()
  case $v in main_*) ;; *) dir=(env VT_CUDA_KERNELS_DIR="$LAB/$v") ;; esac
  step "sched_$v" 150 ${dir[@]+"${dir[@]}"} "$BIN/xtask" bench decode "${ARGS[@]}" ${PEERARG[@]+"${PEERARG[@]}"}
  if [ "$SPARSE" = 1 ]; then
    sp=()
    [ -s "$OUT/flashmla_sparse.json" ] && sp=(--peer "$OUT/flashmla_sparse.json")
    step "sparse_$v" 150 ${dir[@]+"${dir[@]}"} "$BIN/xtask" bench sparse --only decode --iters 5 ${sp[@]+"${sp[@]}"}
  fi
done
for v in "${runs[@]}"; do
  [ -f "$OUT/sched_$v.log" ] && echo "== $v $(grep -E '^\| [0-9]+ ' "$OUT/sched_$v.log" | awk -F'|' '{print $2 $3 $4 $5 $6 ":" $8 "/" $12}' | tr -s ' ' | tr '\n' ';')" | tee -a "$S"
  [ -f "$OUT/sparse_$v.log" ] && grep -E "^decode" "$OUT/sparse_$v.log" | cut -c1-200 | sed "s/^/   sparse $v: /" | tee -a "$S"
done
