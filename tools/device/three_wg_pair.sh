#!/usr/bin/env bash
# The three-warpgroup decode kernel's CTA pairs (`Kernel::Wgmma3Pair`, `mla_decode_wgmma_3wg_x2`,
# `VT_MLA_3WG_PAIR`; docs/perf.md, "Thirtieth session") in one call: the decode suite (its own
# test among it), memcheck over its test, synccheck and racecheck over it with a short cap
# (over the lab build of the same kernel both ran past 200 s without a word), synccheck over
# the fp8 CTA-pair kernel's test as a control (does the tool finish on a cluster kernel at
# all), then `xtask bench decode` at 128 heads with the pair forced beside the default
# (interleaved, `--alt`), and Auto with the flag on, FlashMLA in the same call.
# Needs, carried: $BIN (default .dev/bin: tools/device/stage.sh) with xtask,
# mla_decode_attention and mla_decode_fp8; .dev/kcache.tar.xz; .peer/flashmla.tar.xz.
# Usage (in the repository root, on the GPU machine): bash tools/device/three_wg_pair.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
BIN=${BIN:-.dev/bin}
SANCAP=${SANCAP:-60}
mkdir -p "$OUT"
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee -a "$S" || true
source tools/device/lib.sh  # step, san, FLASHMLA_DIR, kcache_report
trap '(cd "$OUT" && tar czf logs_pair3.tgz --remove-files ./*.log ./*.json 2>/dev/null); kcache_report' EXIT
flashmla_build
step decode_tests 150 "$BIN/mla_decode_attention" --test-threads 1
san pair_memcheck 120 memcheck mla_decode_attention three_warpgroup_pair_kernel_matches_reference
san pair_synccheck "$SANCAP" synccheck mla_decode_attention three_warpgroup_pair_kernel_matches_reference
san pair_racecheck "$SANCAP" racecheck mla_decode_attention three_warpgroup_pair_kernel_matches_reference
san fp8_pair_synccheck "$SANCAP" synccheck mla_decode_fp8 fp8_decode_on_the_cta_pair_kernel_matches_reference
flashmla_built
PYTHONPATH="$FLASHMLA_DIR${PYTHONPATH:+:$PYTHONPATH}" \
  step peer 90 python3 tools/peers/flashmla_decode.py --json "$OUT/flashmla.json"
P=()
[ -s "$OUT/flashmla.json" ] && P=(--peer "$OUT/flashmla.json")
step bench_alt 200 "$BIN/xtask" bench decode --only h128,kv16 --alt wgmma_3wg_x2 --iters 20 ${P[@]+"${P[@]}"}
grep -E "wgmma_3wg" "$OUT/bench_alt.log" | grep -v "^|" | cut -c1-220 | tee -a "$S"
VT_MLA_3WG_PAIR=1 step bench_flag 150 "$BIN/xtask" bench decode --only h128,kv16 --iters 20 ${P[@]+"${P[@]}"}
grep -E "^h128" "$OUT/bench_flag.log" | cut -c1-220 | tee -a "$S"
