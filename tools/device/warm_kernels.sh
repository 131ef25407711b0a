#!/usr/bin/env bash
# On the development machine (stage.sh runs it): compiles, ahead of a device call, the CUDA
# modules the call would compile with NVRTC on the device (~60 s of device time for the decode
# module alone, per build): every kernel file for sm_90a, plain and in each lab build of
# LAB_BUILDS (tools/device/labs.sh). Packs them into $KCACHE (default
# .dev/kcache.tar.xz, ~3 MB: carry it); lib.sh unpacks it on the device and points VT_CACHE_DIR
# at it. The cache key holds the NVRTC version (the PyPI wheel's 13.0.88 = the device's
# toolkit) and the include paths, so this compiles with the device's, /usr/local/cuda/include
# and its cccl/: /usr/local/cuda here must lead to the wheels' nvidia/cu13 folder.
# Usage (in the repository root): bash tools/device/warm_kernels.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
KCACHE=${KCACHE:-.dev/kcache.tar.xz}
W=${W:-/tmp/vt-warm}
XTASK=${XTASK:-target/release/xtask}
# shellcheck disable=SC1091
source .ci/kernels-cuda-deps  # NVRTC on LD_LIBRARY_PATH
# The default search, /usr/local/cuda/include (+ cccl), as on the device: nothing may point
# elsewhere, and /usr/local/cuda must be the wheels' headers (the key holds the paths, not the
# headers' texts).
unset VT_CUDA_INCLUDE CUDA_HOME CUDA_PATH
WHEELS=$(readlink -f .ci-cache/cuda-wheels/nvidia/cu13)
if [ "$(readlink -f /usr/local/cuda)" != "$WHEELS" ] || [ ! -d /usr/local/cuda/include/cccl ]; then
  echo "warm_kernels: /usr/local/cuda must lead to the wheels' headers: ln -sfn $WHEELS /usr/local/cuda" >&2
  exit 1
fi
source tools/device/labs.sh  # lab_overlay, LAB_BUILDS
rm -rf "$W"
mkdir -p "$W/labs"
"$XTASK" kernels --warm-cache "$W/cache" --sm 90
# The lab builds, every module: a module's key holds every header's text, so an overlay of one
# decode header changes them all. Two builds at a time; a failed compile fails the script.
i=0
pids=()
while read -r header defs; do
  i=$((i + 1))
  # shellcheck disable=SC2086
  lab_overlay "$W/labs/$i" "$header" $defs
  VT_CUDA_KERNELS_DIR="$W/labs/$i" "$XTASK" kernels --warm-cache "$W/cache" --sm 90 \
    | sed "s|^|[$header $defs] |" &
  pids+=($!)
  if [ $((i % 2)) -eq 0 ]; then
    for p in "${pids[@]}"; do wait "$p"; done
    pids=()
  fi
done <<< "$LAB_BUILDS"
for p in "${pids[@]}"; do wait "$p"; done
mkdir -p "$(dirname "$KCACHE")"
# xz -9 (a 64 MiB window) stores the lab builds as near-copies of the default build: 3 MB, not 13.
XZ_OPT=-9 tar -C "$W" -cJf "$KCACHE" cache
echo "warm_kernels: $(ls "$W/cache/cuda" | wc -l) modules, $(du -h "$KCACHE" | cut -f1) in $KCACHE"
