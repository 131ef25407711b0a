#!/usr/bin/env bash
# One GPU call: the decode kernels' lab timeline (docs/perf.md, "Twentieth session"). Writes a
# VT_CUDA_KERNELS_DIR overlay of kernels-cuda/mla_decode_attention/schedule.cuh with
# `#define MLA_TIMELINE 1` on top (the three-warpgroup kernels then record %globaltimer stamps
# and wait sums per CTA, the 16-bit narrow kernels the stamps, the combine kernel its span), and
# runs `xtask bench decode --timeline` on the shapes whose fixed cost is in question (the bf16
# cache's block-size-64 rows with one query token, 16 to 128 heads, b1 to b128; the fp8 cache's
# 64- and 128-head rows), printing per shape where the CTAs' time goes. The bench's own
# times in this build include the stamps' cost: compare them with the default build's only
# through the timeline's proportions.
# Needs, carried: xtask from tools/device/stage.sh in $BIN (default .dev/bin).
# Usage (in the repository root, on the GPU machine): bash tools/device/timeline.sh [BENCH ARGS...]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
BIN=${BIN:-.dev/bin}
LAB=${LAB:-/tmp/timeline_lab}
mkdir -p "$OUT" "$LAB/mla_decode_attention"
source tools/device/lib.sh  # step, lab_overlay
lab_overlay "$LAB" schedule.cuh MLA_TIMELINE=1
ARGS=("$@")
[ ${#ARGS[@]} -eq 0 ] && ARGS=(--only kv16,bs64,sq1 --only h64,kv8 --only h128,kv8 --iters 3 --no-parity)
VT_CUDA_KERNELS_DIR=$LAB step timeline 300 "$BIN/xtask" bench decode --timeline "${ARGS[@]}"
grep -E '^(h|fp8)|timeline|segments|main kernel' "$OUT/timeline.log" | cut -c1-400 | tee -a "$OUT/summary.txt"
