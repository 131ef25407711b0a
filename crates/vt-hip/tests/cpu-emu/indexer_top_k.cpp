// kernels-hip/indexer_top_k.hip (scores, then the radix select and bitonic sort) in the CPU
// emulation (emu.h), against the contract's reference: f32 scores in the CPU reference's
// order, then (score descending, position ascending), -1 past the visible tokens. Random
// cases on coarse value grids (many equal scores, ties across the k-th place), block tables
// with -1 and past-the-cache ids, negative positions, out-of-range sequences, topk above and
// below the visible count, rows in chunks (row0 > 0). Exact comparison. Run by run.sh.
#include "emu.h"
#define VT_HIPRTC 1
#include "indexer_top_k.hip.cpp"
#include <algorithm>
#include <cstdio>
#include <random>
typedef long long ll;
int main() {
  std::mt19937 rng(7);
  int fails = 0, cases = 0;
  int radix = 0, tie_at_k = 0;
  for (int c = 0; c < 46; ++c) {
    const bool big = c >= 40;
    const ll H = 1 + rng() % 4, Di = 1 + rng() % 9, NB = big ? 400 : 2 + rng() % 40, BS = big ? 16 : 1 + rng() % 17;
    const ll B = 1 + rng() % 3, MB = big ? 300 : 1 + rng() % 12, T = 1 + rng() % 6;
    const ll topk = big ? 1 + rng() % 3000 : 1 + rng() % (c % 3 == 0 ? 400 : 40);
    const int grid_vals = 1 + rng() % 4;  // coarse grids make ties
    auto val = [&] { return (float)((int)(rng() % (2 * grid_vals + 1)) - grid_vals) * 0.5f; };
    std::vector<float> q(T * H * Di), w(T * H), cache(NB * BS * Di);
    for (auto& x : q) x = val();
    for (auto& x : w) x = (float)(rng() % 3) * 0.25f;
    for (auto& x : cache) x = val();
    std::vector<int> bt(B * MB), seq(T);
    std::vector<long long> pos(T);
    for (auto& x : bt) x = (rng() % 10 == 0) ? -1 : (rng() % 13 == 0 ? (int)NB + 3 : (int)(rng() % NB));
    const ll cap = MB * BS;
    for (ll t = 0; t < T; ++t) {
      seq[t] = rng() % 11 == 0 ? (int)B + 1 : (int)(rng() % B);
      pos[t] = rng() % 9 == 0 ? -1 : (ll)(rng() % cap);
    }
    const float scale = 0.125f;
    // Workspace as the host lays it out.
    const ll ld = (std::max(cap, 1LL) + 1) / 2 * 2;
    ll m = std::max(std::min(topk, cap), 1LL), items_ld = 1;
    while (items_ld < m) items_ld <<= 1;
    std::vector<u32> ws(T * ld, 0xdeadbeefu);
    std::vector<u64> items(T * items_ld, 0x1234567ull);
    std::vector<int> out(T * topk, 0x7fff0000);
    // Chunks of 4 rows exercise row0.
    for (ll row0 = 0; row0 < T; row0 += 4) {
      const ll rows = std::min(4LL, T - row0);
      emu_launch(std::min<ll>(rows, 3), 256, [&] {  // fewer blocks than rows: grid-stride
        indexer_scores_f32(ws.data(), ld, row0, rows, q.data(), H * Di, Di, w.data(), H, 1, 1, cache.data(),
                           BS * Di, Di, NB, BS, bt.data(), MB, 1, B, seq.data(), 1, pos.data(), 1, 1, cap, H, Di,
                           scale);
      });
      emu_launch(std::min<ll>(rows, 3), 256, [&] {  // fewer blocks than rows: grid-stride
        indexer_select_f32(out.data(), topk, 1, topk, ws.data(), ld, items.data(), items_ld, row0, rows, bt.data(),
                           MB, 1, B, BS, seq.data(), 1, pos.data(), 1, 1, cap);
      });
    }
    // Reference: the CPU reference's semantics.
    for (ll t = 0; t < T; ++t) {
      std::vector<std::tuple<float, ll, ll>> sc;
      const ll b = seq[t], p = pos[t];
      if (p >= 0 && b >= 0 && b < B) {
        for (ll j = 0; j <= p; ++j) {
          const ll blk = bt[b * MB + j / BS];
          if (blk < 0 || blk >= NB) continue;
          const float* k = &cache[(blk * BS + j % BS) * Di];
          float sum = 0;
          for (ll h = 0; h < H; ++h) {
            float dot = 0;
            for (ll i = 0; i < Di; ++i) dot += q[(t * H + h) * Di + i] * k[i];
            sum += w[t * H + h] * std::max(dot, 0.0f);
          }
          sc.emplace_back(scale * sum + 0.0f, j, blk * BS + j % BS);
        }
      }
      std::stable_sort(sc.begin(), sc.end(), [](auto& x, auto& y) {
        return std::get<0>(x) > std::get<0>(y) || (std::get<0>(x) == std::get<0>(y) && std::get<1>(x) < std::get<1>(y));
      });
      if ((ll)sc.size() > topk) {
        ++radix;
        if (std::get<0>(sc[topk - 1]) == std::get<0>(sc[topk])) ++tie_at_k;
      }
      for (ll k = 0; k < topk; ++k) {
        const int want = k < (ll)sc.size() ? (int)std::get<2>(sc[k]) : -1;
        if (out[t * topk + k] != want) {
          if (fails < 10) printf("case %d t %lld k %lld: got %d want %d (n %zu topk %lld)\n", c, t, k, out[t * topk + k], want, sc.size(), topk);
          ++fails;
        }
      }
      ++cases;
    }
  }
  printf("indexer: %d rows (%d through the radix select, %d with a tie across the k-th place), %d mismatches\n", cases, radix, tie_at_k, fails);
  return fails != 0;
}
