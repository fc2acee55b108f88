// Plain-loop twin of cpu::rmsnorm_forward / rmsnorm_backward (kernels/cpu/ops.h), templated on
// the element type so it runs in fp64 for checks. Same argument order; no threads.
#pragma once
#include <cmath>
#include <cstdint>

namespace strata::ref {

// out (n,c) = weight (c) * in (n,c) * rstd, rstd (n) = 1/sqrt(mean(in^2) + eps).
template <class T>
void rmsnorm_forward(T* out, T* rstd, const T* in, const T* weight, int64_t n, int64_t c,
                     T eps) {
  for (int64_t i = 0; i < n; ++i) {
    const T* x = in + i * c;
    T ss = T(0);
    for (int64_t j = 0; j < c; ++j) ss += x[j] * x[j];
    T r = T(1) / std::sqrt(ss / T(c) + eps);
    rstd[i] = r;
    for (int64_t j = 0; j < c; ++j) out[i * c + j] = weight[j] * (x[j] * r);
  }
}

// din (n,c) written; dweight (c) accumulated.
// With g = dout * weight: din = r * g - x * r^3 * mean(g * x).
template <class T>
void rmsnorm_backward(T* din, T* dweight, const T* dout, const T* in, const T* weight,
                      const T* rstd, int64_t n, int64_t c) {
  for (int64_t i = 0; i < n; ++i) {
    const T* x = in + i * c;
    const T* dy = dout + i * c;
    T r = rstd[i];
    T dot = T(0);
    for (int64_t j = 0; j < c; ++j) dot += dy[j] * weight[j] * x[j];
    T coef = dot * r * r * r / T(c);
    for (int64_t j = 0; j < c; ++j) {
      din[i * c + j] = r * dy[j] * weight[j] - x[j] * coef;
      dweight[j] += dy[j] * x[j] * r;
    }
  }
}

}  // namespace strata::ref
