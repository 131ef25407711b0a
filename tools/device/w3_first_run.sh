#!/usr/bin/env bash
# The first GPU call of the three-warpgroup decode kernels (kernels-cuda/mla_decode_attention/
# wgmma_3wg_sm90.cuh: mla_decode_wgmma_3wg_{bf16,f16}, Kernel::Wgmma3, and the raw-ring fp8
# form mla_decode_wgmma_fp8r_bf16, Kernel::WgmmaFp8Raw; written without a GPU). Each step has a
# time cap, so a hang shows as a timeout and the later steps still run:
# 1. (PART=tests, the default) their own tests, then their bad-block tests;
# 2. the whole fp8, 16-bit and sparse decode suites (they share the dispatch and the folded
#    softmax of the two-warpgroup kernels);
# 3. (PART=sanitize, a second call) memcheck over their tests, synccheck and racecheck over
#    their bad-block tests. racecheck does not take a named barrier's
#    arrive as ordering the arriving side's accesses (docs/perf.md, fifteenth session), so it is
#    expected to report the hand-overs of s_alpha (P_FULL), s_pinv (Q_READY / FIN) and s_fin
#    (FIN / Q_READY); read its report against those before suspecting a race.
# Writes to $OUT: gpu.txt, test_fp8r.log, test_3wg.log, suites.log, {memcheck,synccheck,
# racecheck}{,_3wg}.log, summary.txt (the last lines of each).
# Needs the test binaries in $BIN (default .dev/bin; tools/device/stage.sh writes them).
# Usage (in the repository root, on the GPU machine): bash tools/device/w3_first_run.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
BIN=${BIN:-.dev/bin}
TEST=fp8_decode_on_the_raw_ring_kernel_matches_reference
TEST3=three_warpgroup_kernel_matches_reference
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee "$OUT/gpu.txt" || true
source tools/device/lib.sh  # step, san
# Two calls' worth (each under the 600 s a device call allows): PART=tests, then PART=sanitize.
PART=${PART:-tests}
FP8_BAD=fp8_decode_skips_out_of_range_block_ids_with_block_size_64
W3_BAD=three_warpgroup_kernel_skips_out_of_range_block_ids
if [ "$PART" = tests ]; then
  # The first process compiles the kernel module with NVRTC (cached on disk for the others).
  step test_fp8r 150 "$BIN/mla_decode_fp8" --exact "$TEST" "$FP8_BAD" --test-threads 1 --nocapture
  step test_3wg 150 "$BIN/mla_decode_attention" --exact "$TEST3" "$W3_BAD" --test-threads 1 --nocapture
  step suites 280 bash -c "'$BIN/mla_decode_fp8' --test-threads 1 && '$BIN/mla_decode_attention' --test-threads 1 && '$BIN/sparse_mla' --test-threads 1"
else
  # memcheck over the kernels' own tests; synccheck and racecheck over the smaller bad-block
  # tests (racecheck is the slowest tool).
  san memcheck 100 memcheck mla_decode_fp8 "$TEST"
  san memcheck_3wg 100 memcheck mla_decode_attention "$TEST3"
  san synccheck 60 synccheck mla_decode_fp8 "$FP8_BAD"
  san synccheck_3wg 60 synccheck mla_decode_attention "$W3_BAD"
  RACE_ARGS="--racecheck-report hazard" san racecheck 100 racecheck mla_decode_fp8 "$FP8_BAD"
  RACE_ARGS="--racecheck-report hazard" san racecheck_3wg 100 racecheck mla_decode_attention "$W3_BAD"
fi
cat "$OUT/summary.txt"
