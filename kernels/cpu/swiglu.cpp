// SwiGLU, fast CPU path (twin: kernels/cpu/ref/swiglu.h): out = silu(gate) * up elementwise.
// exp is the vectorisable kernels/cpu/vec_exp.h.
#include <cstdint>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec_exp.h"
#include "src/core/error.h"

namespace strata::cpu {
namespace {

constexpr int64_t kParallelMin = 1 << 14;  // elements; fewer are not worth waking threads

inline float swiglu_sigmoid(float g) { return 1.f / (1.f + exp_f32(-g)); }

}  // namespace

void swiglu_forward(float* out, const float* gate, const float* up, int64_t n) {
  STRATA_CHECK(n >= 0, "swiglu_forward: need n >= 0, got ", n);
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g * swiglu_sigmoid(g) * up[i];
  }
}

void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                     const float* up, int64_t n) {
  STRATA_CHECK(n >= 0, "swiglu_backward: need n >= 0, got ", n);
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    const float s = swiglu_sigmoid(g);
    const float dy = dout[i];
    dgate[i] = dy * up[i] * (s * (1.f + g * (1.f - s)));
    dup[i] = dy * (g * s);
  }
}

}  // namespace strata::cpu
