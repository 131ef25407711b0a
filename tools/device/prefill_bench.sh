#!/usr/bin/env bash
# One GPU call: the torch SDPA peer, then `xtask bench prefill` against it, so every ratio compares
# figures from the same machine and call. Writes to $OUT: sdpa_prefill.json, peer.log,
# prefill.json, prefill.svg, bench.log. The GPU machine has no Rust toolchain: build the release
# binary here (`cargo build --release -p xtask`) and carry target/release/xtask; XTASK overrides
# its path. Extra arguments go to the bench (e.g. --only h128 --iters 10).
# Usage (in the repository root): tools/device/prefill_bench.sh [BENCH ARGS...]
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
XTASK=${XTASK:-target/release/xtask}
mkdir -p "$OUT"
if [ ! -x "$XTASK" ]; then
  echo "no $XTASK: build it with 'cargo build --release -p xtask' and carry it" >&2
  exit 1
fi
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee "$OUT/gpu.txt" || true
# The peer first (its GPU memory is released when it exits).
python3 tools/peers/sdpa_prefill.py --json "$OUT/sdpa_prefill.json" 2>&1 | tee "$OUT/peer.log"
# The kernels built into the binary run; export VT_CUDA_KERNELS_DIR=kernels-cuda to run this
# checkout's kernel sources instead (kernel development without a rebuild).
"$XTASK" bench prefill \
  --peer "$OUT/sdpa_prefill.json" --json "$OUT/prefill.json" --plot "$OUT/prefill.svg" "$@" 2>&1 \
  | tee "$OUT/bench.log"
