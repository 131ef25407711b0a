// PrefillAttention: the argument block of the tensor-core kernels (sm80.cuh, sm90.cuh),
// passed by value as their only parameter. Must match `Params` in
// crates/vt-cuda/src/prefill_attention/mod.rs field for field.
#pragma once
// Included by prefill_attention.cu after common.cuh (in-memory headers resolve by name).

namespace pf {

// NVRTC has no <cstdint>.
using uint32_t = unsigned int;
using uint64_t = unsigned long long;
using uintptr_t = unsigned long long;

struct Params {
    const void* q;    // [Tq, N, D]   element (0, 0, 0); strides q_st (token), q_sh (head)
    const void* k;    // [Tk, N, D]
    const void* v;    // [Tk, N, Dv]
    void* out;        // [Tq, N, Dv]
    float* lse;       // [N, Tq] f32 (natural log) or null
    const int* cuq;   // [B + 1] query offsets, stride cuq_s
    const int* cuk;   // [B + 1] key offsets, stride cuk_s
    i64 q_st, q_sh, k_st, k_sh, v_st, v_sh, o_st, o_sh, l_sh, l_st;
    i64 cuq_s, cuk_s;
    i64 tq_total, tk_total;  // Tq, Tk: sequence bounds read on the device are checked against them
    int n_heads;
    int n_seqs;
    int q_tiles;     // grid.x: query tiles of max_seqlen_q
    int causal;      // bottom-right: query i of a sequence sees keys 0 ..= lk - lq + i
    float scale_log2;  // softmax scale * log2(e)
    int d;             // qk head dim
    int dv;            // v head dim
    int order;         // sm90: 0 grid (q tiles, heads, seqs); 1 grid (heads, q tiles, seqs)
};

// One sequence's bounds, read and checked on the device. `ok` is false for bounds that are
// negative, decreasing or past Tq / Tk: such a sequence is skipped (nothing is written).
struct Seq {
    i64 qb, kb;
    int lq, lk;
    bool ok;
};

__device__ __forceinline__ Seq load_seq(const Params& p, int b) {
    const i64 qb = p.cuq[b * p.cuq_s], qe = p.cuq[(b + 1) * p.cuq_s];
    const i64 kb = p.cuk[b * p.cuk_s], ke = p.cuk[(b + 1) * p.cuk_s];
    Seq s;
    s.ok = qb >= 0 && qe >= qb && qe <= p.tq_total && kb >= 0 && ke >= kb && ke <= p.tk_total;
    s.qb = qb;
    s.kb = kb;
    s.lq = s.ok ? (int)(qe - qb) : 0;
    s.lk = s.ok ? (int)(ke - kb) : 0;
    return s;
}

// Keys [0, key_end) are visible to at least one of the query rows [r0, r1) of a sequence
// (r1 > r0, rows clipped to lq by the caller).
__device__ __forceinline__ int key_end(const Params& p, const Seq& s, int r1) {
    if (!p.causal) return s.lk;
    const i64 e = (i64)s.lk - s.lq + r1;  // last row r1 - 1 sees keys ..= lk - lq + r1 - 1
    return (int)max((i64)0, min((i64)s.lk, e));
}

// Both kernels' softmax rows: a thread holds rows g and g + 8 ([hi]) of its warp's
// accumulators, each row spread over one quad of lanes.

// The online-softmax step of one tile (vt::tc::online_max_step) from this thread's row maxima
// mx, reduced over the quad first: muse, what the exponents subtract; alpha, O's rescale.
__device__ __forceinline__ void quad_max_step(float (&mx)[2], float c, float (&m_run)[2], float (&l_run)[2],
                                              float (&alpha)[2], float (&muse)[2]) {
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
        mx[hi] = fmaxf(mx[hi], __shfl_xor_sync(0xffffffffu, mx[hi], 1));
        mx[hi] = fmaxf(mx[hi], __shfl_xor_sync(0xffffffffu, mx[hi], 2));
        muse[hi] = vt::tc::online_max_step(mx[hi], c, m_run[hi], l_run[hi], alpha[hi]);
    }
}

// The epilogue's row sums: l_run summed over the quad, and inv = 1 / l (0 for an empty row).
__device__ __forceinline__ void quad_row_sums(float (&l_run)[2], float (&inv)[2]) {
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
        float l = l_run[hi];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        l_run[hi] = l;
        inv[hi] = l > 0.0f ? 1.0f / l : 0.0f;
    }
}

}  // namespace pf
