#!/usr/bin/env bash
# One GPU call: the first run of the fp8 kernel as CTA pairs (mla_decode_wgmma_fp8x2,
# kernels-cuda/mla_decode_attention/wgmma_fp8_pair_sm90.cuh; docs/sparse-design.md, D3), which
# no GPU has run yet.
#  1. Correctness: its own test (forced, every block size and schedule), then the fp8 decode
#     and sparse suites (the sparse fp8 cases at 128 heads force it too); compute-sanitizer
#     memcheck, synccheck and racecheck over its test.
#  2. Speed, only if 1 passed: `xtask bench sparse --only decode` with the pair forced beside
#     the op's kernel, and `xtask bench decode --only kv8` at 128 heads with the pair beside
#     the default (over block size 64 the default is the raw-ring kernel), FlashMLA in the call.
# Needs, carried: $BIN (default .dev/bin: xtask, mla_decode_fp8, sparse_mla from
# tools/device/stage.sh), .dev/kcache.tar.xz (optional) and .peer/flashmla.tar.xz.
# Usage (in the repository root, on the GPU machine): bash tools/device/pair_first_run.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
BIN=${BIN:-.dev/bin}
mkdir -p "$OUT"
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee -a "$S" || true
source tools/device/lib.sh  # step, san, FLASHMLA_DIR
bash tools/peers/build_flashmla.sh "$FLASHMLA_DIR" > "$OUT/flashmla_build.log" 2>&1 &
BUILD=$!
trap '(cd "$OUT" && tar czf logs_pair.tgz --remove-files ./*.log ./*.json 2>/dev/null); kcache_report' EXIT

# 1. Correctness.
PAIR=fp8_decode_on_the_cta_pair_kernel_matches_reference
step pair_test 240 "$BIN/mla_decode_fp8" --exact "$PAIR" --nocapture --test-threads 1
ok=$?
grep -E "wgmma_fp8x2" "$OUT/pair_test.log" | head -4 | tee -a "$S"
step fp8_tests 240 "$BIN/mla_decode_fp8" --test-threads 1 || ok=1
step sparse_tests 240 "$BIN/sparse_mla" --test-threads 1 || ok=1
san pair_memcheck 300 memcheck mla_decode_fp8 "$PAIR" || ok=1
san pair_synccheck 300 synccheck mla_decode_fp8 "$PAIR" || ok=1
san pair_racecheck 400 racecheck mla_decode_fp8 "$PAIR" || ok=1

# 2. Speed (the pair forced beside the default, interleaved), FlashMLA in the same call.
wait "$BUILD"
tail -1 "$OUT/flashmla_build.log" | tee -a "$S"
if [ "$ok" != 0 ]; then
  echo "pair: a correctness step failed; no speed run" | tee -a "$S"
  exit 1
fi
PYTHONPATH="$FLASHMLA_DIR${PYTHONPATH:+:$PYTHONPATH}" \
  step sparse_peer 120 python3 tools/peers/flashmla_sparse.py --json "$OUT/flashmla_sparse.json" --only decode
step sparse_pair 200 "$BIN/xtask" bench sparse --only decode --iters 5 --alt wgmma_fp8x2 \
  --peer "$OUT/flashmla_sparse.json"
grep -E "^decode|forced" "$OUT/sparse_pair.log" | cut -c1-220 | tee -a "$S"
PYTHONPATH="$FLASHMLA_DIR${PYTHONPATH:+:$PYTHONPATH}" \
  step decode_peer 150 python3 tools/peers/flashmla_decode.py --json "$OUT/flashmla_decode.json"
step decode_pair 200 "$BIN/xtask" bench decode --only kv8,h128 --iters 10 --alt wgmma_fp8x2 \
  --peer "$OUT/flashmla_decode.json"
grep -E "h128|forced" "$OUT/decode_pair.log" | cut -c1-220 | tee -a "$S"
