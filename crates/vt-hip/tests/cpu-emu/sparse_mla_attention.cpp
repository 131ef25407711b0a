// kernels-hip/sparse_mla_attention.hip (float and fp8_ds_mla caches) in the CPU emulation
// (emu.h) against an f64 softmax over the listed valid slots: -1 and past-the-cache entries
// skipped, repeats counted, rows with no valid slot (out 0, lse -inf), topk over several
// key tiles, lse stored [N, T]. Relative Frobenius error of out and lse error relative to
// max(1, |lse|), both bound 1e-5. Run by run.sh.
#include "emu.h"
#define VT_HIPRTC 1
#include "sparse_mla_attention.hip.cpp"
#include <cstdio>
#include <random>
typedef long long ll;
int main() {
  std::mt19937 rng(11);
  double worst = 0, worst_lse = 0;
  int empty_rows = 0, bad = 0;
  for (int c = 0; c < 24; ++c) {
    const bool fp8 = c % 3 == 2;
    const ll T = 1 + rng() % 4, N = 1 + rng() % 3, D = fp8 ? 576 : 1 + rng() % 40;
    const ll Dv = fp8 ? 512 : 1 + rng() % D, NB = 1 + rng() % 6, BS = 1 + rng() % 9;
    const ll topk = 1 + rng() % 300, slots = NB * BS;
    const ll W = fp8 ? 656 : D;
    std::uniform_real_distribution<float> u(-1, 1);
    std::vector<float> q(T * N * D), cache(NB * BS * W);
    std::vector<unsigned char> bytes(NB * BS * 656);
    for (auto& x : q) x = u(rng);
    for (auto& x : cache) x = u(rng);
    for (ll s = 0; s < NB * BS && fp8; ++s) {
      unsigned char* r = &bytes[s * 656];
      for (int i = 0; i < 512; ++i) { unsigned char b = rng() % 256; if ((b & 0x7f) == 0x7f) b = 0x3c; r[i] = b; }
      for (int g = 0; g < 4; ++g) { float sc = 0.001f + 0.01f * (rng() % 10); memcpy(r + 512 + 4 * g, &sc, 4); }
      for (int i = 0; i < 64; ++i) { float v = u(rng); unsigned b = __float_as_uint(v) >> 16; r[528 + 2 * i] = b & 0xff; r[529 + 2 * i] = b >> 8; }
    }
    std::vector<int> idx(T * topk);
    for (ll t = 0; t < T; ++t) {
      const bool none = rng() % 6 == 0;
      for (ll k = 0; k < topk; ++k) {
        const int r = rng() % 10;
        idx[t * topk + k] = none || r == 0 ? -1 : r == 1 ? (int)(slots + rng() % 5) : (int)(rng() % slots);
      }
    }
    std::vector<float> out(T * N * Dv, NAN), lse(N * T, NAN);
    const float scale = 0.3f;
    emu_launch(std::min<ll>(T * N, 5), 256, [&] {
      if (fp8)
        sparse_mla_attention_fp8_f32(out.data(), N * Dv, Dv, lse.data(), T, 1, q.data(), N * D, D, bytes.data(),
                                     BS * 656, 656, BS, slots, idx.data(), topk, 1, T, N, D, Dv, topk, scale);
      else
        sparse_mla_attention_f32(out.data(), N * Dv, Dv, lse.data(), T, 1, q.data(), N * D, D, cache.data(), BS * D,
                                 D, BS, slots, idx.data(), topk, 1, T, N, D, Dv, topk, scale);
    });
    for (ll t = 0; t < T; ++t)
      for (ll h = 0; h < N; ++h) {
        std::vector<double> logit, o(Dv, 0.0);
        std::vector<ll> ss;
        for (ll k = 0; k < topk; ++k) {
          const ll s = idx[t * topk + k];
          if (s < 0 || s >= slots) continue;
          double dot = 0;
          for (ll i = 0; i < D; ++i) {
            const double kv = fp8 ? vt::fp8ds::value(&bytes[s * 656], i) : cache[s * D + i];
            dot += (double)q[(t * N + h) * D + i] * kv;
          }
          logit.push_back(scale * dot);
          ss.push_back(s);
        }
        double mx = -INFINITY, sum = 0;
        for (double l : logit) mx = std::max(mx, l);
        for (size_t j = 0; j < logit.size(); ++j) {
          const double p = std::exp(logit[j] - mx);
          sum += p;
          for (ll i = 0; i < Dv; ++i) o[i] += p * (fp8 ? vt::fp8ds::value(&bytes[ss[j] * 656], i) : cache[ss[j] * D + i]);
        }
        double num = 0, den = 0;
        for (ll i = 0; i < Dv; ++i) {
          const double want = logit.empty() ? 0.0 : o[i] / sum, got = out[(t * N + h) * Dv + i];
          if (!(got == got)) ++bad;
          num += (got - want) * (got - want);
          den += want * want;
        }
        const double err = std::sqrt(num / std::max(den, 1e-30));
        if (logit.empty()) {
          ++empty_rows;
          if (num != 0 || lse[h * T + t] != -INFINITY) { ++bad; printf("empty row wrong\n"); }
        } else {
          worst = std::max(worst, err);
          const double want_lse = mx + std::log(sum);
          worst_lse = std::max(worst_lse, std::fabs(lse[h * T + t] - want_lse) / std::max(1.0, std::fabs(want_lse)));
        }
      }
  }
  printf("sparse: worst rel Frobenius %.3g, worst lse err %.3g, %d rows without keys, %d bad\n", worst, worst_lse, empty_rows, bad);
  return (bad || worst > 1e-5 || worst_lse > 1e-5);
}
