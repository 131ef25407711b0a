#!/usr/bin/env bash
# One GPU call: the split-KV schedule's whole-sequence threshold (SPLIT_COST in
# kernels-cuda/mla_decode_attention/schedule.cuh, docs/perf.md "Twentieth session") as lab
# builds, written on the GPU machine from this checkout's schedule.cuh with a define prepended
# and run through VT_CUDA_KERNELS_DIR, against the embedded build in the same call (main first
# and last). Lower costs make whole-sequence mode rarer: the even cut (exact balance, partials
# and the combine) then runs where whole sequences left parts up to a sequence's tiles apart.
# Needs, carried: xtask from tools/device/stage.sh in $BIN (default .dev/bin).
# Usage (in the repository root, on the GPU machine): bash tools/device/schedule_labs.sh [BENCH ARGS...]
# (default bench args: the 64- and 128-head block-size-64 rows of the bf16 cache, 20 iterations).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
BIN=${BIN:-.dev/bin}
LAB=${LAB:-/tmp/schedule_lab}
COSTS=${COSTS:-"0 2 4"}
mkdir -p "$OUT"
source tools/device/lib.sh  # step
ARGS=("$@")
[ ${#ARGS[@]} -eq 0 ] && ARGS=(--only h64,kv16,bs64,sq1 --only h128,kv16,bs64,sq1 --iters 20 --no-parity)
for c in $COSTS; do
  lab_overlay "$LAB/sc$c" schedule.cuh MLA_SPLIT_COST=$c
done
step sched_main_1 150 "$BIN/xtask" bench decode "${ARGS[@]}"
for c in $COSTS; do
  VT_CUDA_KERNELS_DIR=$LAB/sc$c step sched_sc${c} 150 "$BIN/xtask" bench decode "${ARGS[@]}"
done
step sched_main_2 150 "$BIN/xtask" bench decode "${ARGS[@]}"
for f in sched_main_1 $(for c in $COSTS; do echo sched_sc$c; done) sched_main_2; do
  [ -f "$OUT/$f.log" ] && echo "== $f $(grep -E '^\| [0-9]+ ' "$OUT/$f.log" | awk -F'|' '{print $2 $3 $4 ":" $8}' | tr -s ' ' | tr '\n' ' ')" | tee -a "$OUT/summary.txt"
done
