// Plain-loop twin of cpu::bias_forward / bias_backward (kernels/cpu/ops.h), templated on the
// element type so it runs in fp64 for checks.
#pragma once
#include <cstdint>

namespace strata::ref {

// y (n,o) += b (o).
template <class T>
void bias_forward(T* y, const T* b, int64_t n, int64_t o) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < o; ++j) y[i * o + j] += b[j];
}

// db (o) += column sums of dy (n,o), rows in order.
template <class T>
void bias_backward(T* db, const T* dy, int64_t n, int64_t o) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < o; ++j) db[j] += dy[i * o + j];
}

}  // namespace strata::ref
