// The one-process gradient additions (grad_reduction.h).
#include "offload/reduce/grad_reduction.h"

#include "src/device/host_ops.h"

namespace strata {

void grad_accumulate(float* dst, const float* src, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) dst[i] += src[i];
}

void NoGradReduction::add_embedding(float* table_grad, const float* dx0, const int32_t* ids, int64_t n, int64_t C) {
  host_embedding_backward(table_grad, dx0, ids, n, C);
}

}  // namespace strata
