#!/usr/bin/env bash
# On the development machine (the GPU machine has no Rust toolchain): builds the release
# binaries a device call runs and copies them, stripped, to $DEST (default .dev/bin, ignored by
# .gitignore; name it in the call's carry): xtask, vt-mla, and the vt-cuda test binaries named in
# TESTS (default: the decode suites and the sparse suite, which share the decode dispatch), and
# into $DEST2 (default .dev/bin2) the block's CUDA tests named in BLOCK_TESTS. Then
# tools/device/warm_kernels.sh compiles the CUDA modules (and the lab builds' decode module)
# into .dev/kcache.tar.xz (carry it too; WARM=0 skips this).
# Usage (in the repository root): bash tools/device/stage.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=${DEST:-.dev/bin}
TESTS=${TESTS:-"mla_decode_fp8 mla_decode_attention sparse_mla"}
DEST2=${DEST2:-.dev/bin2}
BLOCK_TESTS=${BLOCK_TESTS-"cuda_graph cuda_graph_fp8 golden golden_fp8 decode_fusions fp8_absorbed"}
mkdir -p "$DEST"
cargo build --release -p xtask -p vt-mla
cp target/release/xtask target/release/vt-mla "$DEST/"
# stage_tests PACKAGE DIR TEST...: the package's release test binaries, stripped, into DIR by
# name (they carry a hash in their file name: take the paths cargo reports).
stage_tests() {
  local pkg=$1 dir=$2 args=()
  shift 2
  for t in "$@"; do args+=(--test "$t"); done
  mkdir -p "$dir"
  cargo test --release -p "$pkg" "${args[@]}" --no-run --message-format=json 2>/dev/null \
    | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test") and m.get("executable"):
        print(m["target"]["name"], m["executable"])' \
    | while read -r name exe; do cp "$exe" "$dir/$name"; done
  strip "$dir"/*
  ls -l "$dir"
  du -sh "$dir"
}
# shellcheck disable=SC2086
stage_tests vt-cuda "$DEST" $TESTS
# The block's CUDA tests (pending_first_call.sh runs them with MLA_TEST_DEVICE=cuda from $BIN2);
# BLOCK_TESTS="" skips them.
# shellcheck disable=SC2086
[ -n "$BLOCK_TESTS" ] && stage_tests mla-block "$DEST2" $BLOCK_TESTS
if [ "${WARM:-1}" != 0 ]; then
  bash tools/device/warm_kernels.sh
fi
