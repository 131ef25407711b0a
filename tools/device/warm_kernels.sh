#!/usr/bin/env bash
# On the development machine (stage.sh runs it): compiles, ahead of a device call, the CUDA
# modules the call would compile with NVRTC on the device (~60 s of device time for the decode
# module alone, per build): every kernel file for sm_90a, and the decode module of each lab
# build in LAB_BUILDS (tools/device/labs.sh). Packs them into $KCACHE (default
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
unset VT_CUDA_INCLUDE         # the default search: /usr/local/cuda/include (+ cccl), as on the device
if [ ! -f /usr/local/cuda/include/cuda_bf16.h ] || [ ! -d /usr/local/cuda/include/cccl ]; then
  echo "warm_kernels: no /usr/local/cuda/include (with cccl/): ln -sfn $(pwd)/.ci-cache/cuda-wheels/nvidia/cu13 /usr/local/cuda" >&2
  exit 1
fi
source tools/device/labs.sh  # lab_overlay, LAB_BUILDS
rm -rf "$W"
mkdir -p "$W/labs"
"$XTASK" kernels --warm-cache "$W/cache" --sm 90
# The lab builds: only the decode module (the one that takes a minute); two at a time.
i=0
while read -r header defs; do
  i=$((i + 1))
  # shellcheck disable=SC2086
  lab_overlay "$W/labs/$i" "$header" $defs
  VT_CUDA_KERNELS_DIR="$W/labs/$i" "$XTASK" kernels --warm-cache "$W/cache" --sm 90 --file mla_decode_attention \
    | sed "s|^|[$header $defs] |" &
  if [ $((i % 2)) -eq 0 ]; then wait; fi
done <<< "$LAB_BUILDS"
wait
mkdir -p "$(dirname "$KCACHE")"
# xz -9 (a 64 MiB window) stores the lab builds as near-copies of the default build: 3 MB, not 13.
XZ_OPT=-9 tar -C "$W" -cJf "$KCACHE" cache
echo "warm_kernels: $(ls "$W/cache/cuda" | wc -l) modules, $(du -h "$KCACHE" | cut -f1) in $KCACHE"
