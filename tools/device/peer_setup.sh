# shellcheck shell=bash
# Sourced by decode_bench.sh and sparse_bench.sh (in the repository root, under set -euo pipefail):
# what both do before their own peer and bench steps. Sets OUT (default out; created), XTASK
# (default .dev/xtask), FLASHMLA_BUILD_SCRIPT (default tools/peers/build_flashmla.sh) and
# FLASHMLA_DIR (default .peer/flashmla); stops (exit 1) when the xtask binary or the FlashMLA source
# is missing; writes the GPU's name, clock and power limit to $OUT/gpu.txt and builds FlashMLA
# (skipped when already built) into $OUT/flashmla_build.log.
# Not part of lib.sh: sourcing that would also unpack the kernel cache and the FlashMLA archive and
# set its exit trap, which these two scripts do not do.
OUT=${OUT:-out}
XTASK=${XTASK:-.dev/xtask}
FLASHMLA_BUILD_SCRIPT=${FLASHMLA_BUILD_SCRIPT:-tools/peers/build_flashmla.sh}
FLASHMLA_DIR=${FLASHMLA_DIR:-.peer/flashmla}
mkdir -p "$OUT"
if [ ! -x "$XTASK" ]; then
  echo "no $XTASK: build it with 'cargo build --release -p xtask', copy it there and carry it" >&2
  exit 1
fi
if [ ! -f "$FLASHMLA_DIR/setup.py" ]; then
  echo "no FlashMLA source at $FLASHMLA_DIR: write it with prepare_flashmla.sh and carry it" >&2
  exit 1
fi
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee "$OUT/gpu.txt" || true
bash "$FLASHMLA_BUILD_SCRIPT" "$FLASHMLA_DIR" 2>&1 | tee "$OUT/flashmla_build.log"
