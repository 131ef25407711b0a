#!/usr/bin/env bash
# Where dense decode's time goes against FlashMLA at 128 heads (issue 13; docs/perf.md,
# "Twenty-ninth session": the three-warpgroup kernel's tiles run ~15% slower than FlashMLA's at
# b >= 64, and b32 carries a fixed cost): ncu `--set full` with source counters over one launch
# of each main kernel at h128 s4096, b 128 and b 32 (bf16 cache, block size 64): ours (Auto's
# `mla_decode_wgmma_3wg_bf16`) and FlashMLA's (`flash_fwd_splitkv_mla`), and the combine kernels
# of both at b 32. For each: the details page (`<name>_details.txt`) and the SASS source
# counters (`<name>_source.csv`), packed into one archive.
# Needs, carried: $BIN (default .dev/bin) with xtask, .dev/kcache.tar.xz, .peer/flashmla.tar.xz
# (built here unless a warm machine has it).
# Usage (in the repository root, on the GPU machine): bash tools/device/decode_profile.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
BIN=${BIN:-.dev/bin}
mkdir -p "$OUT/prof"
S=$OUT/summary.txt
source tools/device/lib.sh  # step, FLASHMLA_DIR, NCU, ncu_pages
trap '(cd "$OUT" && tar cJf decode_profile.tar.xz --remove-files prof ./ncu_*.log ./flashmla_build.log 2>/dev/null); kcache_report' EXIT
flashmla_build
for b in 128 32; do
  step "ncu_vt_b$b" 150 "${NCU[@]}" -k regex:mla_decode_wgmma_3wg --export "$OUT/prof/vt_b$b" \
    "$BIN/xtask" bench decode --only "h128,b$b,s4096,bs64,sq1,kv16" --iters 3 --no-parity
  ncu_pages "vt_b$b"
done
step ncu_vt_combine_b32 120 "${NCU[@]}" -k regex:mla_decode_combine --export "$OUT/prof/vt_combine_b32" \
  "$BIN/xtask" bench decode --only h128,b32,s4096,bs64,sq1,kv16 --iters 3 --no-parity
ncu_pages vt_combine_b32
flashmla_built
for b in 128 32; do
  PYTHONPATH="$FLASHMLA_DIR${PYTHONPATH:+:$PYTHONPATH}" \
    step "ncu_fmla_b$b" 150 "${NCU[@]}" -k regex:flash_fwd_splitkv_mla --export "$OUT/prof/fmla_b$b" \
    python3 tools/peers/flashmla_decode_one.py 128 "$b" 4096
  ncu_pages "fmla_b$b"
done
PYTHONPATH="$FLASHMLA_DIR${PYTHONPATH:+:$PYTHONPATH}" \
  step ncu_fmla_combine_b32 120 "${NCU[@]}" -k regex:combine --export "$OUT/prof/fmla_combine_b32" \
  python3 tools/peers/flashmla_decode_one.py 128 32 4096
ncu_pages fmla_combine_b32
