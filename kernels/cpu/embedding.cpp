// Token embedding lookup and its gradient, fast CPU path (twin: kernels/cpu/ref/embedding.h).
// The backward splits the columns among threads and each thread walks all tokens in order, so
// every dtable element is accumulated in token order: bitwise the same for any thread count,
// with no atomics and no (V, C) partial buffers.
#include <algorithm>
#include <cstring>

#include <omp.h>

#include "kernels/cpu/ops.h"
#include "src/core/error.h"

namespace strata::cpu {
namespace {
constexpr int64_t kParallelMin = 1 << 14;  // elements; fewer are not worth waking threads
}  // namespace

void embedding_forward(float* out, const float* table, const int32_t* ids, int64_t n,
                       int64_t c) {
  STRATA_CHECK(n >= 0 && c > 0, "embedding_forward: need n >= 0 and c > 0, got n=", n, " c=", c);
#pragma omp parallel for schedule(static) if (n * c >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    STRATA_DASSERT(ids[i] >= 0);
    std::memcpy(out + i * c, table + int64_t(ids[i]) * c, size_t(c) * sizeof(float));
  }
}

void embedding_forward_bf16(float* out, const bf16* table, const int32_t* ids, int64_t n,
                            int64_t c) {
  STRATA_CHECK(n >= 0 && c > 0, "embedding_forward_bf16: need n >= 0 and c > 0, got n=", n,
               " c=", c);
#pragma omp parallel for schedule(static) if (n * c >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    STRATA_DASSERT(ids[i] >= 0);
    const bf16* src = table + int64_t(ids[i]) * c;  // (c)
    float* dst = out + i * c;                       // (c)
#pragma omp simd
    for (int64_t j = 0; j < c; ++j) dst[j] = bf16_to_f32(src[j]);
  }
}

void embedding_backward(float* dtable, const float* dout, const int32_t* ids, int64_t n,
                        int64_t c) {
  STRATA_CHECK(n >= 0 && c > 0, "embedding_backward: need n >= 0 and c > 0, got n=", n, " c=",
               c);
  // Column ranges of 16 floats (one cache line) at least; the split does not affect results.
  const int64_t lines = (c + 15) / 16;
#pragma omp parallel if (n * c >= kParallelMin)
  {
    const int64_t nthr = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t begin = std::min(c, lines * t / nthr * 16);
    const int64_t end = std::min(c, lines * (t + 1) / nthr * 16);
    if (begin < end) {
      for (int64_t i = 0; i < n; ++i) {
        const float* src = dout + i * c;                    // (c)
        float* dst = dtable + int64_t(ids[i]) * c;          // (c) row of the table
#pragma omp simd
        for (int64_t j = begin; j < end; ++j) dst[j] += src[j];
      }
    }
  }
}

}  // namespace strata::cpu
