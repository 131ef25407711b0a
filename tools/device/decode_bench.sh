#!/usr/bin/env bash
# One GPU call: build FlashMLA (skipped when already built), time it on the decode shapes, then
# `xtask bench decode --peer` against that file, so every FlashMLA figure and ratio printed comes
# from the same machine and call. Writes to $OUT: gpu.txt, flashmla_build.log, flashmla.json,
# peer.log, decode.json, decode.svg, bench.log.
#
# Needs, carried into the call: the FlashMLA source tree at .peer/flashmla (FlashMLA 9241ae3 with
# cutlass 147f567, written by ../shared/tools/peers/prepare_flashmla.sh; see
# ../shared/tools/peers/README.md; never committed) and the release binary (the GPU machine has
# no Rust toolchain): XTASK, default .dev/xtask. FLASHMLA_BUILD_SCRIPT overrides
# tools/peers/build_flashmla.sh, FLASHMLA_DIR overrides .peer/flashmla. Extra arguments go to the
# bench (e.g. --only h128 --iters 20).
# Usage (in the repository root): bash tools/device/decode_bench.sh [BENCH ARGS...]
set -euo pipefail
cd "$(dirname "$0")/../.."
source tools/device/peer_setup.sh  # OUT, XTASK and FLASHMLA_DIR checked, gpu.txt, FlashMLA built
# The peer first (its GPU memory is released when it exits).
PYTHONPATH="$FLASHMLA_DIR${PYTHONPATH:+:$PYTHONPATH}" \
  python3 tools/peers/flashmla_decode.py --json "$OUT/flashmla.json" 2>&1 | tee "$OUT/peer.log"
# The kernels built into the binary run; export VT_CUDA_KERNELS_DIR=kernels-cuda to run this
# checkout's kernel sources instead.
"$XTASK" bench decode \
  --peer "$OUT/flashmla.json" --json "$OUT/decode.json" --plot "$OUT/decode.svg" "$@" 2>&1 \
  | tee "$OUT/bench.log"
