#!/usr/bin/env bash
# One GPU call: VT_FP8_ABSORBED and VT_FP8_ABSORBED_BY_STEP (crates/vt-core/src/flags.rs) A/B
# on the V3 decode step with fp8 weights. VT_FP8_ABSORBED on (the default): the absorbed
# W_UK_T / W_UV stay fp8 (the weight-only fp8 BMM); off: dequantized at load (cuBLAS's batched
# GEMM); BY_STEP on: both forms held, each step picks (the float one from 32 tokens).
# docs/perf.md, "Twenty-ninth session".
#  1. The block's CUDA tests in $BIN2 with VT_FP8_ABSORBED off and then with BY_STEP on (their
#     fp8-weight cases then run the float BMMs under graph capture and against the goldens),
#     and the flags' own test.
#  2. `vt-mla bench --graph --weights-dtype fp8` at B 1 / 32 / 128 for each mode of $MODES
#     ("ABSORBED:BY_STEP" pairs; default: fp8, dequantized, both, fp8 again).
# Needs, carried: $BIN (default .dev/bin: vt-mla) and $BIN2 (default .dev/bin2: the block's
# test binaries, fp8_absorbed among them) from tools/device/stage.sh; MANIFEST as in
# pending_first_call.sh (the golden tests find their files through it).
# Usage (in the repository root, on the GPU machine): bash tools/device/absorbed_ab.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
BIN=${BIN:-.dev/bin}
BIN2=${BIN2:-.dev/bin2}
mkdir -p "$OUT"
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee -a "$S" || true
source tools/device/lib.sh  # step, the kernel cache, link_manifest
trap '(cd "$OUT" && tar czf logs_absorbed.tgz --remove-files ./*.log 2>/dev/null); kcache_report' EXIT
link_manifest
for t in "$BIN2"/*; do
  n=$(basename "$t")
  if [ "$n" = fp8_absorbed ]; then
    MLA_TEST_DEVICE=cuda step "block_$n" 150 "$t" --test-threads 1
  else
    VT_FP8_ABSORBED=0 MLA_TEST_DEVICE=cuda step "block_${n}_absorbed_off" 150 "$t" --test-threads 1
    VT_FP8_ABSORBED_BY_STEP=1 MLA_TEST_DEVICE=cuda step "block_${n}_by_step" 150 "$t" --test-threads 1
  fi
done
MODES=${MODES:-"1:0 0:0 1:1 1:0"}
for m in $MODES; do
  a=${m%%:*} bs=${m#*:}
  for bc in "1 8192" "32 4096" "128 4096"; do
    set -- $bc
    log=step_a${a}_s${bs}_b$1
    [ -f "$OUT/$log.log" ] && log=${log}_again
    VT_FP8_ABSORBED=$a VT_FP8_ABSORBED_BY_STEP=$bs step "$log" 90 "$BIN/vt-mla" bench --graph --backend cuda --tp 1 \
      --batch "$1" --context "$2" --iters 20 --profile 3 --steps 5 --rounds 2 --warmup 2 --weights-dtype fp8
    grep -E "one step|q_absorb|v_up" "$OUT/$log.log" | cut -c1-120 | sed "s/^/$log: /" | tee -a "$S"
  done
done
