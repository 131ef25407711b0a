#!/usr/bin/env bash
# QuantizeFp8's wide kernel (`VT_QUANT_WIDE`, docs/perf.md "QuantizeFp8 v2") on a GPU for the
# first time, one call (~150 s with the kernel cache):
#  1. the fp8_matmul suite: `quantize_matches_the_cpu_byte_for_byte` runs both kernels over every
#     case; memcheck over that test (the wide kernel's tails, odd strides and row loop);
#  2. `xtask bench gemm --m 1,128,4096` with torch's blockwise fp8 as the peer: the `quant` and
#     `wide` columns time the op's kernel and the wide one in the same process, the wide one's
#     bytes checked equal to the op's first (`same bytes`).
# Needs, carried: $BIN (default .dev/bin: TESTS="fp8_matmul" BLOCK_TESTS="" tools/device/stage.sh),
# .dev/kcache.tar.xz. Usage (in the repository root, on the GPU machine):
#   DEADLINE=200 bash tools/device/quant_wide.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
BIN=${BIN:-.dev/bin}
mkdir -p "$OUT"
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee -a "$S" || true
source tools/device/lib.sh  # step, san, the kernel cache
trap '(cd "$OUT" && tar czf logs_quant.tgz --remove-files ./*.log ./*.json 2>/dev/null); kcache_report' EXIT
step fp8_tests 150 "$BIN/fp8_matmul" --test-threads 1 --nocapture
grep -c "byte-exact" "$OUT/fp8_tests.log" | sed 's/^/byte-exact cases: /' | tee -a "$S"
san quant_memcheck 240 memcheck fp8_matmul quantize_matches_the_cpu_byte_for_byte
step gemm_peer 90 python3 tools/peers/fp8_blockwise_gemm.py --m 1,128,4096 --clean-flush --json "$OUT/fp8_blockwise_gemm.json"
G=()
[ -s "$OUT/fp8_blockwise_gemm.json" ] && G=(--peer "$OUT/fp8_blockwise_gemm.json")
step gemm 150 "$BIN/xtask" bench gemm --m 1,128,4096 --iters 20 ${G[@]+"${G[@]}"} --json "$OUT/gemm.json"
grep -E "^[a-z_]+ +M " "$OUT/gemm.log" | sed -E 's/  bf16 .*  quant /  quant /; s/  w8a8\+q .*//' | tee -a "$S"
grep -E "BYTES DIFFER" "$OUT/gemm.log" | tee -a "$S"
