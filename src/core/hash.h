// hash_mix64: the 64-bit finalizer of MurmurHash3 (fmix64), a bijection on uint64 that spreads
// every input bit over the whole output. The tokenizer's integer-keyed tables hash with it; the
// collective tests draw their seeded inputs from it.
#pragma once
#include <cstdint>

namespace strata {

inline uint64_t hash_mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xFF51AFD7ED558CCDull;
  x ^= x >> 33;
  x *= 0xC4CEB9FE1A85EC53ull;
  return x ^ (x >> 33);
}

}  // namespace strata
