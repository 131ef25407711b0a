#!/usr/bin/env bash
# vt-hip on an NVIDIA GPU through hip_on_cuda.c (a test stand-in for libamdhip64/librocblas,
# see that file). Run from the repository root.
#
#   run.sh build    (on a development machine: gcc + cargo) builds the shim into
#                   target/hip-shim/lib (as libamdhip64.so and librocblas.so) and
#                   target/hip-shim-noblas/lib (libamdhip64.so only), and the release xtask.
#   run.sh parity   (on the GPU machine: libcuda, libnvrtc.so.13, libcublas.so.13, CUDA
#                   headers in /usr/local/cuda/include) runs `xtask parity --backend hip`
#                   with rocBLAS calls going to cuBLAS, then with the kernel-only GEMMs.
set -euo pipefail
case "${1:-}" in
  build)
    for v in hip-shim hip-shim-noblas; do mkdir -p "target/$v/lib"; done
    gcc -shared -fPIC -O2 -Wall -Wextra -o target/hip-shim/lib/libamdhip64.so \
      crates/vt-hip/tests/cuda-shim/hip_on_cuda.c -ldl
    cp target/hip-shim/lib/libamdhip64.so target/hip-shim/lib/librocblas.so
    cp target/hip-shim/lib/libamdhip64.so target/hip-shim-noblas/lib/libamdhip64.so
    cargo build --release -p xtask
    ;;
  parity)
    xtask="${XTASK:-${CARGO_TARGET_DIR:-target}/release/xtask}"
    rc=0
    for v in hip-shim hip-shim-noblas; do
      echo "=== $v"
      ROCM_PATH="$PWD/target/$v" VT_CACHE_DIR="${TMPDIR:-/tmp}/vt-$v" "$xtask" parity --backend hip "${@:2}" || rc=1
    done
    exit $rc
    ;;
  *)
    echo "usage: $0 build | parity [parity options]" >&2
    exit 2
    ;;
esac
