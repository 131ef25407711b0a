// A CPU emulation of the HIP subset some kernels-hip files use, for testing their logic on
// a machine without an AMD GPU (run.sh). Blocks run one at a time, each thread of a block
// a std::thread; __syncthreads is a std::barrier; __shared__ variables are statics (one
// block at a time); atomics are std::atomic_ref. Waves are one lane wide (warpSize = 1:
// the kernels assume no wave size, so every wave-level loop and reduction still runs, with
// one lane). What it does not show: wave-level behaviour, memory model, speed.
#pragma once
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>
struct emu_dim { unsigned x, y, z; };
inline thread_local emu_dim threadIdx, blockIdx;
inline emu_dim blockDim, gridDim;
inline int warpSize = 1;
inline std::barrier<>* emu_bar;
inline float emu_dyn_smem[1 << 16];
inline void __syncthreads() { emu_bar->arrive_and_wait(); }
#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __shared__ static
inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
template <typename T> T __shfl_xor(T v, int) { return v; }
template <typename T> T atomicAdd(T* p, T v) { return std::atomic_ref<T>(*p).fetch_add(v); }
inline void emu_launch(unsigned grid, unsigned block, const std::function<void()>& k) {
  blockDim = {block, 1, 1};
  gridDim = {grid, 1, 1};
  for (unsigned b = 0; b < grid; ++b) {
    std::barrier<> bar(block);
    emu_bar = &bar;
    std::vector<std::thread> ts;
    for (unsigned t = 0; t < block; ++t)
      ts.emplace_back([&, b, t] { blockIdx = {b, 0, 0}; threadIdx = {t, 0, 0}; k(); });
    for (auto& t : ts) t.join();
  }
}
