#!/usr/bin/env bash
# The first GPU call for the work written without a GPU in the twentieth session (docs/perf.md,
# "Twentieth session"), in order of what decides the most, each step under a time cap (a hang
# shows as a timeout and the later steps still run); about 450 s on an H200:
#  1. the gather forms' tests (16-bit and fp8: tools/device/gather_first_run.sh's own);
#  2. F8R_VT's test, then its A/B against the embedded raw-ring kernel (h64 / h128, fp8 cache);
#     the same for F8R_OWNV;
#  3. the gather forms beside Auto's kernels at block sizes 1 and 16 (--alt);
#  4. the split cut at b32 and at b1 (--parts).
# (The whole-sequence threshold labs and the timeline are the second call: timeline.sh, then
# schedule_labs.sh.)
# The lab builds are written from this checkout's headers with a define prepended and compiled in
# the background while the first tests run (NVRTC is CPU-bound; its disk cache serves the rest).
# The next calls: timeline.sh then schedule_labs.sh (one call); PART=bench, PART=sanitize and
# PART=step of gather_first_run.sh; then the decode table with FlashMLA under the winners.
# Needs, carried: the binaries of tools/device/stage.sh in $BIN (default .dev/bin).
# Usage (in the repository root, on the GPU machine): bash tools/device/pending_first_call.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
BIN=${BIN:-.dev/bin}
LAB=${LAB:-/tmp/pending_lab}
mkdir -p "$OUT"
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$S" || true
source tools/device/lib.sh  # step
lab_overlay "$LAB/vt" wgmma_3wg_sm90.cuh F8R_VT=1
lab_overlay "$LAB/ownv" wgmma_3wg_sm90.cuh F8R_OWNV=1
W=(--only h64,b128,s4096,kv8 --iters 1 --no-parity)
for v in vt ownv; do
  (VT_CUDA_KERNELS_DIR=$LAB/$v timeout 240 "$BIN/xtask" bench decode "${W[@]}" > "$OUT/warm_$v.log" 2>&1 &)
done
# 1.
step gather_tests 200 "$BIN/mla_decode_attention" --exact three_warpgroup_gather_form_matches_reference_with_block_sizes_1_16_and_32 \
  three_warpgroup_gather_form_skips_out_of_range_block_ids --test-threads 1 --nocapture
step fp8_gather_tests 120 "$BIN/mla_decode_fp8" --exact fp8_decode_on_the_raw_ring_kernel_gather_form_matches_reference \
  fp8_decode_skips_out_of_range_block_ids --test-threads 1 --nocapture
# 2.
VT_CUDA_KERNELS_DIR=$LAB/vt step t_vt 150 "$BIN/mla_decode_fp8" fp8_decode_on_the_raw_ring_kernel --test-threads 1 --nocapture
VTOK=$?
Q=(--only h64,kv8 --only h128,kv8 --iters 10 --no-parity)
step ab_main_1 60 "$BIN/xtask" bench decode "${Q[@]}"
[ $VTOK -eq 0 ] && VT_CUDA_KERNELS_DIR=$LAB/vt step ab_vt_1 60 "$BIN/xtask" bench decode "${Q[@]}"
VT_CUDA_KERNELS_DIR=$LAB/ownv step t_ownv 100 "$BIN/mla_decode_fp8" fp8_decode_on_the_raw_ring_kernel --test-threads 1
[ $? -eq 0 ] && VT_CUDA_KERNELS_DIR=$LAB/ownv step ab_ownv_1 60 "$BIN/xtask" bench decode "${Q[@]}"
step ab_main_2 60 "$BIN/xtask" bench decode "${Q[@]}"
# 3.
step small_blocks 120 "$BIN/xtask" bench decode --only bs1 --only bs16 --alt wgmma_3wg --iters 10
# 4.
step parts 90 "$BIN/xtask" bench decode --only h64,b32,kv16 --only h128,b32,kv16 --only h16,b32,kv16 \
  --parts 128,96,64,33 --iters 10 --no-parity
# b = 1 (issue 13's 12 us target): fewer, longer parts leave the combine fewer partials to merge.
step parts_b1 60 "$BIN/xtask" bench decode --only b1,kv16 --parts 64,32,16,8 --iters 20 --no-parity
for f in ab_main_1 ab_vt_1 ab_ownv_1 ab_main_2; do
  [ -f "$OUT/$f.log" ] && echo "== $f $(grep -E '^\| [0-9]+ ' "$OUT/$f.log" | awk -F'|' '{print $2 $3 $4 $5 ":" $8}' | tr -s ' ' | tr '\n' ' ')" | tee -a "$S"
done
for f in small_blocks parts parts_b1; do
  grep -E 'sweep' -B1 "$OUT/$f.log" | cut -c1-200 | tee -a "$S"
done
cat "$S"
