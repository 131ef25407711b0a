#!/usr/bin/env bash
# The next GPU call (docs/perf.md, "Twenty-fourth session", call 6): the combine's occupancy
# labs against main, then the decode table against FlashMLA for each; about 220 s on an H100 /
# H200 with the kernel cache carried. Each step has a time cap; FlashMLA builds in the
# background while the GPU runs the tests and the A/B.
#   a: MLA_COMBINE_BATCH=2 MLA_COMBINE_MIN_CTAS=3 (78 registers, 3 CTAs an SM, no spills)
#   b: MLA_COMBINE_BATCH=2 MLA_COMBINE_MIN_CTAS=4 (64 registers, 4 CTAs, 24 bytes spilled)
#   c: MLA_COMBINE_BATCH=4 MLA_COMBINE_MIN_CTAS=3 (80 registers, 3 CTAs, 104 bytes spilled)
# against main (batches of 4, 114 registers, 2 CTAs: ncu found 21% occupancy and 57% of stalls
# on global loads at h128 b32).
#  1. the decode suite under each lab, memcheck and racecheck over the combine's tests;
#  2. A/B (main, a, b, c, main) where the combine is a large share, and the combine's own time
#     under ncu;
#  3. the decode table against FlashMLA for main and each lab.
# Needs, carried: $BIN (default .dev/bin: tools/device/stage.sh), its kernel cache
# (.dev/kcache.tar.xz) and .peer/flashmla.tar.xz.
# Usage (in the repository root, on the GPU machine): bash tools/device/pending_first_call.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
BIN=${BIN:-.dev/bin}
LAB=${LAB:-/tmp/pending_lab}
FLASHMLA_DIR=${FLASHMLA_DIR:-.peer/flashmla}
mkdir -p "$OUT"
if [ ! -f "$FLASHMLA_DIR/setup.py" ] && [ -f .peer/flashmla.tar.xz ]; then
  FLASHMLA_DIR=/tmp/flashmla/flashmla
  mkdir -p /tmp/flashmla && tar -C /tmp/flashmla -xJf .peer/flashmla.tar.xz
fi
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$S" || true
source tools/device/lib.sh  # step, san, lab_overlay
lab_overlay "$LAB/a" combine.cuh MLA_COMBINE_BATCH=2 MLA_COMBINE_MIN_CTAS=3
lab_overlay "$LAB/b" combine.cuh MLA_COMBINE_BATCH=2 MLA_COMBINE_MIN_CTAS=4
lab_overlay "$LAB/c" combine.cuh MLA_COMBINE_BATCH=4 MLA_COMBINE_MIN_CTAS=3
mkdir -p "$LAB/main"  # an empty overlay: the built-in kernels
bash tools/peers/build_flashmla.sh "$FLASHMLA_DIR" > "$OUT/flashmla_build.log" 2>&1 &
BUILD=$!
trap '(cd "$OUT" && tar czf logs.tgz --remove-files ./*.log ./*.json 2>/dev/null); kcache_report' EXIT

# 1. Correctness under each lab.
C1=decode_attention_handles_strided_views_other_head_dims_and_misalignment
C2=decode_attention_matches_reference_with_block_size_64
for l in a b c; do
  VT_CUDA_KERNELS_DIR=$LAB/$l step "tests_$l" 90 "$BIN/mla_decode_attention" --test-threads 1
  VT_CUDA_KERNELS_DIR=$LAB/$l san "mem_$l" 60 memcheck mla_decode_attention "$C1" "$C2"
  VT_CUDA_KERNELS_DIR=$LAB/$l san "race_$l" 60 racecheck mla_decode_attention "$C1"
done

# 2. A/B and the combine's own time.
AB=(--only b32,kv16,bs64 --only b1,kv16 --only h128,b128,s4096,kv16 --iters 20 --no-parity)
for r in main a b c main2; do
  VT_CUDA_KERNELS_DIR=$LAB/${r%2} step "ab_$r" 90 "$BIN/xtask" bench decode "${AB[@]}"
  echo "== ab_$r" | tee -a "$S"
  grep -E "^h[0-9]" "$OUT/ab_$r.log" | cut -c1-80 | tee -a "$S"
done
for r in main a b c; do
  VT_CUDA_KERNELS_DIR=$LAB/$r step "ncu_$r" 90 ncu --clock-control none --metrics gpu__time_duration.sum \
    --kernel-name regex:mla_decode_combine --csv "$BIN/xtask" bench decode --only h128,b32,kv16,bs64,sq1 \
    --only h64,b32,kv16,bs64,sq1 --only h16,b32,kv16,bs64,sq1 --only h128,b1,kv16 --iters 2 --no-parity
  grep -E 'mla_decode_combine' "$OUT/ncu_$r.log" | awk -F'","' '{print $5, $9, $15}' | tee -a "$S"
done

# 3. The decode table against FlashMLA, main and each lab.
wait "$BUILD"
tail -2 "$OUT/flashmla_build.log" | tee -a "$S"
PYTHONPATH="$FLASHMLA_DIR${PYTHONPATH:+:$PYTHONPATH}" \
  step peer 60 python3 tools/peers/flashmla_decode.py --json "$OUT/flashmla.json"
for r in main a b c; do
  VT_CUDA_KERNELS_DIR=$LAB/$r step "bench_$r" 90 "$BIN/xtask" bench decode --peer "$OUT/flashmla.json" --no-parity
  echo "== bench_$r" | tee -a "$S"
  grep -E "^\| " "$OUT/bench_$r.log" | cut -c1-120 | tee -a "$S"
done
