// Plain-loop twins of the mixture-of-experts combine ops (kernels/cpu/ops.h: moe_combine_*),
// templated on the element type so they run in fp64 for checks.
//
// The routed rows of a layer are laid out expert by expert (M = N*k rows, models/moe_routing.h):
// row r holds token row_token[r]'s copy for one of its k experts; token t's k rows are
// token_row[t*k + j], j = 0..k-1 in its routing order.
#pragma once
#include <cstdint>

namespace strata::ref {

// out (n,c) += sum over j < k of w[r] * y[r] (w null: weight 1), r = token_row[t*k + j], the sum
// taken in j order and added to out last.
template <class T>
void moe_combine_forward(T* out, const T* y, const T* w, const int32_t* token_row, int64_t n, int64_t k,
                         int64_t c) {
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < c; ++i) {
      T acc = 0;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t r = token_row[t * k + j];
        acc += (w ? w[r] : T(1)) * y[r * c + i];
      }
      out[t * c + i] += acc;
    }
}

// The backward of moe_combine_forward for its y and w: dy (m,c) = w[r] * dout[row_token[r]] and
// dw (m) = dot(dout[row_token[r]], y[r]) (dw null: not computed), both written.
template <class T>
void moe_combine_backward(T* dy, T* dw, const T* dout, const T* y, const T* w, const int32_t* row_token, int64_t m,
                          int64_t c) {
  for (int64_t r = 0; r < m; ++r) {
    const T* g = dout + int64_t(row_token[r]) * c;
    T dot = 0;
    for (int64_t i = 0; i < c; ++i) {
      dy[r * c + i] = w[r] * g[i];
      dot += g[i] * y[r * c + i];
    }
    if (dw) dw[r] = dot;
  }
}

}  // namespace strata::ref
