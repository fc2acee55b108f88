// Plain-loop twin of the causal GQA attention kernels in kernels/cpu/ops.h (same argument
// order). It materialises the (T, T) score matrix of one (batch row, head) at a time, which
// the fast path never does; fine for the small sizes tests use.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "src/core/bf16.h"

namespace strata::ref {

// First key query t of batch row bi may see: its document start (0 when doc_start is null),
// or with a sliding window (window > 0) the window's first key ti - window + 1 if that is later.
inline int64_t attention_first_key(const int32_t* doc_start, int64_t bi, int64_t t, int64_t ti,
                                   int64_t window = 0) {
  const int64_t doc = doc_start ? int64_t(doc_start[bi * t + ti]) : 0;
  return window > 0 && ti - window + 1 > doc ? ti - window + 1 : doc;
}

// p (T, T): softmax probabilities of one (bi, hi); entries outside [first key, t] are 0.
// lse_row[i * lse_stride] gets the log-sum-exp of query i.
template <class T>
void attention_probs(std::vector<T>& p, T* lse_row, int64_t lse_stride, const T* q, const T* k,
                     const int32_t* doc_start, int64_t bi, int64_t hi, int64_t t, int64_t h,
                     int64_t hk, int64_t d, T scale, int64_t window = 0) {
  const int64_t g = hi / (h / hk);
  p.assign(size_t(t * t), T(0));
  for (int64_t i = 0; i < t; ++i) {
    const int64_t lo = attention_first_key(doc_start, bi, t, i, window);
    const T* qi = q + ((bi * t + i) * h + hi) * d;
    T m = -std::numeric_limits<T>::infinity();
    for (int64_t j = lo; j <= i; ++j) {
      const T* kj = k + ((bi * t + j) * hk + g) * d;
      T s = 0;
      for (int64_t e = 0; e < d; ++e) s += qi[e] * kj[e];
      p[i * t + j] = scale * s;
      if (p[i * t + j] > m) m = p[i * t + j];
    }
    T sum = 0;
    for (int64_t j = lo; j <= i; ++j) sum += std::exp(p[i * t + j] - m);
    const T lse = m + std::log(sum);
    for (int64_t j = lo; j <= i; ++j) p[i * t + j] = std::exp(p[i * t + j] - lse);
    lse_row[i * lse_stride] = lse;
  }
}

// out (B,T,H,D), lse (B,T,H); q (B,T,H,D), k and v (B,T,Hk,D); doc_start (B,T) or null.
// window > 0: query i sees keys j > i - window only (sliding-window layers); 0: no window.
template <class T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, const int32_t* doc_start,
                       int64_t b, int64_t t, int64_t h, int64_t hk, int64_t d, T scale,
                       int64_t window = 0) {
  std::vector<T> p;  // (T, T)
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t hi = 0; hi < h; ++hi) {
      const int64_t g = hi / (h / hk);
      attention_probs(p, lse + bi * t * h + hi, h, q, k, doc_start, bi, hi, t, h, hk, d, scale, window);
      for (int64_t i = 0; i < t; ++i) {
        T* oi = out + ((bi * t + i) * h + hi) * d;
        for (int64_t e = 0; e < d; ++e) oi[e] = 0;
        for (int64_t j = 0; j <= i; ++j) {
          const T* vj = v + ((bi * t + j) * hk + g) * d;
          for (int64_t e = 0; e < d; ++e) oi[e] += p[i * t + j] * vj[e];
        }
      }
    }
  }
}

// dq (B,T,H,D), dk and dv (B,T,Hk,D) written; dout, out (B,T,H,D), lse (B,T,H) from forward.
// dS = P * (dP - rowsum(dout * out)), dq = scale dS k, dk = scale dS^T q, dv = P^T dout.
// bf16_weights: P and dS rounded to bf16 (nearest even, through f32) where they weight the
// products over tokens (dv, dk, dq), as the backward does with bf16 dots (kernels/cpu/ops.h).
template <class T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                        const T* out, const T* lse, const int32_t* doc_start, int64_t b, int64_t t,
                        int64_t h, int64_t hk, int64_t d, T scale, bool bf16_weights = false,
                        int64_t window = 0) {
  auto weight = [bf16_weights](T x) {
    return bf16_weights ? T(bf16_to_f32(f32_to_bf16(float(x)))) : x;
  };
  for (int64_t i = 0; i < b * t * hk * d; ++i) dk[i] = dv[i] = 0;
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t hi = 0; hi < h; ++hi) {
      const int64_t g = hi / (h / hk);
      for (int64_t i = 0; i < t; ++i) {
        // P_ij = exp(scale q_i.k_j - lse_i) from the saved lse, as the fast path does.
        const T* qi = q + ((bi * t + i) * h + hi) * d;
        const T* doi = dout + ((bi * t + i) * h + hi) * d;
        const T* oi = out + ((bi * t + i) * h + hi) * d;
        T* dqi = dq + ((bi * t + i) * h + hi) * d;
        const T lse_i = lse[(bi * t + i) * h + hi];
        T di = 0;
        for (int64_t e = 0; e < d; ++e) di += doi[e] * oi[e];
        for (int64_t e = 0; e < d; ++e) dqi[e] = 0;
        for (int64_t j = attention_first_key(doc_start, bi, t, i, window); j <= i; ++j) {
          const T* kj = k + ((bi * t + j) * hk + g) * d;
          const T* vj = v + ((bi * t + j) * hk + g) * d;
          T s = 0, dp = 0;
          for (int64_t e = 0; e < d; ++e) s += qi[e] * kj[e];
          for (int64_t e = 0; e < d; ++e) dp += doi[e] * vj[e];
          const T pij = std::exp(scale * s - lse_i);
          const T ds = weight(pij * (dp - di));
          const T pw = weight(pij);
          T* dkj = dk + ((bi * t + j) * hk + g) * d;
          T* dvj = dv + ((bi * t + j) * hk + g) * d;
          for (int64_t e = 0; e < d; ++e) {
            dqi[e] += scale * ds * kj[e];
            dkj[e] += scale * ds * qi[e];
            dvj[e] += pw * doi[e];
          }
        }
      }
    }
  }
}

}  // namespace strata::ref
