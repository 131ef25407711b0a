#!/usr/bin/env bash
# build_deepgemm.sh ARCHIVE.tar.xz DIR (on the GPU machine): unpacks tools/peers/prepare_deepgemm.sh's
# archive into DIR (DIR/deepgemm) and builds DeepGEMM's host module in place, as its develop.sh
# does (cutlass's headers linked into deep_gemm/include, `setup.py build`, the module linked into
# deep_gemm/), so that PYTHONPATH=DIR/deepgemm imports it; its kernels compile at run time with
# /usr/local/cuda's nvcc (JIT). Skipped when already built. Exit status 0 only when
# `import deep_gemm` works; the peer script records any failure per shape either way.
set -euo pipefail
# The archive is named relative to where the script is called from: resolve it before the cd.
archive=$(realpath "$1"); dir=$2
mkdir -p "$dir"
cd "$dir"
if [ ! -d deepgemm ]; then tar xJf "$archive"; fi
cd deepgemm
ok() { PYTHONPATH=$PWD python3 -c "import deep_gemm, sys; print('deep_gemm', deep_gemm.__version__)"; }
if ls deep_gemm/_C*.so >/dev/null 2>&1 && ok; then exit 0; fi
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} MAX_JOBS=${MAX_JOBS:-16}
ln -sfn "$PWD/third-party/cutlass/include/cutlass" deep_gemm/include/cutlass
ln -sfn "$PWD/third-party/cutlass/include/cute" deep_gemm/include/cute
# setup.py imports wheel's bdist_wheel; where `wheel` is missing, setuptools' own serves (a shim
# on PYTHONPATH for this build only).
shim=""
if ! python3 -c "import wheel.bdist_wheel" 2>/dev/null; then
  shim=$(mktemp -d)
  mkdir -p "$shim/wheel"
  echo "" > "$shim/wheel/__init__.py"
  echo "from setuptools.command.bdist_wheel import bdist_wheel" > "$shim/wheel/bdist_wheel.py"
fi
t0=$(date +%s)
PYTHONPATH="$shim${PYTHONPATH:+:$PYTHONPATH}" python3 setup.py build > build.log 2>&1 || { tail -30 build.log; exit 1; }
so=$(find build -name "_C*.so" -type f | head -n 1)
[ -n "$so" ] || { echo "no _C module under build/" >&2; tail -30 build.log; exit 1; }
ln -sfn "$PWD/$so" deep_gemm/
echo "DeepGEMM built in $(( $(date +%s) - t0 )) s"
ok
