// Cached attention (attention_cached.h): one task per (row, query, head), keys in tiles of
// kTile with an online softmax, so memory is O(tile) whatever the cache length. Scores and the
// running sums are f32, as in the flash-style training kernel (attention.cpp).
#include "kernels/cpu/attention_cached.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "src/core/error.h"

namespace strata::cpu {
namespace {

constexpr int64_t kTile = 64;

// One (row, query, head): o (D) = softmax(scale * q K[0..last]^T) V[0..last]. K rows are
// kv_stride floats apart.
void attend_one(float* o, const float* q, const float* k, const float* v, int64_t last, int64_t kv_stride,
                int64_t d, float scale) {
  float s[kTile];
  float m = -std::numeric_limits<float>::infinity(), l = 0.f;
  for (int64_t e = 0; e < d; ++e) o[e] = 0.f;
  for (int64_t j0 = 0; j0 <= last; j0 += kTile) {
    const int64_t n = std::min(kTile, last + 1 - j0);
    float tile_max = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < n; ++j) {
      const float* kj = k + (j0 + j) * kv_stride;
      float acc = 0.f;
#pragma omp simd reduction(+ : acc)
      for (int64_t e = 0; e < d; ++e) acc += q[e] * kj[e];
      s[j] = scale * acc;
      tile_max = std::max(tile_max, s[j]);
    }
    const float m_new = std::max(m, tile_max);
    const float correction = std::exp(m - m_new);  // 0 on the first tile (m = -inf)
    l *= correction;
    for (int64_t e = 0; e < d; ++e) o[e] *= correction;
    for (int64_t j = 0; j < n; ++j) {
      const float p = std::exp(s[j] - m_new);
      l += p;
      const float* vj = v + (j0 + j) * kv_stride;
#pragma omp simd
      for (int64_t e = 0; e < d; ++e) o[e] += p * vj[e];
    }
    m = m_new;
  }
  const float inv = 1.f / l;
  for (int64_t e = 0; e < d; ++e) o[e] *= inv;
}

}  // namespace

void attention_cached_forward(float* out, const float* q, const float* k_cache, const float* v_cache,
                              const int32_t* start, int64_t b, int64_t tq, int64_t tcap, int64_t h, int64_t hk,
                              int64_t d, float scale) {
  STRATA_ASSERT(b >= 1 && tq >= 1 && h >= 1 && hk >= 1 && h % hk == 0 && d >= 1, "attention_cached: bad sizes");
  for (int64_t bi = 0; bi < b; ++bi)
    STRATA_ASSERT(start[bi] >= 0 && start[bi] + tq <= tcap, "attention_cached: row ", bi, " starts at ", start[bi],
                  ", ", tq, " queries overflow the cache of ", tcap);
  const int64_t group = h / hk, tasks = b * tq * h, kv_stride = hk * d;
#pragma omp parallel for schedule(static)
  for (int64_t task = 0; task < tasks; ++task) {
    const int64_t hi = task % h, i = (task / h) % tq, bi = task / (h * tq);
    const int64_t g = hi / group;
    const float* kb = k_cache + bi * tcap * kv_stride + g * d;
    const float* vb = v_cache + bi * tcap * kv_stride + g * d;
    attend_one(out + task * d, q + task * d, kb, vb, int64_t(start[bi]) + i, kv_stride, d, scale);
  }
}

}  // namespace strata::cpu
