#!/usr/bin/env bash
# One GPU call for the raw-ring fp8 decode kernel's lab builds (kernels-cuda/mla_decode_attention/
# wgmma_3wg_sm90.cuh; docs/perf.md, "Nineteenth session"), written on the GPU machine from this
# checkout's kernel file with a define prepended and run through VT_CUDA_KERNELS_DIR:
#   vt    F8R_VT=1     O^T = V^T P^T with V^T built in registers (no V stage)
#   vt3   F8R_VT=1, F8R_LAB=3 (the same without the P V products: what the rest costs)
#   ahead F8R_AHEAD=1  the dequantization loads one unit ahead
# Steps, each with a time cap: F8R_VT's reference test (26 cases), the fp8 and sparse decode
# suites under it, an A/B against the embedded kernel (two rounds), then the decode table with
# FlashMLA built in the same call (tools/device/decode_bench.sh) under the first lab build that
# passed its test (vt, else ahead).
# Needs, carried: the binaries of tools/device/stage.sh in $BIN (default .dev/bin) and
# FlashMLA's source at .peer/flashmla (../shared/tools/peers/prepare_flashmla.sh).
# Usage (in the repository root, on the GPU machine): bash tools/device/f8r_labs.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
BIN=${BIN:-.dev/bin}
LAB=${LAB:-/tmp/f8r_lab}
mkdir -p "$OUT"
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$S" || true
source tools/device/lib.sh  # step, lab_overlay
lab_overlay "$LAB/vt" wgmma_3wg_sm90.cuh F8R_VT=1
lab_overlay "$LAB/vt3" wgmma_3wg_sm90.cuh F8R_VT=1 F8R_LAB=3
lab_overlay "$LAB/ahead" wgmma_3wg_sm90.cuh F8R_AHEAD=1
(bash tools/peers/build_flashmla.sh .peer/flashmla > "$OUT/flashmla_build.log" 2>&1; echo "flashmla build rc=$?" > "$OUT/fm_done") &
FM=$!
# NVRTC compiles are CPU-bound: warm the cache of the builds the test does not compile.
for v in ahead vt3; do
  (VT_CUDA_KERNELS_DIR=$LAB/$v timeout 300 "$BIN/xtask" bench decode --only h64,kv8,b128 --iters 1 --no-parity \
    > "$OUT/warm_$v.log" 2>&1 &)
done
VT_CUDA_KERNELS_DIR=$LAB/vt step t_fp8r_vt 200 "$BIN/mla_decode_fp8" fp8_decode_on_the_raw_ring_kernel_matches_reference --nocapture
VTOK=$?
if [ $VTOK -eq 0 ]; then
  VT_CUDA_KERNELS_DIR=$LAB/vt step t_fp8_vt 120 "$BIN/mla_decode_fp8" --test-threads 4
  VT_CUDA_KERNELS_DIR=$LAB/vt step t_sparse_vt 120 "$BIN/sparse_mla" --test-threads 4
fi
Q=(--only h64,kv8 --only h128,kv8 --iters 10 --no-parity)
for r in 1 2; do
  step ab_main_$r 90 "$BIN/xtask" bench decode "${Q[@]}"
  [ $VTOK -eq 0 ] && VT_CUDA_KERNELS_DIR=$LAB/vt step ab_vt_$r 90 "$BIN/xtask" bench decode "${Q[@]}"
  [ $r -eq 1 ] && VT_CUDA_KERNELS_DIR=$LAB/ahead step ab_ahead_$r 90 "$BIN/xtask" bench decode "${Q[@]}"
done
[ $VTOK -eq 0 ] && VT_CUDA_KERNELS_DIR=$LAB/vt3 step lab_vt3 90 "$BIN/xtask" bench decode "${Q[@]}"
for f in ab_main_1 ab_vt_1 ab_ahead_1 ab_main_2 ab_vt_2 lab_vt3; do
  [ -f "$OUT/$f.log" ] && echo "== $f $(grep -E '^\| (64|128) ' "$OUT/$f.log" | awk -F'|' '{print $2, $8}' | tr '\n' ' ')" | tee -a "$S"
done
A=$LAB/ahead
[ $VTOK -eq 0 ] && A=$LAB/vt
wait $FM
cat "$OUT/fm_done" | tee -a "$S"
VT_CUDA_KERNELS_DIR=$A XTASK=$BIN/xtask OUT=$OUT timeout 300 bash tools/device/decode_bench.sh --iters 20 \
  > "$OUT/table_outer.log" 2>&1
echo "table ($A) rc=$?" | tee -a "$S"
cat "$S"
