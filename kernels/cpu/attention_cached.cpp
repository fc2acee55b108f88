// Cached attention (attention_cached.h): one task per (row, query, head), keys in tiles of
// kTile with an online softmax, so memory is O(tile) whatever the cache length. Scores and the
// running sums are f32, as in the flash-style training kernel (attention.cpp); with bf16 dots the
// inputs are rounded to bf16 as they are read, as there.
#include "kernels/cpu/attention_cached.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "src/core/bf16.h"
#include "src/core/error.h"

namespace strata::cpu {
namespace {

constexpr int64_t kTile = 64;

// x, or x rounded to bf16 (nearest even) with bf16 dots.
template <bool kBf16>
inline float dot_input(float x) {
  if constexpr (kBf16) return bf16_to_f32(f32_to_bf16(x));
  return x;
}

// One (row, query, head): o (D) = softmax(scale * q K[first..last]^T) V[first..last]. K rows are
// kv_stride floats apart. kBf16: k and v rounded as read (q arrives rounded).
template <bool kBf16>
void attend_one(float* o, const float* q, const float* k, const float* v, int64_t first, int64_t last,
                int64_t kv_stride, int64_t d, float scale) {
  float s[kTile];
  float m = -std::numeric_limits<float>::infinity(), l = 0.f;
  for (int64_t e = 0; e < d; ++e) o[e] = 0.f;
  for (int64_t j0 = first; j0 <= last; j0 += kTile) {
    const int64_t n = std::min(kTile, last + 1 - j0);
    float tile_max = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < n; ++j) {
      const float* kj = k + (j0 + j) * kv_stride;
      float acc = 0.f;
#pragma omp simd reduction(+ : acc)
      for (int64_t e = 0; e < d; ++e) acc += q[e] * dot_input<kBf16>(kj[e]);
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
      for (int64_t e = 0; e < d; ++e) o[e] += p * dot_input<kBf16>(vj[e]);
    }
    m = m_new;
  }
  const float inv = 1.f / l;
  for (int64_t e = 0; e < d; ++e) o[e] *= inv;
}

}  // namespace

void attention_cached_forward(float* out, const float* q, const float* k_cache, const float* v_cache,
                              const int32_t* start, int64_t b, int64_t tq, int64_t tcap, int64_t h, int64_t hk,
                              int64_t d, float scale, DType dot_type, int64_t window) {
  STRATA_CHECK(dot_type == DType::f32 || dot_type == DType::bf16,
               "attention_cached: dot products run in f32 or bf16 (got ", dtype_name(dot_type), ")");
  const bool bf16_dots = dot_type == DType::bf16;
  STRATA_ASSERT(b >= 1 && tq >= 1 && h >= 1 && hk >= 1 && h % hk == 0 && d >= 1, "attention_cached: bad sizes");
  for (int64_t bi = 0; bi < b; ++bi)
    STRATA_ASSERT(start[bi] >= 0 && start[bi] + tq <= tcap, "attention_cached: row ", bi, " starts at ", start[bi],
                  ", ", tq, " queries overflow the cache of ", tcap);
  const int64_t group = h / hk, tasks = b * tq * h, kv_stride = hk * d;
#pragma omp parallel
  {
    std::vector<float> q_bf(bf16_dots ? size_t(d) : 0);  // (D) the query rounded to bf16
#pragma omp for schedule(static)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t hi = task % h, i = (task / h) % tq, bi = task / (h * tq);
      const int64_t g = hi / group;
      const float* kb = k_cache + bi * tcap * kv_stride + g * d;
      const float* vb = v_cache + bi * tcap * kv_stride + g * d;
      const int64_t last = int64_t(start[bi]) + i;
      const int64_t first = window > 0 && last - window + 1 > 0 ? last - window + 1 : 0;
      if (bf16_dots) {
        for (int64_t e = 0; e < d; ++e) q_bf[size_t(e)] = dot_input<true>(q[task * d + e]);
        attend_one<true>(out + task * d, q_bf.data(), kb, vb, first, last, kv_stride, d, scale);
      } else {
        attend_one<false>(out + task * d, q + task * d, kb, vb, first, last, kv_stride, d, scale);
      }
    }
  }
}

}  // namespace strata::cpu
