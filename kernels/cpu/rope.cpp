// Rotary position embedding, Hugging Face rotate-half layout, fast CPU path
// (twin: kernels/cpu/ref/rope.h), on the first rot dims of each head (partial rotary). The angle is float(pos) * inv_freq[j] in f32 and cos/sin are
// taken in f32, as HF does; each token's cos/sin table is built once and shared by its heads.
#include <cmath>
#include <vector>

#include "kernels/cpu/ops.h"
#include "src/core/error.h"

namespace strata::cpu {
namespace {

constexpr int64_t kParallelMin = 1 << 14;  // elements; fewer are not worth waking threads

// out[j] = x[j] cos - x[j+half] sin, out[j+half] = x[j+half] cos + x[j] sin for j < half = rot/2;
// with transpose (the backward) sin is negated, since the transpose of a rotation is the opposite
// rotation; dims rot .. d-1 pass (copied when out != in). out == in is safe: iteration j reads and
// writes only elements j and j+half.
void rope_rotate(float* out, const float* in, const int32_t* pos, const float* inv_freq,
                 int64_t n, int64_t nh, int64_t d, int64_t rot, bool transpose) {
  if (rot == 0) rot = d;
  STRATA_CHECK(n >= 0 && nh > 0 && d > 0 && rot > 0 && rot % 2 == 0 && rot <= d,
               "rope: need n >= 0, nh > 0, a head dim d > 0 and an even rotary dim 0 < rot <= d, got n=", n,
               " nh=", nh, " d=", d, " rot=", rot);
  const int64_t half = rot / 2;
#pragma omp parallel if (n * nh * d >= kParallelMin)
  {
    // (half) this token's cos and sin, shared by its nh heads
    std::vector<float> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float p = float(pos[i]);
      for (int64_t j = 0; j < half; ++j) {
        float angle = p * inv_freq[j];
        cs[j] = std::cos(angle);
        sn[j] = transpose ? -std::sin(angle) : std::sin(angle);
      }
      const float* c = cs.data();
      const float* s = sn.data();
      for (int64_t h = 0; h < nh; ++h) {
        const float* x = in + (i * nh + h) * d;  // (d)
        float* y = out + (i * nh + h) * d;       // (d)
#pragma omp simd
        for (int64_t j = 0; j < half; ++j) {
          float x0 = x[j], x1 = x[j + half];
          y[j] = x0 * c[j] - x1 * s[j];
          y[j + half] = x1 * c[j] + x0 * s[j];
        }
        if (y != x)
          for (int64_t j = rot; j < d; ++j) y[j] = x[j];
      }
    }
  }
}

}  // namespace

void rope_forward(float* out, const float* in, const int32_t* pos, const float* inv_freq,
                  int64_t n, int64_t nh, int64_t d, int64_t rot) {
  rope_rotate(out, in, pos, inv_freq, n, nh, d, rot, false);
}

void rope_backward(float* din, const float* dout, const int32_t* pos, const float* inv_freq,
                   int64_t n, int64_t nh, int64_t d, int64_t rot) {
  rope_rotate(din, dout, pos, inv_freq, n, nh, d, rot, true);
}

}  // namespace strata::cpu
