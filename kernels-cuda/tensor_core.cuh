// Shared-memory, async-copy and tensor-core primitives of the attention kernels
// (mla_decode_attention/, prefill_attention/sm80.cuh, prefill_attention/sm90.cuh), in
// namespace vt::tc. Included after common.cuh. Hopper-only pieces are guarded by the
// architecture that has them: mbarriers, the TMA and proxy fences by sm_90, wgmma by sm_90a.
#pragma once

namespace vt {
namespace tc {

// NVRTC has no <cstdint>.
using uint32_t = unsigned int;
using uint64_t = unsigned long long;

__device__ __forceinline__ uint32_t smem_u32(const void* ptr) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

// Byte offset of 16-byte chunk c (0..7) of row r in a block of 128-byte rows, with the
// 128-byte swizzle (chunk ^= row % 8): conflict-free for ldmatrix and exactly wgmma's and
// the TMA's SWIZZLE_128B layout (block base 1024-byte aligned).
__device__ __forceinline__ uint32_t swz(int r, int c) { return (uint32_t)(r * 128 + ((c ^ (r & 7)) << 4)); }

// 16 bytes global -> shared; src-size 0 reads nothing and fills 16 zero bytes.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
}
// 8 bytes global -> shared (both 8-byte aligned); src-size 0 fills 8 zero bytes.
__device__ __forceinline__ void cp_async8(uint32_t dst, const void* src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 8 : 0)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// 16 bytes from shared memory into registers. Volatile (issued where written, so a kernel can
// place its fragment reads ahead of the MMAs that use them) and without a memory clobber.
__device__ __forceinline__ uint4 lds128(uint32_t addr) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
    return v;
}

__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t (&r)[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x2(uint32_t addr, uint32_t (&r)[2]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t addr, uint32_t (&r)[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
// Four 8x8 16-bit matrices from mma / wgmma accumulator fragments (register m: this lane's
// pair of matrix m, row lane / 4, columns 2 (lane % 4), + 1), each stored TRANSPOSED: lanes
// 8 m .. 8 m + 7 give the addresses of matrix m's 16-byte memory rows (its columns).
__device__ __forceinline__ void stsm_x4_t(uint32_t addr, const uint32_t (&r)[4]) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]),
                 "r"(r[1]), "r"(r[2]), "r"(r[3])
                 : "memory");
}
// Four 8x8 16-bit matrices from mma / wgmma accumulator fragments (register m: this lane's
// pair of matrix m, row lane / 4, columns 2 (lane % 4), + 1), stored as they are: lanes
// 8 m .. 8 m + 7 give the addresses of matrix m's 16-byte rows.
__device__ __forceinline__ void stsm_x4(uint32_t addr, const uint32_t (&r)[4]) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]), "r"(r[1]),
                 "r"(r[2]), "r"(r[3])
                 : "memory");
}
__device__ __forceinline__ void st_shared_u32(uint32_t addr, uint32_t v) {
    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ void st_shared_v4_zero(uint32_t addr) {
    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(addr), "r"(0) : "memory");
}

// 2^x on the SFU; exp2(-inf) = +0.
__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// One row's online-softmax step in the log2 domain: tm is the tile's raw maximum of the row
// (reduced over every lane and warp holding part of it), c = scale x log2(e). Moves the running
// maximum m, rescales the running sum l by the returned alpha, and returns the exponent base: the
// new maximum, or 0 while the row has seen no key (its weights are then exp2(-inf) = 0, not NaN).
// Shared by the attention kernels' softmax steps (decode and prefill).
__device__ __forceinline__ float online_max_step(float tm, float c, float& m, float& l, float& alpha) {
    const float mn = fmaxf(m, tm * c);
    const float muse = mn == vt::neg_inf() ? 0.0f : mn;
    alpha = ex2(m - muse);
    m = mn;
    l *= alpha;
    return muse;
}

// Two values rounded to a 16-bit type, packed low-first into 32 bits.
template <typename T> __device__ __forceinline__ uint32_t pack2(float x, float y);
template <> __device__ __forceinline__ uint32_t pack2<bf16>(float x, float y) {
    __nv_bfloat162 v = __floats2bfloat162_rn(x, y);
    return *reinterpret_cast<uint32_t*>(&v);
}
template <> __device__ __forceinline__ uint32_t pack2<f16>(float x, float y) {
    __half2 v = __floats2half2_rn(x, y);
    return *reinterpret_cast<uint32_t*>(&v);
}

// mma.sync m16n8k16 with f32 accumulation (sm_80+): C += A B, A and B fragments as
// ldmatrix loads them.
template <typename T> struct MmaSync;
template <> struct MmaSync<bf16> {
    static __device__ __forceinline__ void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};
template <> struct MmaSync<f16> {
    static __device__ __forceinline__ void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

// Named barriers (ids 1..15; 0 is __syncthreads): `n` threads, a multiple of 32.
__device__ __forceinline__ void bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id, int n) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

