// SwiGLU, fast CPU path (twin: kernels/cpu/ref/swiglu.h): out = silu(gate) * up elementwise.
// exp is a small vectorisable f32 routine (Cody-Waite reduction + Cephes polynomial, ~1 ulp),
// since glibc's expf is not vectorised without -ffast-math.
#include <algorithm>
#include <bit>
#include <cstdint>

#include "kernels/cpu/ops.h"
#include "src/core/error.h"

namespace strata::cpu {
namespace {

constexpr int64_t kParallelMin = 1 << 14;  // elements; fewer are not worth waking threads

// e^x for x clamped to [-87, 88] (results stay normal and finite); NaN stays NaN.
inline float swiglu_exp(float x) {
  x = std::min(std::max(x, -87.f), 88.f);
  const float nf = (x * 1.44269504088896341f + 12582912.f) - 12582912.f;  // round(x / ln2)
  float r = x - nf * 0.693359375f;  // ln2 split in two so r is exact enough
  r = r + nf * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  const float scale = std::bit_cast<float>(uint32_t(int32_t(nf) + 127) << 23);  // 2^n
  return p * scale;
}

inline float swiglu_sigmoid(float g) { return 1.f / (1.f + swiglu_exp(-g)); }

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
