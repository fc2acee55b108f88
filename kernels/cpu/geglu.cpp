// GeGLU and the affine map, fast CPU path (twin: kernels/cpu/ref/geglu.h): Gemma's MLP gate
// out = gelu_tanh(gate) * up elementwise and its backward; y = a x + b (Gemma's (1 + w) norm
// weights and its √hidden embedding scale).
#include <cmath>
#include <cstdint>

#include "kernels/cpu/ops.h"
#include "src/core/error.h"

namespace strata::cpu {
namespace {

constexpr int64_t kParallelMin = 1 << 14;  // elements; fewer are not worth waking threads
constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;

}  // namespace

void geglu_forward(float* out, const float* gate, const float* up, int64_t n) {
  STRATA_CHECK(n >= 0, "geglu_forward: need n >= 0, got ", n);
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = 0.5f * g * (1.f + std::tanh(kGeluC * (g + kGeluA * g * g * g))) * up[i];
  }
}

void geglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t n) {
  STRATA_CHECK(n >= 0, "geglu_backward: need n >= 0, got ", n);
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i], dy = dout[i];
    const float th = std::tanh(kGeluC * (g + kGeluA * g * g * g));
    const float grad = 0.5f * (1.f + th) + 0.5f * g * (1.f - th * th) * kGeluC * (1.f + 3.f * kGeluA * g * g);
    dgate[i] = dy * up[i] * grad;
    dup[i] = dy * (0.5f * g * (1.f + th));
  }
}

void affine(float* y, const float* x, float a, float b, int64_t n) {
  STRATA_CHECK(n >= 0, "affine: need n >= 0, got ", n);
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] = a * x[i] + b;
}

}  // namespace strata::cpu
