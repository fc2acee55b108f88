// The mixture-of-experts combine ops on the CPU (twin: kernels/cpu/ref/moe.h): threads split
// tokens (forward) or rows (backward); each output element is one fixed-order sum, so the bits
// do not depend on the thread count.
#include <omp.h>

#include "kernels/cpu/ops.h"
#include "src/core/error.h"

namespace strata::cpu {
namespace {
constexpr int64_t kParallelMin = 1 << 14;  // elements; fewer are not worth waking threads
}  // namespace

void moe_combine_forward(float* out, const float* y, const float* w, const int32_t* token_row, int64_t n,
                         int64_t k, int64_t c) {
  STRATA_CHECK(n >= 0 && k > 0 && c > 0, "moe_combine_forward: need n >= 0, k > 0, c > 0, got n=", n, " k=", k,
               " c=", c);
#pragma omp parallel for schedule(static) if (n * k * c >= kParallelMin)
  for (int64_t t = 0; t < n; ++t) {
    float* o = out + t * c;  // (c)
    for (int64_t i = 0; i < c; ++i) {
      float acc = 0.f;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t r = token_row[t * k + j];
        acc += (w ? w[r] : 1.f) * y[r * c + i];
      }
      o[i] += acc;
    }
  }
}

void moe_combine_backward(float* dy, float* dw, const float* dout, const float* y, const float* w,
                          const int32_t* row_token, int64_t m, int64_t c) {
  STRATA_CHECK(m >= 0 && c > 0, "moe_combine_backward: need m >= 0 and c > 0, got m=", m, " c=", c);
#pragma omp parallel for schedule(static) if (m * c >= kParallelMin)
  for (int64_t r = 0; r < m; ++r) {
    const float* g = dout + int64_t(row_token[r]) * c;  // (c)
    const float* yr = y + r * c;                        // (c)
    float* d = dy + r * c;                              // (c)
    float dot = 0.f;
    for (int64_t i = 0; i < c; ++i) {
      d[i] = w[r] * g[i];
      dot += g[i] * yr[i];
    }
    if (dw) dw[r] = dot;
  }
}

}  // namespace strata::cpu
