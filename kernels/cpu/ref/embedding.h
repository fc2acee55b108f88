// Plain-loop twin of cpu::embedding_forward / embedding_backward (kernels/cpu/ops.h), templated
// on the element type so it runs in fp64 for checks.
#pragma once
#include <cstdint>

namespace strata::ref {

// out (n,c) = table (V,c) [ids (n)].
template <class T>
void embedding_forward(T* out, const T* table, const int32_t* ids, int64_t n, int64_t c) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < c; ++j) out[i * c + j] = table[int64_t(ids[i]) * c + j];
}

// dtable (V,c) += dout (n,c) scattered to rows ids (n), in token order.
template <class T>
void embedding_backward(T* dtable, const T* dout, const int32_t* ids, int64_t n, int64_t c) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < c; ++j) dtable[int64_t(ids[i]) * c + j] += dout[i * c + j];
}

}  // namespace strata::ref
