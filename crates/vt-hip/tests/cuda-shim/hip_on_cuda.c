// A stand-in for libamdhip64.so and librocblas.so on an NVIDIA machine, for testing only.
//
// There is no AMD GPU anywhere this project runs. This library implements the ~30 HIP,
// hiprtc and rocBLAS functions vt-hip loads (crates/vt-hip/src/sys.rs) on top of the CUDA
// driver, NVRTC and cuBLAS, so that vt-hip's whole host path (probe, allocation, copies,
// run-time compilation of kernels-hip/*.hip, module loading, launches with packed
// arguments, rocBLAS GEMM calls) and the HIP kernels' arithmetic run on a real GPU and can
// be checked against the CPU reference by `cargo xtask parity --backend hip`.
//
// What it does not show: anything specific to AMD hardware or ROCm (64-wide wavefronts run
// here as 32-wide warps, hiprtc/comgr, rocBLAS itself). See docs/backends.md (HIP).
//
// Build: gcc -shared -fPIC -O2 -o libamdhip64.so hip_on_cuda.c -ldl (no CUDA headers needed:
// the few CUDA declarations are below, and the CUDA libraries are opened with dlopen).
// Use: ROCM_PATH=DIR where DIR/lib holds this file as libamdhip64.so (and, for the rocBLAS
// path, also as librocblas.so). Kernels compile with NVRTC for the current device; headers
// from $VT_SHIM_CUDA_INCLUDE (default /usr/local/cuda/include and its cccl/).

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef void* CUcontext;
typedef void* CUstream;
typedef void* CUmodule;
typedef void* CUfunction;
typedef unsigned long long CUdeviceptr;
typedef void* nvrtcProgram;
typedef int nvrtcResult;
typedef void* cublasHandle_t;

static CUresult (*cuInit)(unsigned);
static CUresult (*cuDeviceGetCount)(int*);
static CUresult (*cuDeviceGet)(CUdevice*, int);
static CUresult (*cuDeviceGetName)(char*, int, CUdevice);
static CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice);
static CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
static CUresult (*cuCtxSetCurrent)(CUcontext);
static CUresult (*cuCtxGetCurrent)(CUcontext*);
static CUresult (*cuMemAlloc)(CUdeviceptr*, size_t);
static CUresult (*cuMemFree)(CUdeviceptr);
static CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void*, size_t, CUstream);
static CUresult (*cuMemcpyDtoHAsync)(void*, CUdeviceptr, size_t, CUstream);
static CUresult (*cuStreamCreate)(CUstream*, unsigned);
static CUresult (*cuStreamDestroy)(CUstream);
static CUresult (*cuStreamSynchronize)(CUstream);
static CUresult (*cuModuleLoadData)(CUmodule*, const void*);
static CUresult (*cuModuleUnload)(CUmodule);
static CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
static CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                  CUstream, void**, void**);
static CUresult (*cuGetErrorName)(CUresult, const char**);

static nvrtcResult (*nvrtcVersion)(int*, int*);
static const char* (*nvrtcGetErrorString)(nvrtcResult);
static nvrtcResult (*nvrtcCreateProgram)(nvrtcProgram*, const char*, const char*, int, const char* const*,
                                         const char* const*);
static nvrtcResult (*nvrtcCompileProgram)(nvrtcProgram, int, const char* const*);
static nvrtcResult (*nvrtcDestroyProgram)(nvrtcProgram*);
static nvrtcResult (*nvrtcGetProgramLogSize)(nvrtcProgram, size_t*);
static nvrtcResult (*nvrtcGetProgramLog)(nvrtcProgram, char*);
static nvrtcResult (*nvrtcGetCUBINSize)(nvrtcProgram, size_t*);
static nvrtcResult (*nvrtcGetCUBIN)(nvrtcProgram, char*);

static int (*cublasCreate)(cublasHandle_t*);
static int (*cublasDestroy)(cublasHandle_t);
static int (*cublasSetStream)(cublasHandle_t, CUstream);
static int (*cublasGemmStridedBatchedEx)(cublasHandle_t, int, int, int, int, int, const void*, const void*, int, int,
                                         long long, const void*, int, int, long long, const void*, void*, int, int,
                                         long long, int, int, int);

#define MAX_DEVICES 16
static CUcontext contexts[MAX_DEVICES];
static int device_count = -1;

static void* open_any(const char* const* names) {
  for (; *names; ++names) {
    void* h = dlopen(*names, RTLD_NOW | RTLD_GLOBAL);
    if (h) return h;
  }
  return NULL;
}

