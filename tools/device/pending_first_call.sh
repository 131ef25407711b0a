#!/usr/bin/env bash
# The next GPU call: the state on main checked and timed against its peers, as a first call of a
# session (docs/perf.md, "Twenty-fourth session" ran these steps over calls 2-4); about 330 s on
# an H100 / H200 with the kernel cache carried. Each step has a time cap (a hang shows as a
# timeout and the later steps still run); FlashMLA builds in the background while the GPU runs
# the tests.
#  1. the decode, fp8 and sparse suites on fresh inputs (and the GEMM suites where staged),
#     `xtask parity --backend cuda`;
#  2. the decode table against FlashMLA (issues 13, 16);
#  3. the V3 decode step, bf16 and DeepSeek's fp8 weights, against torch + FlashMLA (issue 18).
#  4. synccheck and memcheck over the two widest combine tests.
# Between 1 and 2 the block's CUDA tests where staged; after 2 the CTA-pair fp8 kernel forced
# beside the dense fp8 cache's default at 128 heads.
# Needs, carried: $BIN (default .dev/bin: tools/device/stage.sh), its kernel cache
# (.dev/kcache.tar.xz) and .peer/flashmla.tar.xz (or the tree at .peer/flashmla).
# Optional: $BIN2 (default .dev/bin2) with the block's CUDA test binaries, MANIFEST (the staging
# checkout's crates/mla-block, e.g. /work/main/crates/mla-block, linked here when absent so the
# golden tests find their files), DEADLINE (seconds: steps are cut to fit, lib.sh), PARTS (which
# of 1-4 run: default "tests table steps san").
# Usage (in the repository root, on the GPU machine): bash tools/device/pending_first_call.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
BIN=${BIN:-.dev/bin}
mkdir -p "$OUT"
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$S" || true
source tools/device/lib.sh  # step, the kernel cache, FLASHMLA_DIR
# Every log in one archive at the end (the 8-file limit on what comes back), whatever happens.
trap '(cd "$OUT" && tar czf logs.tgz --remove-files ./*.log ./*.json 2>/dev/null); kcache_report' EXIT
PARTS=${PARTS:-"tests table steps san"}
part() { [[ " $PARTS " == *" $1 "* ]]; }
# FlashMLA (2 and 3 time it) builds while 1 runs.
if part table || part steps; then
  flashmla_build
fi
built() { flashmla_built 2; }

# 1. Correctness on fresh inputs.
if part tests; then
  step decode_tests 120 "$BIN/mla_decode_attention" --test-threads 1
  step fp8_tests 90 "$BIN/mla_decode_fp8" --test-threads 1
  step sparse_tests 90 "$BIN/sparse_mla" --test-threads 1
  # The GEMM suites where staged (TESTS="... skinny_gemm fp8_matmul" tools/device/stage.sh).
  for t in skinny_gemm fp8_matmul; do
    if [ -x "$BIN/$t" ]; then step "${t}_tests" 150 "$BIN/$t" --test-threads 1; fi
  done
  step parity 240 "$BIN/xtask" parity --backend cuda
  grep -E "cells:" "$OUT/parity.log" | tee -a "$S"
  # The block's CUDA tests where their binaries are carried ($BIN2, default .dev/bin2: `cargo test
  # --release -p mla-block --test NAME --no-run`, copied there by name). They find the goldens by
  # the path compiled in (the development checkout's crates/mla-block/../../tests/golden): where
  # that checkout's path does not exist here, it is made a link to this tree's crate.
  BIN2=${BIN2:-.dev/bin2}
  if [ -d "$BIN2" ]; then
    link_manifest
    for t in "$BIN2"/*; do
      MLA_TEST_DEVICE=cuda step "block_$(basename "$t")" 150 "$t" --test-threads 1
      grep -m1 "SKIPPED" "$OUT/block_$(basename "$t").log" | tee -a "$S"
    done
  fi
fi

# 2. The decode table against FlashMLA.
if part table; then
  built
  PYTHONPATH="$FLASHMLA_DIR${PYTHONPATH:+:$PYTHONPATH}" \
    step peer 60 python3 tools/peers/flashmla_decode.py --json "$OUT/flashmla.json"
  step bench 120 "$BIN/xtask" bench decode --peer "$OUT/flashmla.json" --json "$OUT/decode.json" --plot "$OUT/decode.svg"
  grep -E "^\| " "$OUT/bench.log" | cut -c1-120 | tee -a "$S"
  grep -E "^targets" "$OUT/bench.log" | tee -a "$S"
  # The CTA-pair fp8 kernel (Auto's default since the twenty-seventh session where it applies)
  # forced beside the dense fp8 cache's default at 128 heads.
  step decode_pair 120 "$BIN/xtask" bench decode --only kv8,h128 --iters 10 --alt wgmma_fp8x2 \
    --peer "$OUT/flashmla.json"
  grep -E "h128|forced" "$OUT/decode_pair.log" | cut -c1-220 | tee -a "$S"
fi

# 3. The V3 decode step against torch + FlashMLA (same call).
if part steps; then
  built
  PYTHONPATH="$FLASHMLA_DIR${PYTHONPATH:+:$PYTHONPATH}" \
    step step_peer 120 python3 tools/peers/block_step.py --json "$OUT/block_step.json"
  grep -E "^B=" "$OUT/step_peer.log" | tee -a "$S"
  for w in bf16 fp8; do
    for bc in "1 8192" "32 4096" "128 4096"; do
      set -- $bc
      wd=()
      [ "$w" = fp8 ] && wd=(--weights-dtype fp8)
      step "step_${w}_b$1" 90 "$BIN/vt-mla" bench --graph --backend cuda --tp 1 --batch "$1" --context "$2" --iters 20 \
        --profile 3 --steps 5 --rounds 2 --warmup 2 ${wd[@]+"${wd[@]}"} --peer "$OUT/block_step.json"
      grep -E "one step|^peer" "$OUT/step_${w}_b$1.log" | cut -c1-160 | tee -a "$S"
    done
  done
fi

# 4. The combine's batch-of-2 default under synccheck and memcheck (its two widest tests).
if part san; then
  COMBINE_TESTS=(decode_attention_handles_strided_views_other_head_dims_and_misalignment
    decode_attention_matches_reference_with_block_size_64)
  san combine_synccheck 90 synccheck mla_decode_attention "${COMBINE_TESTS[@]}"
  san combine_memcheck 90 memcheck mla_decode_attention "${COMBINE_TESTS[@]}"
fi
