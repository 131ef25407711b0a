#!/usr/bin/env bash
# The first GPU call of the raw-ring fp8_ds_mla decode kernel (mla_decode_wgmma_fp8r_bf16,
# Kernel::WgmmaFp8Raw; written without a GPU). Each step has a time cap, so a hang shows as a
# timeout and the later steps still run:
# 1. its own test, then the bad-block test at block size 64 (it is in that test's kernel list);
# 2. the whole fp8, 16-bit and sparse decode suites (they share the dispatch it changed);
# 3. memcheck, synccheck and racecheck over its test. racecheck does not take a named barrier's
#    arrive as ordering the arriving side's accesses (docs/perf.md, fifteenth session), so it is
#    expected to report the hand-overs of s_alpha (P_FULL), s_pinv (Q_READY / FIN) and s_fin
#    (FIN / Q_READY); read its report against those before suspecting a race. Under racecheck the
#    whole test (26 launches) may run past its cap: the cap is RACECHECK_CAP seconds.
# Writes to $OUT: gpu.txt, test_fp8r.log, suites.log, memcheck.log, synccheck.log,
# racecheck.log, summary.txt (the last lines of each).
# Needs the test binaries in $BIN (default .dev/bin; tools/device/stage.sh writes them).
# Usage (in the repository root, on the GPU machine): bash tools/device/fp8r_first_run.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
BIN=${BIN:-.dev/bin}
TEST=fp8_decode_on_the_raw_ring_kernel_matches_reference
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee "$OUT/gpu.txt" || true
step() {  # step NAME CAP_SECONDS COMMAND...
  local name=$1 cap=$2
  shift 2
  local t0=$SECONDS
  timeout "$cap" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc $rc ($((SECONDS - t0)) s)" | tee -a "$OUT/summary.txt"
  grep -E "test result|FAILED|panicked|ERROR SUMMARY|RACECHECK SUMMARY|hazard|out rel error .*wgmma_fp8r" "$OUT/$name.log" \
    | tail -12 | tee -a "$OUT/summary.txt"
}
# The first process compiles the kernel module with NVRTC (cached on disk for the others).
step test_fp8r 240 "$BIN/mla_decode_fp8" --exact "$TEST" fp8_decode_skips_out_of_range_block_ids_with_block_size_64 \
  --test-threads 1 --nocapture
step suites 300 bash -c "'$BIN/mla_decode_fp8' --test-threads 1 && '$BIN/mla_decode_attention' --test-threads 1 && '$BIN/sparse_mla' --test-threads 1"
step memcheck 200 compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN/mla_decode_fp8" --exact "$TEST" --test-threads 1
step synccheck 200 compute-sanitizer --tool synccheck --error-exitcode 9 "$BIN/mla_decode_fp8" --exact "$TEST" --test-threads 1
step racecheck "${RACECHECK_CAP:-240}" compute-sanitizer --tool racecheck --racecheck-report hazard --error-exitcode 9 \
  "$BIN/mla_decode_fp8" --exact "$TEST" --test-threads 1
cat "$OUT/summary.txt"
