#!/usr/bin/env bash
# One GPU call: torch's block-scaled fp8 GEMM peer (tools/peers/fp8_blockwise_gemm.py, with
# DeepGEMM beside it when .peer/deepgemm.tar.xz is carried: tools/peers/prepare_deepgemm.sh), then
# `xtask bench gemm` against it, so vt's cuBLASLt / wgmma fp8 and torch's fp8 / bf16 figures
# come from the same machine and call. Writes to $OUT: fp8_blockwise_gemm.json, peer.log,
# gemm.json, bench.log. The GPU machine has no Rust toolchain: build the release binary here
# (`cargo build --release -p xtask`) and carry target/release/xtask; XTASK overrides its path.
# Extra arguments go to the bench (default here: --m 1,128,4096; e.g. --only a_proj --iters 20).
# Usage (in the repository root): tools/device/gemm_bench.sh [BENCH ARGS...]
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
XTASK=${XTASK:-target/release/xtask}
M=${M:-1,128,4096}
mkdir -p "$OUT"
if [ ! -x "$XTASK" ]; then
  echo "no $XTASK: build it with 'cargo build --release -p xtask' and carry it" >&2
  exit 1
fi
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee "$OUT/gpu.txt" || true
# DeepGEMM, when its archive was carried (tools/peers/prepare_deepgemm.sh): built here, then
# timed by the peer script beside torch (a build that fails is recorded per shape as an error).
DG=${DG:-.peer/deepgemm.tar.xz}
if [ -f "$DG" ]; then
  if bash tools/peers/build_deepgemm.sh "$DG" /tmp/deepgemm > "$OUT/deepgemm_build.log" 2>&1; then
    export PYTHONPATH=/tmp/deepgemm/deepgemm${PYTHONPATH:+:$PYTHONPATH}
  fi
  tail -3 "$OUT/deepgemm_build.log"
fi
# The peer first (its GPU memory is released when it exits); a missing torch leaves no peer.
PEER=()
if python3 tools/peers/fp8_blockwise_gemm.py --m "$M" --clean-flush --json "$OUT/fp8_blockwise_gemm.json" 2>&1 | tee "$OUT/peer.log"; then
  PEER=(--peer "$OUT/fp8_blockwise_gemm.json")
fi
"$XTASK" bench gemm --m "$M" ${PEER[@]+"${PEER[@]}"} --json "$OUT/gemm.json" "$@" 2>&1 | tee "$OUT/bench.log"
