// Plain-loop twin of cpu::matmul_f32 / matmul_bf16 (kernels/cpu/ops.h), templated on the
// element type so it runs in fp64 for checks. Same argument order; no tiling, no threads.
#pragma once
#include <cstdint>

namespace strata::ref {

// c (M,N) = op(a) (M,K) · op(b) (K,N) + beta * c; op(a) reads a stored (K,M) when trans_a,
// op(b) reads b stored (N,K) when trans_b. beta 0 overwrites (c may hold NaN then).
template <class T>
void matmul(T* c, const T* a, const T* b, int64_t m, int64_t n, int64_t k, bool trans_a,
            bool trans_b, T beta) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      T acc = T(0);
      for (int64_t p = 0; p < k; ++p) {
        T av = trans_a ? a[p * m + i] : a[i * k + p];
        T bv = trans_b ? b[j * k + p] : b[p * n + j];
        acc += av * bv;
      }
      c[i * n + j] = beta == T(0) ? acc : acc + beta * c[i * n + j];
    }
  }
}

}  // namespace strata::ref
