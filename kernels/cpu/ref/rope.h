// Plain-loop twin of cpu::rope_forward / rope_backward (kernels/cpu/ops.h), Hugging Face
// rotate-half layout, templated on the element type: angle, cos and sin are computed in T.
#pragma once
#include <cmath>
#include <cstdint>

namespace strata::ref {

// x (n, nh, d); pos (n); the first rot dims of each head turn (0: all d), the rest pass;
// inv_freq (rot/2). Each pair (x[j], x[j+rot/2]) turned by sign * angle, angle = pos * inv_freq[j]:
// out[j] = x[j] cos - x[j+rot/2] s, out[j+rot/2] = x[j+rot/2] cos + x[j] s with s = sign * sin.
// In-place allowed.
template <class T>
void rope_rotate(T* out, const T* in, const int32_t* pos, const T* inv_freq, int64_t n, int64_t nh, int64_t d,
                 int64_t rot, T sign) {
  if (rot == 0) rot = d;
  int64_t half = rot / 2;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t h = 0; h < nh; ++h) {
      const T* x = in + (i * nh + h) * d;
      T* y = out + (i * nh + h) * d;
      for (int64_t j = 0; j < half; ++j) {
        T angle = T(pos[i]) * inv_freq[j];
        T cs = std::cos(angle), sn = sign * std::sin(angle);
        T x0 = x[j], x1 = x[j + half];
        y[j] = x0 * cs - x1 * sn;
        y[j + half] = x1 * cs + x0 * sn;
      }
      for (int64_t j = rot; j < d; ++j) y[j] = x[j];
    }
  }
}

// out[j] = x[j] cos - x[j+d/2] sin, out[j+d/2] = x[j+d/2] cos + x[j] sin.
template <class T>
void rope_forward(T* out, const T* in, const int32_t* pos, const T* inv_freq, int64_t n,
                  int64_t nh, int64_t d, int64_t rot = 0) {
  rope_rotate(out, in, pos, inv_freq, n, nh, d, rot, T(1));
}

// The transpose of the rotation, a turn by -angle: din[j] = dout[j] cos + dout[j+d/2] sin,
// din[j+d/2] = dout[j+d/2] cos - dout[j] sin. In-place allowed.
template <class T>
void rope_backward(T* din, const T* dout, const int32_t* pos, const T* inv_freq, int64_t n,
                   int64_t nh, int64_t d, int64_t rot = 0) {
  rope_rotate(din, dout, pos, inv_freq, n, nh, d, rot, T(-1));
}

}  // namespace strata::ref
