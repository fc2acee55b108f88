// RMSNorm, fast CPU path (twin: kernels/cpu/ref/rmsnorm.h). Matches Hugging Face LlamaRMSNorm
// computed in f32: rstd = 1/sqrt(mean(x^2) + eps), out = weight * (x * rstd).
// Rows are split over OpenMP threads; the weight gradient is summed over fixed 64-row chunks
// whose partials are added in chunk order, so every result is bitwise independent of the
// thread count.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/ops.h"
#include "src/core/error.h"

namespace strata::cpu {
namespace {

constexpr int64_t kParallelMin = 1 << 14;  // elements; fewer are not worth waking threads

constexpr int64_t kRowsPerChunk = 64;  // fixed: the dweight sum order must not follow threads

}  // namespace

namespace {

// out_b null: the f32 output only; else also its bf16 rounding, each row while it is in cache.
void rmsnorm_forward_rows(float* out, bf16* out_b, float* rstd, const float* in, const float* weight,
                          int64_t n, int64_t c, float eps) {
#pragma omp parallel for schedule(static) if (n * c >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const float* x = in + i * c;  // (c)
    float* y = out + i * c;       // (c)
    float ss = 0.f;
#pragma omp simd reduction(+ : ss)
    for (int64_t j = 0; j < c; ++j) ss += x[j] * x[j];
    float r = 1.f / std::sqrt(ss / float(c) + eps);
    rstd[i] = r;
#pragma omp simd
    for (int64_t j = 0; j < c; ++j) y[j] = weight[j] * (x[j] * r);
    if (!out_b) continue;
    bf16* yb = out_b + i * c;  // (c)
#pragma omp simd
    for (int64_t j = 0; j < c; ++j) yb[j] = f32_to_bf16(y[j]);
  }
}

}  // namespace

void rmsnorm_forward(float* out, float* rstd, const float* in, const float* weight, int64_t n,
                     int64_t c, float eps) {
  STRATA_CHECK(n >= 0 && c > 0, "rmsnorm_forward: need n >= 0 and c > 0, got n=", n, " c=", c);
  rmsnorm_forward_rows(out, nullptr, rstd, in, weight, n, c, eps);
}

void rmsnorm_forward_bf16(float* out, bf16* out_b, float* rstd, const float* in, const float* weight,
                          int64_t n, int64_t c, float eps) {
  STRATA_CHECK(n >= 0 && c > 0, "rmsnorm_forward_bf16: need n >= 0 and c > 0, got n=", n, " c=", c);
  rmsnorm_forward_rows(out, out_b, rstd, in, weight, n, c, eps);
}

void rmsnorm_backward(float* din, float* dweight, const float* dout, const float* in,
                      const float* weight, const float* rstd, int64_t n, int64_t c) {
  STRATA_CHECK(n >= 0 && c > 0, "rmsnorm_backward: need n >= 0 and c > 0, got n=", n, " c=", c);
  int64_t chunks = (n + kRowsPerChunk - 1) / kRowsPerChunk;
  std::vector<float> partial(size_t(chunks * c), 0.f);  // (chunks, c) dweight per chunk
#pragma omp parallel for schedule(static) if (n * c >= kParallelMin)
  for (int64_t ch = 0; ch < chunks; ++ch) {
    float* dw = partial.data() + ch * c;  // (c)
    int64_t end = std::min(n, (ch + 1) * kRowsPerChunk);
    for (int64_t i = ch * kRowsPerChunk; i < end; ++i) {
      const float* x = in + i * c;     // (c)
      const float* dy = dout + i * c;  // (c)
      float* dx = din + i * c;         // (c)
      float r = rstd[i];
      float dot = 0.f;
#pragma omp simd reduction(+ : dot)
      for (int64_t j = 0; j < c; ++j) dot += dy[j] * weight[j] * x[j];
      float coef = dot * r * r * r / float(c);
#pragma omp simd
      for (int64_t j = 0; j < c; ++j) {
        dx[j] = r * (dy[j] * weight[j]) - x[j] * coef;
        dw[j] += dy[j] * (x[j] * r);
      }
    }
  }
  // Sum the chunk partials in chunk order and add them into dweight: bias_backward is exactly
  // that (a fixed-chunk column sum), so the order stays independent of the thread count.
  bias_backward(dweight, partial.data(), chunks, c);
}

}  // namespace strata::cpu
