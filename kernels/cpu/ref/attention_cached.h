// Plain-loop twin of the cached-attention kernel (kernels/cpu/attention_cached.h, same argument
// order): one query at a time, its scores materialised, a two-pass softmax. Templated so the
// tests run it in fp64.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace strata::ref {

// out (B,Tq,H,D); q (B,Tq,H,D); k_cache and v_cache (B,Tcap,Hk,D); start (B): query i of row b
// sits at position start[b] + i and sees cache positions [0, start[b] + i], or with a sliding
// window (window > 0) those > start[b] + i - window.
template <class T>
void attention_cached_forward(T* out, const T* q, const T* k_cache, const T* v_cache, const int32_t* start,
                              int64_t b, int64_t tq, int64_t tcap, int64_t h, int64_t hk, int64_t d, T scale,
                              int64_t window = 0) {
  std::vector<T> p;
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t i = 0; i < tq; ++i)
      for (int64_t hi = 0; hi < h; ++hi) {
        const int64_t g = hi / (h / hk), last = int64_t(start[bi]) + i;
        const int64_t first = window > 0 && last - window + 1 > 0 ? last - window + 1 : 0;
        const T* qi = q + ((bi * tq + i) * h + hi) * d;
        p.assign(size_t(last + 1), T(0));
        T m = -std::numeric_limits<T>::infinity();
        for (int64_t j = first; j <= last; ++j) {
          const T* kj = k_cache + ((bi * tcap + j) * hk + g) * d;
          T s = 0;
          for (int64_t e = 0; e < d; ++e) s += qi[e] * kj[e];
          p[size_t(j)] = scale * s;
          if (p[size_t(j)] > m) m = p[size_t(j)];
        }
        T sum = 0;
        for (int64_t j = first; j <= last; ++j) sum += std::exp(p[size_t(j)] - m);
        T* o = out + ((bi * tq + i) * h + hi) * d;
        for (int64_t e = 0; e < d; ++e) o[e] = 0;
        for (int64_t j = first; j <= last; ++j) {
          const T w = std::exp(p[size_t(j)] - m) / sum;
          const T* vj = v_cache + ((bi * tcap + j) * hk + g) * d;
          for (int64_t e = 0; e < d; ++e) o[e] += w * vj[e];
        }
      }
}

}  // namespace strata::ref
