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

// One expression for the f32 and the bf16-output forward, so the latter's f32 values are the
// former's.
inline float swiglu_value(float g, float u) { return g * swiglu_sigmoid(g) * u; }

// dgate and dup of one element: one expression for the f32 and the bf16-output backward, so the
// latter's values are the former's, rounded.
inline void swiglu_grads(float& dgate, float& dup, float dy, float g, float u) {
  const float s = swiglu_sigmoid(g);
  dgate = dy * u * (s * (1.f + g * (1.f - s)));
  dup = dy * (g * s);
}

}  // namespace

void swiglu_forward(float* out, const float* gate, const float* up, int64_t n) {
  STRATA_CHECK(n >= 0, "swiglu_forward: need n >= 0, got ", n);
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) out[i] = swiglu_value(gate[i], up[i]);
}

void swiglu_forward_bf16(float* out, bf16* out_b, const float* gate, const float* up, int64_t n) {
  STRATA_CHECK(n >= 0, "swiglu_forward_bf16: need n >= 0, got ", n);
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const float y = swiglu_value(gate[i], up[i]);
    out[i] = y;
    out_b[i] = f32_to_bf16(y);
  }
}

void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                     const float* up, int64_t n) {
  STRATA_CHECK(n >= 0, "swiglu_backward: need n >= 0, got ", n);
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) swiglu_grads(dgate[i], dup[i], dout[i], gate[i], up[i]);
}

void swiglu_backward_bf16(bf16* dgate, bf16* dup, const float* dout, const float* gate,
                          const float* up, int64_t n) {
  STRATA_CHECK(n >= 0, "swiglu_backward_bf16: need n >= 0, got ", n);
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    float dg, du;
    swiglu_grads(dg, du, dout[i], gate[i], up[i]);
    dgate[i] = f32_to_bf16(dg);
    dup[i] = f32_to_bf16(du);
  }
}

}  // namespace strata::cpu
