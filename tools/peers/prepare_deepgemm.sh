#!/usr/bin/env bash
# prepare_deepgemm.sh DEEPGEMM_GIT CUTLASS_GIT FMT_GIT DEST.tar.xz (on the development machine):
# DeepGEMM 54e2261 (deepseek-ai/DeepGEMM, issue 17's fp8 GEMM peer) with its submodules' sources at
# the commits it pins (cutlass f3fde58's headers, fmt 553ec11), as one xz archive (~1.3 MB, where
# the tree is ~29 MB: small enough to carry beside FlashMLA and the binaries). The git dirs come
# from the search tool's `fetch` (github:deepseek-ai/DeepGEMM, github:NVIDIA/cutlass,
# github:fmtlib/fmt). Never commit the archive (keep it under the ignored .peer/).
# Then on the GPU machine: tools/peers/build_deepgemm.sh DEST.tar.xz DIR.
set -euo pipefail
dg=$1; cu=$2; fmt=$3; dest=$4
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/deepgemm/third-party/cutlass" "$tmp/deepgemm/third-party/fmt"
git -C "$dg" archive 54e2261 | tar x -C "$tmp/deepgemm"
# (git may complain about a png outside include/: the header check below is what counts)
git -C "$cu" archive f3fde58372d33e9a5650ba7b80fc48b3b49d40c8 include 2>/dev/null | tar x -C "$tmp/deepgemm/third-party/cutlass"
git -C "$fmt" archive 553ec11ec06fbe0beebfbb45f9dc3c9eabd83d28 include src | tar x -C "$tmp/deepgemm/third-party/fmt"
[ -f "$tmp/deepgemm/third-party/cutlass/include/cutlass/cutlass.h" ] || { echo "cutlass headers missing" >&2; exit 1; }
[ -f "$tmp/deepgemm/setup.py" ] || { echo "DeepGEMM 54e2261 missing from $dg" >&2; exit 1; }
mkdir -p "$(dirname "$dest")"
tar cJf "$dest" -C "$tmp" deepgemm
ls -l "$dest"
