#!/usr/bin/env bash
# One GPU call: build FlashMLA (skipped when already built), time its sparse MLA kernels on the
# shapes of `xtask bench sparse` (tools/peers/flashmla_sparse.py), then `xtask bench sparse
# --peer` against that file, so every FlashMLA figure and ratio printed comes from the same
# machine and call. Writes to $OUT: gpu.txt, flashmla_build.log, flashmla_sparse.json,
# peer_sparse.log, sparse.json, bench_sparse.log.
#
# Needs, carried into the call, what tools/device/decode_bench.sh needs: the FlashMLA source
# tree at .peer/flashmla and the release xtask binary (XTASK, default .dev/xtask).
# FLASHMLA_BUILD_SCRIPT and FLASHMLA_DIR override as there; PEER_ONLY=decode|prefill limits the
# peer's rows. Extra arguments go to the bench (e.g. --only decode --iters 10).
# Usage (in the repository root): bash tools/device/sparse_bench.sh [BENCH ARGS...]
set -euo pipefail
cd "$(dirname "$0")/../.."
source tools/device/peer_setup.sh  # OUT, XTASK and FLASHMLA_DIR checked, gpu.txt, FlashMLA built
# The peer first (its GPU memory is released when it exits).
PYTHONPATH="$FLASHMLA_DIR${PYTHONPATH:+:$PYTHONPATH}" \
  python3 tools/peers/flashmla_sparse.py --json "$OUT/flashmla_sparse.json" ${PEER_ONLY:+--only "$PEER_ONLY"} 2>&1 \
  | tee "$OUT/peer_sparse.log"
"$XTASK" bench sparse --peer "$OUT/flashmla_sparse.json" --json "$OUT/sparse.json" "$@" 2>&1 \
  | tee "$OUT/bench_sparse.log"
