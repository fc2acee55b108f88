// bf16: the 16-bit brain float used for weights and matmul inputs (DESIGN §6).
// Conversion from f32 rounds to nearest, ties to even; NaN stays NaN (quiet).
#pragma once
#include <bit>
#include <cstdint>
#include <cstring>  // not used here; kept for includers that take memcpy from it

namespace strata {

struct bf16 {
  uint16_t bits;
};

inline float bf16_to_f32(bf16 h) { return std::bit_cast<float>(uint32_t(h.bits) << 16); }

// Branch-free (a select, not a jump), so loops over it vectorise.
inline bf16 f32_to_bf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;  // ties to even
  const uint32_t quiet_nan = (u >> 16) | 0x0040u;                    // NaN: quiet, sign kept
  return bf16{uint16_t((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded)};
}

// IEEE half, only needed to read F16 checkpoints.
inline float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do { mant <<= 1; ++e; } while (!(mant & 0x400u));
      mant &= 0x3ffu;
      u = sign | uint32_t(127 - 15 - e) << 23 | mant << 13;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | mant << 13;
  } else {
    u = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  return std::bit_cast<float>(u);
}

inline uint16_t f32_to_f16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  int32_t exp = int32_t((u >> 23) & 0xffu);
  uint32_t mant = u & 0x7fffffu;
  if (exp == 255) return uint16_t(sign | 0x7c00u | (mant ? 0x200u : 0u));
  int32_t e = exp - 127 + 15;
  if (e >= 31) return uint16_t(sign | 0x7c00u);
  if (e <= 0) {
    if (e < -10) return uint16_t(sign);
    mant |= 0x800000u;
    uint32_t shift = uint32_t(14 - e);
    uint32_t half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return uint16_t(sign | half);
  }
  uint32_t half = sign | uint32_t(e) << 10 | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;  // may carry into exp: correct
  return uint16_t(half);
}

}  // namespace strata
