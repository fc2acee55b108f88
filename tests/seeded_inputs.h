// Seeded integer inputs shared by the tests (CPU and CUDA): loss targets with ignored rows,
// document starts for packed attention rows, and strided micro-batches for the engines.
#pragma once
#include <cstdint>
#include <vector>

#include "models/micro_batch.h"

namespace strata::testing {

// Targets in [0, v) from a seeded LCG, every `ignore_every`-th row (from row 1) set to -100
// (0: none ignored).
inline std::vector<int32_t> make_targets(int64_t n, int64_t v, int64_t ignore_every, uint64_t seed) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  uint64_t state = seed;
  for (int64_t i = 0; i < n; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    t[size_t(i)] = int32_t((state >> 33) % uint64_t(v));
    if (ignore_every > 0 && i % ignore_every == 1) t[size_t(i)] = -100;
  }
  return t;
}

// doc_start (B,T) with documents of pseudo-random lengths 1..max_len, or every token its own
// document when max_len == 1.
inline std::vector<int32_t> make_doc_start(int64_t b, int64_t t, int64_t max_len, uint64_t seed) {
  std::vector<int32_t> ds(size_t(b * t));
  uint64_t state = seed;
  for (int64_t bi = 0; bi < b; ++bi) {
    int64_t start = 0, left = 0;
    for (int64_t ti = 0; ti < t; ++ti) {
      if (left == 0) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        left = 1 + int64_t((state >> 33) % uint64_t(max_len));
        start = ti;
      }
      ds[size_t(bi * t + ti)] = int32_t(start);
      --left;
    }
  }
  return ds;
}

// B rows of T tokens: ids (i * stride + offset) % V over the flat index i, each target the next
// id (-100 at a row's end), positions 0..T-1 in every row.
inline MicroBatch strided_batch(int64_t B, int64_t T, int64_t V, int64_t stride, int64_t offset = 0) {
  MicroBatch mb;
  mb.B = B;
  mb.T = T;
  for (int64_t i = 0; i < B * T; ++i) {
    mb.ids.push_back(int32_t((i * stride + offset) % V));
    mb.targets.push_back(i % T == T - 1 ? -100 : int32_t(((i + 1) * stride + offset) % V));
    mb.pos.push_back(int32_t(i % T));
  }
  return mb;
}

}  // namespace strata::testing
