#!/usr/bin/env bash
# The next GPU call (docs/perf.md, "Twenty-third session"), in order of what decides the most,
# each step under a time cap (a hang shows as a timeout and the later steps still run); about
# 400 s on an H100 / H200 with the kernel cache carried:
#  1. racecheck over F8R_VT's tests to the end (call 6 of the twenty-third session stopped it at
#     75 s): with memcheck and synccheck already clean, a clean report makes F8R_VT the default
#     (-5 to -6% at 64 / 128 heads over the fp8 cache);
#  2. the W3_CP_DEFER lab (the gather forms arriving one tile late, without
#     cp.async.mbarrier.arrive): its tests, synccheck / memcheck / racecheck, and its speed at
#     block sizes 1 and 16 beside main's gather forms and Auto (--alt wgmma_3wg), both builds
#     in this call;
#  3. ncu over the combine kernel (per-kernel times at b32 and b1, then its sections at h128 b32).
# The previous version of this script (the twentieth session's labs) ran on 2026-12-05; its
# results are in docs/perf.md, "Twenty-third session".
# Needs, carried: the binaries of tools/device/stage.sh in $BIN (default .dev/bin) and its
# kernel cache (.dev/kcache.tar.xz), both staged from this checkout.
# Usage (in the repository root, on the GPU machine): bash tools/device/pending_first_call.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
BIN=${BIN:-.dev/bin}
LAB=${LAB:-/tmp/pending_lab}
mkdir -p "$OUT"
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$S" || true
source tools/device/lib.sh  # step, san, lab_overlay
lab_overlay "$LAB/vt" wgmma_3wg_sm90.cuh F8R_VT=1
lab_overlay "$LAB/defer" wgmma_3wg_sm90.cuh W3_CP_DEFER=1
T1=three_warpgroup_gather_form_matches_reference_with_block_sizes_1_16_and_32
T2=three_warpgroup_gather_form_skips_out_of_range_block_ids
F1=fp8_decode_on_the_raw_ring_kernel_gather_form_matches_reference
F2=fp8_decode_skips_out_of_range_block_ids
# 1. F8R_VT: racecheck, one test a process (the head-count test is the long one).
for t in fp8_decode_on_the_raw_ring_kernel_matches_reference fp8_decode_skips_out_of_range_block_ids_with_block_size_64 \
  fp8_decode_matches_reference_with_block_sizes_1_16_64 fp8_decode_matches_reference_for_head_counts_8_to_128_and_query_lengths_1_to_4; do
  VT_CUDA_KERNELS_DIR=$LAB/vt san "vt_race_${t:11:24}" 150 racecheck mla_decode_fp8 "$t"
done
# 2. W3_CP_DEFER: tests, sanitizers, then speed beside main's gather forms.
VT_CUDA_KERNELS_DIR=$LAB/defer step defer_tests 120 "$BIN/mla_decode_attention" --exact "$T1" "$T2" --test-threads 1 --nocapture
VT_CUDA_KERNELS_DIR=$LAB/defer step defer_fp8_tests 60 "$BIN/mla_decode_fp8" --exact "$F1" "$F2" --test-threads 1
VT_CUDA_KERNELS_DIR=$LAB/defer san defer_sync 60 synccheck mla_decode_attention "$T1" "$T2"
VT_CUDA_KERNELS_DIR=$LAB/defer san defer_sync_fp8 60 synccheck mla_decode_fp8 "$F1" "$F2"
VT_CUDA_KERNELS_DIR=$LAB/defer san defer_mem 90 memcheck mla_decode_attention "$T1"
VT_CUDA_KERNELS_DIR=$LAB/defer san defer_race 90 racecheck mla_decode_attention "$T2"
VT_CUDA_KERNELS_DIR=$LAB/defer san defer_race_fp8 90 racecheck mla_decode_fp8 "$F2"
step small_main 60 "$BIN/xtask" bench decode --only bs1 --only bs16 --alt wgmma_3wg --iters 10
VT_CUDA_KERNELS_DIR=$LAB/defer step small_defer 60 "$BIN/xtask" bench decode --only bs1 --only bs16 --alt wgmma_3wg --iters 10
step small_main_2 60 "$BIN/xtask" bench decode --only bs1 --only bs16 --alt wgmma_3wg --iters 10
for f in small_main small_defer small_main_2; do
  echo "== $f" | tee -a "$S"
  grep -E 'sweep' -B1 "$OUT/$f.log" | cut -c1-200 | tee -a "$S"
done
cat "$S"
# 3. What limits the combine (4-23 us past the main grid at b32 / b1, docs/perf.md "Twenty-third
#    session"): per-kernel times without the timeline build, then ncu's sections of its launches.
for shape in h128,b32,kv16,bs64,sq1 h64,b32,kv16,bs64,sq1 h128,b1,kv16,bs64,sq1; do
  tag=${shape%%,kv16*}; tag=${tag//,/_}
  step "ncu_times_${tag}" 90 ncu --clock-control none --metrics gpu__time_duration.sum --csv \
    "$BIN/xtask" bench decode --only "$shape" --iters 3 --no-parity
  grep -E 'mla_decode_(combine|wgmma)' "$OUT/ncu_times_${tag}.log" | tail -4 | cut -c1-220 | tee -a "$S"
done
step ncu_combine 150 ncu --clock-control none --kernel-name regex:mla_decode_combine --launch-count 2 \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
  "$BIN/xtask" bench decode --only h128,b32,kv16,bs64,sq1 --iters 1 --no-parity
grep -E 'Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Grid Size|Registers|Stall|L2 Hit' \
  "$OUT/ncu_combine.log" | head -30 | tee -a "$S"
# Every log in one archive, so the 8-file limit on what comes back keeps them all.
(cd "$OUT" && tar czf logs.tgz --remove-files ./*.log) || true
