#!/usr/bin/env bash
# The combine's strided form (`VT_MLA_COMBINE_STRIDE`, docs/perf.md "Forty-second session") on a
# GPU for the first time, one call (~160 s with the kernel cache; FlashMLA builds meanwhile):
#  1. the decode suite (its strided test among it); memcheck and racecheck over the strided test;
#  2. ncu's gpu__time_duration of our decode kernels, combine plain and strided, at h64 / h128 x
#     b128 / b32 s4096, and of FlashMLA's own kernels (split-KV, combine, metadata) at the same
#     shapes: where each side's fixed cost sits (tools/device/ncu_sum.py sums them);
#  3. three interleaved rounds plain / strided of the b128 and b32 s4096 rows (16, 64 and 128
#     heads), FlashMLA's table from the same call beside them.
# Needs, carried: $BIN (default .dev/bin: tools/device/stage.sh with TESTS="mla_decode_attention"
# BLOCK_TESTS=""), .dev/kcache.tar.xz, .peer/flashmla.tar.xz.
# Usage (in the repository root, on the GPU machine): DEADLINE=250 bash tools/device/combine_stride.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
BIN=${BIN:-.dev/bin}
mkdir -p "$OUT"
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$S" || true
source tools/device/lib.sh
trap '(cd "$OUT" && tar czf logs59.tgz --remove-files ./*.log ./*.json 2>/dev/null); kcache_report' EXIT
[ -n "${PREFLIGHT:-}" ] || flashmla_build
STRIDED=decode_attention_matches_reference_with_the_strided_combine
step decode_tests 150 "$BIN/mla_decode_attention" --test-threads 1
san strided_memcheck 90 memcheck mla_decode_attention "$STRIDED"
san strided_racecheck 90 racecheck mla_decode_attention "$STRIDED"
# NO_NCU=1 leaves out the ncu steps (a short call: the tests and the A/B only).
[ -n "${NO_NCU:-}" ] && NCU_SHAPES="" || NCU_SHAPES="h64,b128 h128,b128 h64,b32 h128,b32"
for sh in $NCU_SHAPES; do
  for v in 0 1; do
    VT_MLA_COMBINE_STRIDE=$v step "ncu_${sh/,/_}_$v" 60 ncu --clock-control none --csv --metrics gpu__time_duration.sum \
      -k regex:mla_decode "$BIN/xtask" bench decode --only "$sh,s4096,bs64,sq1,kv16" --iters 4 --no-parity
    python3 tools/device/ncu_sum.py "$OUT/ncu_${sh/,/_}_$v.log" "$sh stride=$v" | tee -a "$S"
  done
done
flashmla_built 2
# FlashMLA's own kernels under the same ncu metric (its main kernel, combine and metadata).
if [ -z "${PREFLIGHT:-}" ] && [ -z "${NO_NCU:-}" ]; then
  for hb in "64 32" "64 128" "128 32" "128 128"; do
    set -- $hb
    PYTHONPATH="$FLASHMLA_DIR${PYTHONPATH:+:$PYTHONPATH}" step "ncu_fmla_h$1_b$2" 60 ncu --clock-control none --csv \
      --metrics gpu__time_duration.sum -k regex:mla python3 tools/peers/flashmla_decode_one.py "$1" "$2" 4096
    python3 tools/device/ncu_sum.py "$OUT/ncu_fmla_h$1_b$2.log" "FlashMLA h$1 b$2" | tee -a "$S"
  done
fi
P=()
if [ -z "${PREFLIGHT:-}" ]; then
  PYTHONPATH="$FLASHMLA_DIR${PYTHONPATH:+:$PYTHONPATH}" \
    step peer 60 python3 tools/peers/flashmla_decode.py --json "$OUT/flashmla.json"
  [ -s "$OUT/flashmla.json" ] && P=(--peer "$OUT/flashmla.json")
fi
for r in 1 2 3; do
  for v in 0 1; do
    VT_MLA_COMBINE_STRIDE=$v step "ab_r${r}_$v" 90 "$BIN/xtask" bench decode --only b128,s4096,bs64,sq1,kv16 \
      --only b32,s4096,bs64,sq1,kv16 --iters 30 --no-parity ${P[@]+"${P[@]}"}
    grep -E "^h[0-9]" "$OUT/ab_r${r}_$v.log" | cut -c1-200 | sed "s/^/r$r stride=$v /" | tee -a "$S"
  done
done
