// Elementwise helpers, fast CPU path: residual add and f32 <-> bf16 casts (rounding as in
// src/core/bf16.h: nearest, ties to even, NaN kept quiet).
#include "kernels/cpu/ops.h"
#include "src/core/error.h"

namespace strata::cpu {

namespace {
constexpr int64_t kParallelMin = 1 << 14;  // elements; fewer are not worth waking threads
}  // namespace

void add_inplace(float* y, const float* x, int64_t n) {
  STRATA_CHECK(n >= 0, "add_inplace: need n >= 0, got ", n);
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void cast_f32_to_bf16(bf16* out, const float* in, int64_t n) {
  STRATA_CHECK(n >= 0, "cast_f32_to_bf16: need n >= 0, got ", n);
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) out[i] = f32_to_bf16(in[i]);
}

void cast_bf16_to_f32(float* out, const bf16* in, int64_t n) {
  STRATA_CHECK(n >= 0, "cast_bf16_to_f32: need n >= 0, got ", n);
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(in[i]);
}

}  // namespace strata::cpu