// Keep the compiler from moving register accesses across asynchronous tensor-core issue / wait.
template <int N> __device__ __forceinline__ void pin(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int N> __device__ __forceinline__ void pin(uint32_t (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+r"(d[i])::"memory");
}

// A CUtensorMap (128 bytes, 64-byte aligned), encoded on the host (vt-cuda's launch layer).
struct alignas(64) TmaMap {
    unsigned long long opaque[16];
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// Orders this thread's generic-proxy shared-memory accesses before later async-proxy ones
// (wgmma operand reads, TMA writes).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Makes the barrier's current phase also wait for this thread's earlier cp.async copies: the
// pending count is raised now and lowered when they have landed, so the barrier's count is of
// the threads' own arrivals (mbar_arrive after this), which publish their earlier stores too.
__device__ __forceinline__ void mbar_track_cp_async(uint32_t bar) {
    asm volatile("cp.async.mbarrier.arrive.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// Whether the phase of parity `parity` of the barrier has completed, without waiting.
__device__ __forceinline__ bool mbar_test(uint32_t bar, int parity) {
    uint32_t done;
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
    return done != 0;
}
// One arrival that also expects `bytes` of copy-engine traffic on this phase.
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// Waits until the phase of parity `parity` of the barrier has completed. CLUSTER: acquire at
// cluster scope (the form PTX's st.async examples wait with; an L1 invalidation per wait), a lab
// switch of the CTA-pair kernel; by default the CTA scope.
template <bool CLUSTER = false>
__device__ __forceinline__ void mbar_wait(uint32_t bar, int parity) {
    uint32_t done;
    do {
        if constexpr (CLUSTER) {
            asm volatile(
                "{\n.reg .pred p;\nmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
                "selp.u32 %0, 1, 0, p;\n}\n"
                : "=r"(done)
                : "r"(bar), "r"(parity)
                : "memory");
        } else {
            asm volatile(
                "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                : "=r"(done)
                : "r"(bar), "r"(parity)
                : "memory");
        }
    } while (!done);
}

// One box of `map` at coordinates (c0, c1, c2) into shared memory at dst; its bytes
// complete on the mbarrier `bar`. Coordinates outside the map read zeros.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const TmaMap* map, int c0, int c1, int c2, uint32_t bar) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
        "[%5];\n" ::"r"(dst),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
        : "memory");
}
// `bytes` (a multiple of 16) from global src to shared dst (both 16-byte aligned) by the copy
// engine; the bytes complete on the mbarrier `bar`.
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}
__device__ __forceinline__ void prefetch_map(const TmaMap* map) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// Thread-block clusters (distributed shared memory). A shared::cluster address is 32 bits;
// mapa turns a shared::cta address of this CTA into the same offset in CTA `rank` of the
// cluster.
__device__ __forceinline__ uint32_t cluster_ctarank() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}
__device__ __forceinline__ uint32_t mapa_shared(uint32_t addr, uint32_t rank) {
    uint32_t d;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(d) : "r"(addr), "r"(rank));
    return d;
}
// 16 bytes into (another CTA's) shared memory at the shared::cluster address `dst`; the
// store completes 16 bytes of transactions on the mbarrier `bar` (in the CTA `dst` is in).
__device__ __forceinline__ void st_async_v4(uint32_t dst, const uint32_t (&v)[4], uint32_t bar) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];\n" ::"r"(dst),
                 "r"(v[0]), "r"(v[1]), "r"(v[2]), "r"(v[3]), "r"(bar)
                 : "memory");
}
// One arrival on an mbarrier of any CTA of the cluster (a shared::cluster address). The
// default semantics (release at CTA scope), as CUTLASS's cluster barriers: the kernels use it
// to hand over shared memory whose reads are complete (wgmma waited, copy-out loads returned);
// .release.cluster costs a MEMBAR.GPU that waits for the thread's global stores too.
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Makes this thread's mbarrier.init visible to the other CTAs of the cluster (before the
// cluster barrier that lets them arrive).
__device__ __forceinline__ void fence_mbar_init_cluster() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// Every thread of every CTA of the cluster (a warp's threads together).
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
#endif  // sm_90

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Shared-memory matrix descriptor, 128-byte swizzle. `lbo`/`sbo` in bytes. The start
// address field counts 16-byte units, so a byte offset o inside the window is added as o/16.
__device__ __forceinline__ uint64_t gmma_desc(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
    uint64_t d = (uint64_t)((saddr & 0x3FFFF) >> 4);
    d |= (uint64_t)((lbo >> 4) & 0x3FFF) << 16;
    d |= (uint64_t)((sbo >> 4) & 0x3FFF) << 32;
    d |= (uint64_t)1 << 62;
    return d;
}
// The same descriptor kept as its two words, so that a k step's offset is one 32-bit add on
// the low word (the 14-bit address field cannot carry into the high word: shared memory ends
// below 256 KB). Built from a uniform address, both words stay in uniform registers and the
// high word is a constant: no 64-bit adds and no moves into uniform registers between wgmma.
struct GmmaDesc {
    uint32_t lo, hi;
    __device__ __forceinline__ GmmaDesc(uint32_t saddr, uint32_t lbo, uint32_t sbo)
        : lo(((saddr & 0x3FFFF) >> 4) | (((lbo >> 4) & 0x3FFF) << 16)), hi(((sbo >> 4) & 0x3FFF) | (1u << 30)) {}
    // The descriptor of the matrix `off16` 16-byte units further.
    __device__ __forceinline__ uint64_t at(uint32_t off16) const {
        uint64_t d;
        asm("mov.b64 %0, {%1, %2};\n" : "=l"(d) : "r"(lo + off16), "r"(hi));
        return d;
    }
};
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
#endif  // sm_90a

}  // namespace tc
}  // namespace vt
