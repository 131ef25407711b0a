#!/usr/bin/env bash
# The first GPU runs of the twenty-sixth session's two kernels, which no GPU has run yet
# (docs/perf.md, "Twenty-sixth session"; docs/sparse-design.md D3 and P1):
#   pair:    mla_decode_wgmma_fp8x2 (kernels-cuda/mla_decode_attention/wgmma_fp8_pair_sm90.cuh),
#            the dequantizing fp8 kernel as CTA pairs (Kernel::WgmmaFp8Pair, VT_MLA_FP8_PAIR);
#   prefill: sparse_mla_prefill (kernels-cuda/sparse_mla_attention/prefill_sm90.cuh), the sparse
#            op's own prefill kernel (sparse Kernel::Prefill, VT_SPARSE_PREFILL).
# PART=quick (first, under 600 s): each kernel's own test (forced: every block size / topk shape
#   and schedule) and compute-sanitizer memcheck over each. PART=checks: the fp8 decode and
#   sparse suites (which force both too), synccheck and racecheck over each kernel's own test.
#   PART=tests: both.
# PART=bench (only after tests passed): `xtask bench sparse` (decode and prefill rows) with both
#   forced beside the op's kernels, and `xtask bench decode --only kv8,h128` with the pair beside
#   the default (block size 64: the raw-ring kernel), FlashMLA built and timed in the same call.
# PART=first: see below (tests, bench and memcheck in one call). PART=all: both (~8-9 minutes; over one call's 600 s on a slow start).
# Needs, carried: $BIN (default .dev/bin: xtask, mla_decode_fp8, sparse_mla from
# tools/device/stage.sh), .dev/kcache.tar.xz (optional) and, for bench, .peer/flashmla.tar.xz.
# Usage (in the repository root, on the GPU machine): PART=quick bash tools/device/new_kernels_first_run.sh
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-out}
BIN=${BIN:-.dev/bin}
PART=${PART:-quick}
mkdir -p "$OUT"
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee -a "$S" || true
source tools/device/lib.sh  # step, san, FLASHMLA_DIR
trap '(cd "$OUT" && tar czf logs_new_kernels.tgz --remove-files ./*.log ./*.json 2>/dev/null); kcache_report' EXIT
PAIR=fp8_decode_on_the_cta_pair_kernel_matches_reference
PREFILL=sparse_prefill_kernel_matches_reference

want() { for p in "$@"; do [ "$PART" = "$p" ] && return 0; done; return 1; }
ok=0
if want quick tests all; then
  step pair_test 120 "$BIN/mla_decode_fp8" --exact "$PAIR" --nocapture --test-threads 1 || ok=1
  grep -E "wgmma_fp8x2" "$OUT/pair_test.log" | head -4 | tee -a "$S"
  step prefill_test 120 "$BIN/sparse_mla" --exact "$PREFILL" --nocapture --test-threads 1 || ok=1
  grep -E "sparse_prefill" "$OUT/prefill_test.log" | head -4 | tee -a "$S"
  san pair_memcheck 160 memcheck mla_decode_fp8 "$PAIR" || ok=1
  san prefill_memcheck 160 memcheck sparse_mla "$PREFILL" || ok=1
fi
if want checks tests all; then
  step fp8_tests 200 "$BIN/mla_decode_fp8" --test-threads 1 || ok=1
  step sparse_tests 200 "$BIN/sparse_mla" --test-threads 1 || ok=1
  for tool in synccheck racecheck; do
    san "pair_$tool" 150 "$tool" mla_decode_fp8 "$PAIR" || ok=1
    san "prefill_$tool" 150 "$tool" sparse_mla "$PREFILL" || ok=1
  done
fi
if want quick checks tests all; then
  echo "new kernels ($PART): tests $([ $ok = 0 ] && echo passed || echo FAILED)" | tee -a "$S"
  [ "$PART" = all ] && [ "$ok" != 0 ] && exit 1
fi

# PART=first: all one call can hold when the device budget allows a single call (under
# DEADLINE seconds, default 570): FlashMLA builds in the background while each kernel's own
# test runs; then, if both passed, the sparse bench with both kernels forced beside the op's
# and FlashMLA, then memcheck over each kernel's test in the time left.
if want first; then
  DEADLINE=${DEADLINE:-570}  # step (lib.sh) cuts each cap to the time left
  flashmla_build
  step pair_test 120 "$BIN/mla_decode_fp8" --exact "$PAIR" --nocapture --test-threads 1 || ok=1
  grep -E "wgmma_fp8x2" "$OUT/pair_test.log" | head -4 | tee -a "$S"
  step prefill_test 120 "$BIN/sparse_mla" --exact "$PREFILL" --nocapture --test-threads 1 || ok=1
  grep -E "sparse_prefill" "$OUT/prefill_test.log" | head -4 | tee -a "$S"
  echo "new kernels (first): tests $([ $ok = 0 ] && echo passed || echo FAILED)" | tee -a "$S"
  flashmla_built
  if [ "$ok" = 0 ]; then
    PYTHONPATH="$FLASHMLA_DIR${PYTHONPATH:+:$PYTHONPATH}" \
      step sparse_peer 120 python3 tools/peers/flashmla_sparse.py --json "$OUT/flashmla_sparse.json"
    peer=()  # without the peer's JSON (its build or run failed) the bench still runs, unpaired
    [ -f "$OUT/flashmla_sparse.json" ] && peer=(--peer "$OUT/flashmla_sparse.json")
    step sparse_new 200 "$BIN/xtask" bench sparse --iters 5 --alt wgmma_fp8x2,sparse_prefill "${peer[@]}"
    grep -E "^(decode|prefill)|forced|^\|" "$OUT/sparse_new.log" | cut -c1-260 | tee -a "$S"
  fi
  for k in pair prefill; do
    [ $((DEADLINE - SECONDS)) -lt 40 ] && { echo "no time left for ${k}_memcheck" | tee -a "$S"; continue; }
    if [ $k = pair ]; then san pair_memcheck 160 memcheck mla_decode_fp8 "$PAIR"; else
      san prefill_memcheck 160 memcheck sparse_mla "$PREFILL"; fi
  done
fi

if [ "$PART" = bench ] || [ "$PART" = all ]; then
  bash tools/peers/build_flashmla.sh "$FLASHMLA_DIR" > "$OUT/flashmla_build.log" 2>&1
  tail -1 "$OUT/flashmla_build.log" | tee -a "$S"
  PYTHONPATH="$FLASHMLA_DIR${PYTHONPATH:+:$PYTHONPATH}" \
    step sparse_peer 150 python3 tools/peers/flashmla_sparse.py --json "$OUT/flashmla_sparse.json"
  step sparse_new 300 "$BIN/xtask" bench sparse --iters 5 --alt wgmma_fp8x2,sparse_prefill \
    --peer "$OUT/flashmla_sparse.json"
  grep -E "^(decode|prefill)|forced" "$OUT/sparse_new.log" | cut -c1-220 | tee -a "$S"
  PYTHONPATH="$FLASHMLA_DIR${PYTHONPATH:+:$PYTHONPATH}" \
    step decode_peer 150 python3 tools/peers/flashmla_decode.py --json "$OUT/flashmla_decode.json"
  step decode_pair 200 "$BIN/xtask" bench decode --only kv8,h128 --iters 10 --alt wgmma_fp8x2 \
    --peer "$OUT/flashmla_decode.json"
  grep -E "h128|forced" "$OUT/decode_pair.log" | cut -c1-220 | tee -a "$S"
fi
