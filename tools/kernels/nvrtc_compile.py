#!/usr/bin/env python3
"""Compile one CUDA kernel file with NVRTC as vt-cuda does, to an sm_90a cubin, with ptxas's
register and spill report (no GPU needed).

Usage (after `source .ci/kernels-cuda-deps`, which puts libnvrtc on LD_LIBRARY_PATH and the
headers in VT_CUDA_INCLUDE):
    tools/kernels/nvrtc_compile.py kernels-cuda/mla_decode_attention.cu /tmp/out [-DNAME=1 ...]
writes /tmp/out.log (NVRTC's log: ptxas -v lines per entry) and /tmp/out.cubin (for nvdisasm).
--overlay DIR puts DIR's headers ahead of kernels-cuda/ (a lab copy of a header).
"""
import argparse
import ctypes
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("source")
    ap.add_argument("out")
    ap.add_argument("--overlay", default="")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("defines", nargs="*")
    a = ap.parse_args()
    lib = ctypes.CDLL("libnvrtc.so.13")
    src = open(a.source, "rb").read()
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), src, os.path.basename(a.source).encode(), 0, None, None):
        sys.exit("nvrtcCreateProgram failed")
    incs = [d for d in [a.overlay, os.path.join(ROOT, "kernels-cuda")] if d]
    incs += [d for d in os.environ.get("VT_CUDA_INCLUDE", "").split(":") if d]
    opts = ["--std=c++17", "--generate-line-info", "-DVT_NVRTC=1", f"--gpu-architecture={a.arch}",
            "--ptxas-options=-v"] + [f"--include-path={d}" for d in incs] + a.defines
    arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
    n = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetProgramLog(prog, log)
    open(a.out + ".log", "wb").write(log.value)
    if rc:
        sys.stdout.write(log.value.decode(errors="replace")[-6000:])
        sys.exit(f"compile failed ({rc})")
    lib.nvrtcGetCUBINSize(prog, ctypes.byref(n))
    cubin = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetCUBIN(prog, cubin)
    open(a.out + ".cubin", "wb").write(cubin.raw)
    print(f"ok: {a.out}.cubin ({n.value} bytes), log {a.out}.log")


if __name__ == "__main__":
    main()
