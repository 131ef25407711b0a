#!/usr/bin/env bash
# The first GPU calls of the three-warpgroup kernels' gather forms (kernels-cuda/mla_decode_attention/
# wgmma_3wg_sm90.cuh, `CP`: mla_decode_wgmma_3wg_cp_{bf16,f16}, forced Kernel::Wgmma3, and
# mla_decode_wgmma_fp8r_cp_bf16, forced Kernel::WgmmaFp8Raw, where the TMA cannot read the cache;
# written without a GPU, docs/perf.md "Twentieth session"). Each step
# has a time cap, so a hang shows as a timeout and the later steps still run. Five calls' worth (one PART each):
#   PART=tests     their tests, then the decode suites and the sparse suite (whose cases now
#                  also run them, forced, on the sparse view of block size 1);
#   PART=bench     the decode rows of block sizes 1 and 16 with the gather form beside Auto's
#                  kernel; the 64 / 128-head rows of block size 64 with the gather form against
#                  the TMA form (VT_MLA_DECODE_TMA=0 makes Auto take the two-warpgroup cp.async
#                  kernel there, the gather form is the --alt column); the fp8 rows the same way
#                  (wgmma_fp8r);
#   PART=sparse    FlashMLA built in the call and its sparse decode and prefill timed, then the
#                  sparse rows (--kv16 adds the bf16 cache's) with the gather forms beside the
#                  op's choice, then again with VT_MLA_GATHER=1 (the gather forms as the op's
#                  choice) against the same FlashMLA file;
#   PART=step      the DeepSeek-V3.2 decode step (vt-mla bench --layer v32, batch 8, context 64k,
#                  CUDA graph) with VT_MLA_GATHER off and on (on: the sparse op's decode view
#                  takes the gather forms), twice each, interleaved;
#   PART=sanitize  memcheck over their tests, synccheck and racecheck over the bad-block tests.
#                  racecheck does not take a named barrier's arrive as ordering (perf.md,
#                  fifteenth session): read its report against the hand-overs of s_alpha
#                  (P_FULL), Q (Q_READY) and s_fin (FIN) before suspecting a race.
# Needs, carried: the binaries of tools/device/stage.sh in $BIN (default .dev/bin) and, for
# PART=bench, FlashMLA's source at .peer/flashmla (../shared/tools/peers/prepare_flashmla.sh).
# Usage (in the repository root, on the GPU machine): PART=tests bash tools/device/gather_first_run.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
BIN=${BIN:-.dev/bin}
T1=three_warpgroup_gather_form_matches_reference_with_block_sizes_1_16_and_32
T2=three_warpgroup_gather_form_skips_out_of_range_block_ids
F1=fp8_decode_on_the_raw_ring_kernel_gather_form_matches_reference
F2=fp8_decode_skips_out_of_range_block_ids
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee "$OUT/gpu.txt" || true
source tools/device/lib.sh  # step, san
PART=${PART:-tests}
case "$PART" in
tests)
  # The first process compiles the kernel module with NVRTC (cached on disk for the others).
  step gather_tests 200 "$BIN/mla_decode_attention" --exact "$T1" "$T2" --test-threads 1 --nocapture
  step fp8_gather_tests 150 "$BIN/mla_decode_fp8" --exact "$F1" "$F2" --test-threads 1 --nocapture
  step decode_suite 150 "$BIN/mla_decode_attention" --test-threads 2
  step fp8_suite 100 "$BIN/mla_decode_fp8" --test-threads 2
  step sparse_suite 150 "$BIN/sparse_mla" --test-threads 2
  ;;
bench)
  step bench_small_blocks 150 "$BIN/xtask" bench decode --only bs1 --only bs16 --alt wgmma_3wg --iters 20
  step bench_tma_3wg 120 "$BIN/xtask" bench decode --only h64,kv16,bs64,sq1 --only h128,kv16,bs64,sq1 --iters 10 --no-parity
  VT_MLA_DECODE_TMA=0 step bench_gather_bs64 150 "$BIN/xtask" bench decode --only h64,kv16,bs64,sq1 \
    --only h128,kv16,bs64,sq1 --alt wgmma_3wg --iters 10
  step bench_fp8_tma 60 "$BIN/xtask" bench decode --only h64,kv8 --only h128,kv8 --iters 10 --no-parity
  VT_MLA_DECODE_TMA=0 step bench_fp8_gather 90 "$BIN/xtask" bench decode --only h64,kv8 --only h128,kv8 \
    --alt wgmma_fp8r --iters 10
  for f in bench_small_blocks bench_tma_3wg bench_gather_bs64 bench_fp8_tma bench_fp8_gather; do
    grep -E 'sweep|wgmma' "$OUT/$f.log" | grep -v '^|' | cut -c1-220 | tee -a "$OUT/summary.txt"
  done
  ;;
sparse)
  XTASK=$BIN/xtask OUT=$OUT timeout 280 bash tools/device/sparse_bench.sh --kv16 --alt wgmma_3wg,wgmma_fp8r --iters 5 \
    > "$OUT/sparse_outer.log" 2>&1
  echo "sparse bench rc=$?" | tee -a "$OUT/summary.txt"
  # The same rows with the gather forms as the op's choice, against the same FlashMLA file.
  if [ -f "$OUT/flashmla_sparse.json" ]; then
    VT_MLA_GATHER=1 step sparse_gather 200 "$BIN/xtask" bench sparse --peer "$OUT/flashmla_sparse.json" --kv16 --iters 5
  fi
  grep -E 'forced|prefill|decode' "$OUT/bench_sparse.log" 2>/dev/null | cut -c1-220 | tail -30 | tee -a "$OUT/summary.txt"
  ;;
step)
  STEP=(bench --backend cuda --tp 1 --layer v32 --batch 8 --context 65536 --graph --iters 10 --profile 3
    --steps 5 --rounds 2 --warmup 2)
  for r in 1 2; do
    VT_MLA_GATHER=0 step v32_off_$r 120 "$BIN/vt-mla" "${STEP[@]}"
    VT_MLA_GATHER=1 step v32_on_$r 120 "$BIN/vt-mla" "${STEP[@]}"
  done
  for f in v32_off_1 v32_on_1 v32_off_2 v32_on_2; do
    echo "== $f" | tee -a "$OUT/summary.txt"
    grep -iE 'graph|eager|sparse|step' "$OUT/$f.log" | head -12 | tee -a "$OUT/summary.txt"
  done
  ;;
sanitize)
  san memcheck_gather 150 memcheck mla_decode_attention "$T1"
  san memcheck_fp8_gather 120 memcheck mla_decode_fp8 "$F1"
  san synccheck_gather 60 synccheck mla_decode_attention "$T2"
  san synccheck_fp8_gather 60 synccheck mla_decode_fp8 "$F2"
  RACE_ARGS="--racecheck-report hazard" san racecheck_gather 100 racecheck mla_decode_attention "$T2"
  RACE_ARGS="--racecheck-report hazard" san racecheck_fp8_gather 100 racecheck mla_decode_fp8 "$F2"
  ;;
esac
cat "$OUT/summary.txt"
