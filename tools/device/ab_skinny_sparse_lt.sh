#!/usr/bin/env bash
# One GPU call (twenty-fifth session): the session's three changes, tested and timed against the
# binaries before them and FlashMLA in the same call.
#  1. Tests: skinny_gemm (the fp8 TMA form's planned ring depth), fp8_matmul (cuBLASLt
#     candidate tuning, VT_LT_TUNE), sparse_mla (Auto's kernels), `xtask parity`, the block's
#     CUDA tests where carried ($BIN2); memcheck, racecheck and synccheck over the TMA form's
#     ring tests, memcheck and synccheck over the sparse fp8-cache test.
#  2. The decode GEMMs, old binary ($OLD, fixed rings) against new, twice interleaved.
#  3. The M 4096 GEMMs with VT_LT_TUNE=0 and 1 (cuBLASLt's first heuristic choice against the
#     fastest of its candidates).
#  4. Sparse MLA against FlashMLA: the op's default beside the forced two-warpgroup wgmma
#     kernel (over the fp8 cache its dequantizing form) and the three-warpgroup gather kernel.
#     (Calls 3-4 of docs/perf.md's twenty-fifth session ran it; the raw-ring default it then
#     measured was reverted.)
#  5. The V3 step with fp8 weights at B 1 and 32 (o_proj and a_proj take the new plans), old
#     and new.
# Needs, carried: $BIN (default .dev/bin: TESTS="skinny_gemm fp8_matmul sparse_mla"
# tools/device/stage.sh), $OLD (default .dev/bin_old: the xtask and vt-mla before the change),
# .dev/kcache.tar.xz (+ .dev/kcache_old.tar.xz for $OLD's kernels) and .peer/flashmla.tar.xz.
# PART=a runs 1-3, PART=b 4-5 (each under the 600 s a call may take); unset, all. LT=0 skips 3;
# SPARSE_ARGS replaces 4's bench options after --iters 5 (default: --alt wgmma,wgmma_3wg); PEER=0
# runs 4 without FlashMLA.
# Usage (in the repository root, on the GPU machine): PART=a bash tools/device/ab_skinny_sparse_lt.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
BIN=${BIN:-.dev/bin}
OLD=${OLD:-.dev/bin_old}
mkdir -p "$OUT"
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$S" || true
source tools/device/lib.sh  # step, san, the kernel cache, FLASHMLA_DIR
# The old binaries' kernels into the same cache (their texts differ: other keys).
if [ -n "${VT_CACHE_DIR:-}" ] && [ -f .dev/kcache_old.tar.xz ]; then
  tar -C "$VT_CACHE_DIR" --strip-components=1 -xJf .dev/kcache_old.tar.xz
fi
PART=${PART:-ab}
if [[ $PART == *b* ]] && [ "${PEER:-1}" = 1 ]; then
  flashmla_build
fi
trap '(cd "$OUT" && tar czf logs.tgz --remove-files ./*.log ./*.json 2>/dev/null); kcache_report' EXIT

if [[ $PART == *a* ]]; then
# 1. Tests.
step skinny_tests 150 "$BIN/skinny_gemm" --test-threads 1
step fp8mm_tests 150 "$BIN/fp8_matmul" --test-threads 1
step sparse_tests 90 "$BIN/sparse_mla" --test-threads 1
step parity 120 "$BIN/xtask" parity --backend cuda
grep -E "cells:" "$OUT/parity.log" | tee -a "$S"
# The block's CUDA tests where their binaries are carried ($BIN2, default .dev/bin2: `cargo test
# --release -p mla-block --test NAME --no-run`, copied there by name).
BIN2=${BIN2:-.dev/bin2}
if [ -d "$BIN2" ]; then
  for t in "$BIN2"/*; do
    MLA_TEST_DEVICE=cuda step "block_$(basename "$t")" 150 "$t" --test-threads 4
  done
fi
san skinny_memcheck 150 memcheck skinny_gemm rings_wrap_over_long_k fp8_tma_form_handles_tails_and_short_splits
san skinny_synccheck 120 synccheck skinny_gemm rings_wrap_over_long_k fp8_tma_form_handles_tails_and_short_splits
RACE_ARGS="--racecheck-report hazard" \
  san skinny_racecheck 150 racecheck skinny_gemm fp8_tma_form_handles_tails_and_short_splits
san sparse_memcheck 120 memcheck sparse_mla sparse_mla_fp8_cache_matches_reference_for_head_counts_and_topk
san sparse_synccheck 120 synccheck sparse_mla sparse_mla_fp8_cache_matches_reference_for_head_counts_and_topk

# 2. Decode GEMMs: old / new, twice.
for r in 1 2; do
  for v in old new; do
    x=$OLD/xtask
    [ "$v" = new ] && x=$BIN/xtask
    step "gemm_${v}_$r" 100 "$x" bench gemm --m 1,8,16,32 --only a_proj,q_b,o_proj,q_absorb,v_up --iters 20 --no-parity
    grep -E "^(a_proj|q_b|o_proj|q_absorb|v_up) " "$OUT/gemm_${v}_$r.log" | cut -c1-100 | tee -a "$S"
  done
done

# 3. cuBLASLt at M 4096: the heuristic's first choice, then the tuned one (LT=0 skips it).
for t in $([ "${LT:-1}" = 1 ] && echo 0 1); do
  VT_LT_TUNE=$t step "lt_tune_$t" 120 "$BIN/xtask" bench gemm --m 4096 --only a_proj,q_b,kv_b,o_proj --iters 10 --no-parity
  grep -E "^(a_proj|q_b|kv_b|o_proj) " "$OUT/lt_tune_$t.log" | sed -E 's/  sk16.*w8a8\[/ ... w8a8[/' | cut -c1-220 | tee -a "$S"
done

fi

if [[ $PART == *b* ]]; then
# 4. Sparse MLA against FlashMLA.
peer=()
if [ -n "${FLASHMLA_BUILD:-}" ]; then
  flashmla_built
  PYTHONPATH="$FLASHMLA_DIR${PYTHONPATH:+:$PYTHONPATH}" \
    step sparse_peer 120 python3 tools/peers/flashmla_sparse.py --json "$OUT/flashmla_sparse.json" \
    && peer=(--peer "$OUT/flashmla_sparse.json")
fi
step sparse_bench 200 "$BIN/xtask" bench sparse ${peer[@]+"${peer[@]}"} --json "$OUT/sparse.json" \
  --iters 5 ${SPARSE_ARGS:---alt wgmma,wgmma_3wg}
grep -E "^\| |forced|^targets" "$OUT/sparse_bench.log" | cut -c1-200 | tee -a "$S"

# 5. The V3 step with fp8 weights, old and new.
for bc in "1 8192" "32 4096"; do
  set -- $bc
  for v in old new; do
    x=$OLD/vt-mla
    [ "$v" = new ] && x=$BIN/vt-mla
    step "step_fp8_${v}_b$1" 90 "$x" bench --graph --backend cuda --tp 1 --batch "$1" --context "$2" --iters 20 \
      --profile 3 --steps 5 --rounds 2 --warmup 2 --weights-dtype fp8
    grep -E "one step|o_proj|qkv_a" "$OUT/step_fp8_${v}_b$1.log" | cut -c1-120 | tee -a "$S"
  done
done
fi
