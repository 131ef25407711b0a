#!/usr/bin/env bash
# One GPU call: the torch peer of one MLA layer's prefill forward (tools/peers/prefill_step.py), then
# `vt-mla bench-prefill` against it, so every vt/torch ratio compares figures from the same machine
# and call. Writes to $OUT: gpu.txt, prefill_step_peer.json, peer.log, prefill_step.json, bench.log
# (and the same with a _ctx suffix for the chunked-prefill form when CONTEXT is set). The GPU machine
# has no Rust toolchain: build the release binary here (`cargo build --release -p vt-mla`) and carry
# target/release/vt-mla; VT_MLA overrides its path.
# Environment: TOKENS (default 1024,4096,8192), CONTEXT (cached tokens for a second, chunked-prefill
# run, e.g. 16384; default none), CHUNK (gather rows per chunk; default the whole context). Extra
# arguments go to the Rust bench (e.g. --rounds 3 --op-iters 5). BACKEND=cpu with `--layer small` in
# the bench arguments and `--dims small --device cpu` in PEER_ARGS runs the same flow without a GPU.
# Usage (in the repository root): tools/device/prefill_step.sh [BENCH ARGS...]
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
VT_MLA=${VT_MLA:-target/release/vt-mla}
TOKENS=${TOKENS:-1024,4096,8192}
CONTEXT=${CONTEXT:-}
CHUNK=${CHUNK:-}
BACKEND=${BACKEND:-cuda}
mkdir -p "$OUT"
if [ ! -x "$VT_MLA" ]; then
  echo "no $VT_MLA: build it with 'cargo build --release -p vt-mla' and carry it" >&2
  exit 1
fi
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee "$OUT/gpu.txt" || true
status=0
run_pair() { # suffix, extra peer args..., --, extra bench args...
  local sfx=$1; shift
  local peer_args=() bench_args=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do peer_args+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  bench_args=("$@")
  # The peer first (its GPU memory is released when it exits).
  # shellcheck disable=SC2086 # PEER_ARGS is a word list
  python3 tools/peers/prefill_step.py --tokens "$TOKENS" --json "$OUT/prefill_step_peer$sfx.json" \
    ${PEER_ARGS:-} "${peer_args[@]}" 2>&1 | tee "$OUT/peer$sfx.log" || status=1
  local peer=()
  [ -s "$OUT/prefill_step_peer$sfx.json" ] && peer=(--peer "$OUT/prefill_step_peer$sfx.json")
  "$VT_MLA" bench-prefill --backend "$BACKEND" --tokens "$TOKENS" "${peer[@]}" --json "$OUT/prefill_step$sfx.json" \
    "${bench_args[@]}" 2>&1 | tee "$OUT/bench$sfx.log" || status=1
}
run_pair "" -- "$@"
if [ -n "$CONTEXT" ]; then
  ctx=(--context "$CONTEXT")
  [ -n "$CHUNK" ] && ctx+=(--chunk-tokens "$CHUNK")
  run_pair _ctx "${ctx[@]}" -- "${ctx[@]}" "$@"
fi
exit $status
