// kernels-hip/cache_indexer_keys.hip in the CPU emulation (emu.h): keys copied bit for bit
// into their slots, padding (< 0) and past-the-cache slots skipped, every other cache row
// untouched (NaN-poisoned before). Run by run.sh.
#include "emu.h"
#define VT_HIPRTC 1
#include "cache_indexer_keys.hip.cpp"
#include <cstdio>
#include <random>
typedef long long ll;
int main() {
  std::mt19937 rng(3);
  int bad = 0, written = 0;
  for (int c = 0; c < 20; ++c) {
    const ll T = 1 + rng() % 9, Di = 1 + rng() % 300, NB = 1 + rng() % 5, BS = 1 + rng() % 7, W = Di + rng() % 3;
    std::vector<float> k(T * (Di + 2)), cache(NB * BS * W, NAN);
    for (auto& x : k) x = (float)(rng() % 1000) - 500.0f;
    // Distinct slots (the contract leaves two tokens with one slot unspecified on GPUs).
    std::vector<ll> slots(T), perm(NB * BS + 4);
    for (ll i = 0; i < (ll)perm.size(); ++i) perm[i] = i - 2;
    std::shuffle(perm.begin(), perm.end(), rng);
    for (ll t = 0; t < T; ++t) slots[t] = t < (ll)perm.size() ? perm[t] : -1;
    emu_launch(std::min<ll>(T, 3), 256, [&] {
      cache_indexer_keys_f32(cache.data(), BS * W, W, NB, BS, k.data(), Di + 2, slots.data(), 1, T, Di);
    });
    std::vector<float> want(NB * BS * W, NAN);
    for (ll t = 0; t < T; ++t) {
      const ll s = slots[t];
      if (s < 0 || s >= NB * BS) continue;
      for (ll i = 0; i < Di; ++i) want[s * W + i] = k[t * (Di + 2) + i];
      ++written;
    }
    for (size_t i = 0; i < want.size(); ++i)
      if (memcmp(&want[i], &cache[i], 4) != 0 && !(want[i] != want[i] && cache[i] != cache[i])) ++bad;
  }
  printf("cache_indexer_keys: %d rows written, %d wrong values\n", written, bad);
  return bad != 0;
}