#define SYM(lib, var, name)                                        \
  do {                                                             \
    *(void**)(&var) = dlsym(lib, name);                            \
    if (!var) {                                                    \
      fprintf(stderr, "hip_on_cuda: %s missing\n", name);         \
      return 1;                                                    \
    }                                                              \
  } while (0)

// Opens the CUDA libraries once; 0 on success.
static int load(void) {
  static int state = -1;
  if (state >= 0) return state;
  state = 1;
  const char* cuda_names[] = {"libcuda.so.1", "libcuda.so", NULL};
  const char* nvrtc_names[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so", NULL};
  const char* cublas_names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so", NULL};
  void* cu = open_any(cuda_names);
  void* rtc = open_any(nvrtc_names);
  void* blas = open_any(cublas_names);
  if (!cu || !rtc || !blas) {
    fprintf(stderr, "hip_on_cuda: cannot open libcuda/libnvrtc/libcublas\n");
    return state;
  }
  SYM(cu, cuInit, "cuInit");
  SYM(cu, cuDeviceGetCount, "cuDeviceGetCount");
  SYM(cu, cuDeviceGet, "cuDeviceGet");
  SYM(cu, cuDeviceGetName, "cuDeviceGetName");
  SYM(cu, cuDeviceGetAttribute, "cuDeviceGetAttribute");
  SYM(cu, cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
  SYM(cu, cuCtxSetCurrent, "cuCtxSetCurrent");
  SYM(cu, cuCtxGetCurrent, "cuCtxGetCurrent");
  SYM(cu, cuMemAlloc, "cuMemAlloc_v2");
  SYM(cu, cuMemFree, "cuMemFree_v2");
  SYM(cu, cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2");
  SYM(cu, cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2");
  SYM(cu, cuStreamCreate, "cuStreamCreate");
  SYM(cu, cuStreamDestroy, "cuStreamDestroy_v2");
  SYM(cu, cuStreamSynchronize, "cuStreamSynchronize");
  SYM(cu, cuModuleLoadData, "cuModuleLoadData");
  SYM(cu, cuModuleUnload, "cuModuleUnload");
  SYM(cu, cuModuleGetFunction, "cuModuleGetFunction");
  SYM(cu, cuLaunchKernel, "cuLaunchKernel");
  SYM(cu, cuGetErrorName, "cuGetErrorName");
  SYM(rtc, nvrtcVersion, "nvrtcVersion");
  SYM(rtc, nvrtcGetErrorString, "nvrtcGetErrorString");
  SYM(rtc, nvrtcCreateProgram, "nvrtcCreateProgram");
  SYM(rtc, nvrtcCompileProgram, "nvrtcCompileProgram");
  SYM(rtc, nvrtcDestroyProgram, "nvrtcDestroyProgram");
  SYM(rtc, nvrtcGetProgramLogSize, "nvrtcGetProgramLogSize");
  SYM(rtc, nvrtcGetProgramLog, "nvrtcGetProgramLog");
  SYM(rtc, nvrtcGetCUBINSize, "nvrtcGetCUBINSize");
  SYM(rtc, nvrtcGetCUBIN, "nvrtcGetCUBIN");
  SYM(blas, cublasCreate, "cublasCreate_v2");
  SYM(blas, cublasDestroy, "cublasDestroy_v2");
  SYM(blas, cublasSetStream, "cublasSetStream_v2");
  SYM(blas, cublasGemmStridedBatchedEx, "cublasGemmStridedBatchedEx");
  state = 0;
  return state;
}

// Makes some context current on this thread (HIP has an implicit one per device).
static void ensure_context(void) {
  CUcontext c = NULL;
  cuCtxGetCurrent(&c);
  if (!c && device_count > 0) cuCtxSetCurrent(contexts[0]);
}

// ---- HIP runtime ----------------------------------------------------------------------

int hipInit(unsigned flags) {
  if (load()) return 100;
  CUresult r = cuInit(flags);
  if (r) return r;
  int n = 0;
  r = cuDeviceGetCount(&n);
  if (r) return r;
  device_count = n < MAX_DEVICES ? n : MAX_DEVICES;
  for (int i = 0; i < device_count; ++i) {
    CUdevice d;
    cuDeviceGet(&d, i);
    r = cuDevicePrimaryCtxRetain(&contexts[i], d);
    if (r) return r;
  }
  if (device_count > 0) cuCtxSetCurrent(contexts[0]);
  return 0;
}

int hipGetDeviceCount(int* n) {
  if (device_count < 0) {
    int r = hipInit(0);
    if (r) return r;
  }
  *n = device_count;
  return device_count > 0 ? 0 : 100;
}

// Fills the fields of hipDeviceProp_tR0000 that vt-hip reads (offsets as in sys.rs).
int hipGetDeviceProperties(void* prop, int ordinal) {
  if (ordinal < 0 || ordinal >= device_count) return 101;
  char* p = (char*)prop;
  memset(p, 0, 792);
  CUdevice d;
  cuDeviceGet(&d, ordinal);
  cuDeviceGetName(p, 255, d);
  int v = 0;
  cuDeviceGetAttribute(&v, 8, d);  // max shared memory per block
  *(size_t*)(p + 264) = (size_t)v;
  cuDeviceGetAttribute(&v, 10, d);  // warp size
  *(int*)(p + 276) = v;
  cuDeviceGetAttribute(&v, 16, d);  // multiprocessor count
  *(int*)(p + 336) = v;
  int major = 0, minor = 0;
  cuDeviceGetAttribute(&major, 75, d);
  cuDeviceGetAttribute(&minor, 76, d);
  // vt-hip passes this to hiprtc as --offload-arch; the hiprtc below compiles for the
  // current device whatever it says.
  snprintf(p + 396, 256, "gfx-on-cuda-sm_%d%d", major, minor);
  return 0;
}

int hipRuntimeGetVersion(int* v) {
  *v = 50221153;  // reads as 5.2.21153, like Debian's ROCm
  return 0;
}

const char* hipGetErrorString(int code) {
  const char* s = "hip_on_cuda: unknown error";
  if (code == 100) return "hipErrorNoDevice";
  if (cuGetErrorName) cuGetErrorName(code, &s);
  return s;
}

int hipSetDevice(int ordinal) {
  if (ordinal < 0 || ordinal >= device_count) return 101;
  return cuCtxSetCurrent(contexts[ordinal]);
}

int hipMalloc(void** p, size_t bytes) {
  ensure_context();
  CUdeviceptr d = 0;
  CUresult r = cuMemAlloc(&d, bytes);
  *p = (void*)d;
  return r;
}

int hipFree(void* p) {
  ensure_context();
  return cuMemFree((CUdeviceptr)p);
}

int hipMemcpyAsync(void* dst, const void* src, size_t bytes, int kind, CUstream s) {
  ensure_context();
  if (kind == 1) return cuMemcpyHtoDAsync((CUdeviceptr)dst, src, bytes, s);
  if (kind == 2) return cuMemcpyDtoHAsync(dst, (CUdeviceptr)src, bytes, s);
  return 1;  // only the two kinds vt-hip uses
}

int hipStreamCreate(CUstream* s) {
  ensure_context();
  return cuStreamCreate(s, 0);
}
int hipStreamDestroy(CUstream s) {
  ensure_context();
  return cuStreamDestroy(s);
}
int hipStreamSynchronize(CUstream s) {
  ensure_context();
  return cuStreamSynchronize(s);
}
int hipModuleLoadData(CUmodule* m, const void* image) {
  ensure_context();
  return cuModuleLoadData(m, image);
}
int hipModuleUnload(CUmodule m) {
  ensure_context();
  return cuModuleUnload(m);
}
int hipModuleGetFunction(CUfunction* f, CUmodule m, const char* name) {
  ensure_context();
  return cuModuleGetFunction(f, m, name);
}
int hipModuleLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                          unsigned shared, CUstream s, void** params, void** extra) {
  ensure_context();
  return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, s, params, extra);
}

// ---- hiprtc over NVRTC ----------------------------------------------------------------

// What HIP provides and CUDA spells differently. Every lane of a warp takes part in the
// shuffles of kernels-hip (the reductions are reached by whole waves).
static const char* PRELUDE =
    "#include <cuda_fp16.h>\n"
    "#define _Float16 __half\n"
    "#define __shfl_xor(v, o) __shfl_xor_sync(0xffffffffu, (v), (o))\n"
    "#line 1\n";

int hiprtcVersion(int* major, int* minor) {
  if (load()) return 1;
  return nvrtcVersion(major, minor);
}
const char* hiprtcGetErrorString(int r) { return nvrtcGetErrorString ? nvrtcGetErrorString(r) : "?"; }

int hiprtcCreateProgram(nvrtcProgram* prog, const char* src, const char* name, int n, const char* const* headers,
                        const char* const* names) {
  if (load()) return 1;
  size_t len = strlen(PRELUDE) + strlen(src) + 1;
  char* full = (char*)malloc(len);
  snprintf(full, len, "%s%s", PRELUDE, src);
  int r = nvrtcCreateProgram(prog, full, name, n, headers, names);
  free(full);
  return r;
}

int hiprtcCompileProgram(nvrtcProgram prog, int n, const char* const* opts) {
  const char* out[64];
  char arch[64], inc1[512], inc2[512];
  int k = 0;
  CUdevice d;
  CUcontext c = NULL;
  cuCtxGetCurrent(&c);
  int major = 9, minor = 0;
  if (c && cuDeviceGet(&d, 0) == 0) {
    cuDeviceGetAttribute(&major, 75, d);
    cuDeviceGetAttribute(&minor, 76, d);
  }
  snprintf(arch, sizeof arch, "--gpu-architecture=sm_%d%d", major, minor);
  const char* inc = getenv("VT_SHIM_CUDA_INCLUDE");
  if (!inc) inc = "/usr/local/cuda/include";
  snprintf(inc1, sizeof inc1, "--include-path=%s", inc);
  snprintf(inc2, sizeof inc2, "--include-path=%s/cccl", inc);
  out[k++] = arch;
  out[k++] = inc1;
  out[k++] = inc2;
  for (int i = 0; i < n && k < 60; ++i) {
    if (strncmp(opts[i], "--offload-arch=", 15) == 0 || strcmp(opts[i], "-O3") == 0) continue;
    if (strcmp(opts[i], "-ffp-contract=off") == 0) {
      out[k++] = "--fmad=false";
    } else if (strcmp(opts[i], "-std=c++17") == 0) {
      out[k++] = "--std=c++17";
    } else {
      out[k++] = opts[i];
    }
  }
  return nvrtcCompileProgram(prog, k, out);
}

int hiprtcDestroyProgram(nvrtcProgram* prog) { return nvrtcDestroyProgram(prog); }
int hiprtcGetProgramLogSize(nvrtcProgram p, size_t* n) { return nvrtcGetProgramLogSize(p, n); }
int hiprtcGetProgramLog(nvrtcProgram p, char* log) { return nvrtcGetProgramLog(p, log); }
int hiprtcGetCodeSize(nvrtcProgram p, size_t* n) { return nvrtcGetCUBINSize(p, n); }
int hiprtcGetCode(nvrtcProgram p, char* code) { return nvrtcGetCUBIN(p, code); }

// ---- rocBLAS over cuBLAS --------------------------------------------------------------

int rocblas_create_handle(cublasHandle_t* h) {
  if (load()) return 6;
  ensure_context();
  return cublasCreate(h) ? 6 : 0;
}
int rocblas_destroy_handle(cublasHandle_t h) { return cublasDestroy(h) ? 6 : 0; }
int rocblas_set_stream(cublasHandle_t h, CUstream s) { return cublasSetStream(h, s) ? 6 : 0; }
const char* rocblas_status_to_string(int s) { return s == 0 ? "rocblas_status_success" : "hip_on_cuda: cuBLAS error"; }

static int cuda_type(int rocblas_type) {
  switch (rocblas_type) {
    case 150: return 2;   // f16 -> CUDA_R_16F
    case 151: return 0;   // f32 -> CUDA_R_32F
    case 168: return 14;  // bf16 -> CUDA_R_16BF
    default: return -1;
  }
}

int rocblas_gemm_strided_batched_ex(cublasHandle_t h, int ta, int tb, int m, int n, int k, const void* alpha,
                                    const void* a, int a_type, int lda, long long sa, const void* b, int b_type,
                                    int ldb, long long sb, const void* beta, const void* c, int c_type, int ldc,
                                    long long sc, void* d, int d_type, int ldd, long long sd, int batch,
                                    int compute_type, int algo, int solution, unsigned flags) {
  (void)algo;
  (void)solution;
  (void)flags;
  // vt-hip always computes in place (D = C) in f32 with one dtype.
  if (c != d || ldc != ldd || sc != sd || c_type != d_type || a_type != b_type || a_type != c_type ||
      compute_type != 151 || cuda_type(a_type) < 0)
    return 2;  // rocblas_status_not_implemented
  ensure_context();
  int r = cublasGemmStridedBatchedEx(h, ta == 112 ? 1 : 0, tb == 112 ? 1 : 0, m, n, k, alpha, a, cuda_type(a_type),
                                     lda, sa, b, cuda_type(b_type), ldb, sb, beta, d, cuda_type(d_type), ldd, sd,
                                     batch, 68 /* CUBLAS_COMPUTE_32F */, -1 /* CUBLAS_GEMM_DEFAULT */);
  return r ? 6 : 0;
}
