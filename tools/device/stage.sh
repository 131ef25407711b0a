#!/usr/bin/env bash
# On the development machine (the GPU machine has no Rust toolchain): builds the release
# binaries a device call runs and copies them, stripped, to $DEST (default .dev/bin, ignored by
# .gitignore; name it in the call's carry): xtask, vt-mla, and the vt-cuda test binaries named in
# TESTS (default: the decode suites and the sparse suite, which share the decode dispatch). Then
# tools/device/warm_kernels.sh compiles the CUDA modules (and the lab builds' decode module)
# into .dev/kcache.tar.xz (carry it too; WARM=0 skips this).
# Usage (in the repository root): bash tools/device/stage.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=${DEST:-.dev/bin}
TESTS=${TESTS:-"mla_decode_fp8 mla_decode_attention sparse_mla"}
mkdir -p "$DEST"
cargo build --release -p xtask -p vt-mla
cp target/release/xtask target/release/vt-mla "$DEST/"
args=()
for t in $TESTS; do args+=(--test "$t"); done
# Test binaries carry a hash in their file name: take the paths cargo reports.
cargo test --release -p vt-cuda "${args[@]}" --no-run --message-format=json 2>/dev/null \
  | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test") and m.get("executable"):
        print(m["target"]["name"], m["executable"])' \
  | while read -r name exe; do cp "$exe" "$DEST/$name"; done
strip "$DEST"/*
ls -l "$DEST"
du -sh "$DEST"
if [ "${WARM:-1}" != 0 ]; then
  bash tools/device/warm_kernels.sh
fi
