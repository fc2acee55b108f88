// e^x as a small f32 routine the compiler vectorises (Cody-Waite range reduction + Cephes
// polynomial, about 1 ulp), since glibc's expf is not vectorised without -ffast-math. Used by
// the SwiGLU and attention fast paths.
#pragma once
#include <algorithm>
#include <bit>
#include <cstdint>

namespace strata::cpu {

// e^x for x clamped to [-87, 88] (results stay normal and finite, so e^-inf is ~1.6e-38, not 0);
// NaN stays NaN.
inline float exp_f32(float x) {
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

}  // namespace strata::cpu
