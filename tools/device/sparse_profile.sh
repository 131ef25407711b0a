#!/usr/bin/env bash
# Where sparse decode's time goes against FlashMLA (issue 19; docs/perf.md, "Twenty-eighth
# session"): ncu `--set full` with source counters over one launch of each kernel at FlashMLA's
# V3.2 shape b 128 (s_q 2, s_kv 32768, topk 2048, fp8 cache): ours at 128 heads (the CTA-pair
# kernel, Auto's) and 64 heads (the single-CTA dequantizing kernel), FlashMLA's at both. For
# each: the details page (`<name>_details.txt`) and the SASS source counters
# (`<name>_source.csv`), packed into one archive.
# Needs, carried: $BIN (default .dev/bin) with xtask, .dev/kcache.tar.xz, .peer/flashmla.tar.xz
# (built here unless a warm machine has it).
# Usage (in the repository root, on the GPU machine): bash tools/device/sparse_profile.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
BIN=${BIN:-.dev/bin}
mkdir -p "$OUT/prof"
S=$OUT/summary.txt
source tools/device/lib.sh  # step, FLASHMLA_DIR, NCU, ncu_pages
trap '(cd "$OUT" && tar cJf sparse_profile.tar.xz --remove-files prof ./ncu_*.log ./flashmla_build.log 2>/dev/null); kcache_report' EXIT
flashmla_build
for h in 128 64; do
  step "ncu_vt_h$h" 150 "${NCU[@]}" -k regex:mla_decode_wgmma_fp8 --export "$OUT/prof/vt_h$h" \
    "$BIN/xtask" bench sparse --only "decode,h$h,b128,k2048" --iters 3 --no-parity
  ncu_pages "vt_h$h"
done
flashmla_built
for h in 128 64; do
  PYTHONPATH="$FLASHMLA_DIR${PYTHONPATH:+:$PYTHONPATH}" \
    step "ncu_fmla_h$h" 150 "${NCU[@]}" -k regex:fp8_sparse --export "$OUT/prof/fmla_h$h" \
    python3 tools/peers/flashmla_sparse_one.py "$h" 128
  ncu_pages "fmla_h$h"
done
