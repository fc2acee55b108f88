// Internal to offload/adamw*.cpp: the per-ISA AdamW kernels and the one scalar element step they
// all share, so that the scalar, AVX2 and AVX-512 variants give identical bits.
//
// Bitwise agreement rests on three things: every variant does the same IEEE operations in the
// same order (mul, add, div, sqrt, fma: each correctly rounded, vector or not); the only fused
// multiply-adds are the two written as fma below, in every variant (each kernel file starts
// with `#pragma GCC optimize("fp-contract=off")`, since -march=native would otherwise let GCC
// contract other a*b+c into FMAs, differently per variant); and bf16 rounding is the same
// integer round-to-nearest-even everywhere (not vcvtneps2bf16, which flushes subnormal inputs
// to zero).
//
// The element step follows torch.optim.AdamW (1.13, foreach=False and True, CPU kernels)
// operation by operation, in f32, including where ATen fuses (add_ with alpha and addcmul_):
//   g  = grad * clip
//   p  = p * (1 - lr wd)
//   m  = fma(1 - b1, g, m * b1)
//   v  = fma((1 - b2) * g, g, v * b2)
//   d  = sqrt(v) / sqrt(1 - b2^t) + eps
//   p  = p + (-(lr / (1 - b1^t)) * m) / d
// The scalar constants are computed in double (as Python does) and rounded to f32 once. With
// this order the results equal Debian's torch 1.13 bit for bit on its goldens.
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "offload/state/adamw.h"
#include "src/core/adamw_constants.h"
#include "src/core/bf16.h"
#include "src/core/dtype.h"

namespace strata::adamw_detail {


// The buffers of one update, n elements each. m and v have moment_type (f32 or bf16);
// working (may be null) has working_type (f32 or bf16).
struct AdamWSpan {
  float* master;
  void* m;
  void* v;
  const float* grad;
  void* working;
  DType moment_type;
  DType working_type;
  // bf16 moments rounded back stochastically: element i draws adamw_round_bits(key, counter0 + i)
  bool stochastic = false;
  uint32_t key_m = 0, key_v = 0, counter0 = 0;
};

// Ranges at least this long write the working copy with non-temporal stores (when aligned).
constexpr int64_t kAdamWStreamMin = int64_t(1) << 16;

// Each variant updates elements [begin, end) of the span. Defined in adamw_kernels_<isa>.cpp.
void adamw_kernel_scalar(const AdamWConstants& c, const AdamWSpan& s, int64_t begin, int64_t end);
void adamw_kernel_avx2(const AdamWConstants& c, const AdamWSpan& s, int64_t begin, int64_t end);
void adamw_kernel_avx512(const AdamWConstants& c, const AdamWSpan& s, int64_t begin, int64_t end);

// Moment storage kinds: f32, bf16 rounded to nearest even, bf16 rounded stochastically.
enum : int { kMomentsF32 = 0, kMomentsBf16 = 1, kMomentsBf16Stochastic = 2 };

// Calls run(moment kind, working kind) with both as compile-time std::integral_constant<int>
// (working kind 0: no working copy, 1: f32, 2: bf16), for the span's types: the one place a
// vector kernel's nine instantiations are chosen.
template <class Run>
void adamw_dispatch(const AdamWSpan& s, Run run) {
  const int mk = s.moment_type != DType::bf16 ? kMomentsF32 : s.stochastic ? kMomentsBf16Stochastic : kMomentsBf16;
  const int work = !s.working ? 0 : s.working_type == DType::f32 ? 1 : 2;
  auto with_work = [&](auto moments) {
    if (work == 0) run(moments, std::integral_constant<int, 0>{});
    if (work == 1) run(moments, std::integral_constant<int, 1>{});
    if (work == 2) run(moments, std::integral_constant<int, 2>{});
  };
  if (mk == kMomentsF32) with_work(std::integral_constant<int, kMomentsF32>{});
  if (mk == kMomentsBf16) with_work(std::integral_constant<int, kMomentsBf16>{});
  if (mk == kMomentsBf16Stochastic) with_work(std::integral_constant<int, kMomentsBf16Stochastic>{});
}

// Internal linkage on purpose: each kernel file gets its own copy compiled under its own
// options, so no ISA-specific copy can be picked by the linker for another variant.
namespace {

inline void adamw_step_element(const AdamWConstants& c, float& p, float& m, float& v, float grad) {
  const float g = grad * c.clip;
  const float pd = p * c.decay;
  const float mi = std::fma(c.one_minus_beta1, g, m * c.beta1);
  const float vi = std::fma(c.one_minus_beta2 * g, g, v * c.beta2);
  const float denom = std::sqrt(vi) / c.bc2_sqrt + c.eps;
  p = pd + (c.neg_step_size * mi) / denom;
  m = mi;
  v = vi;
}

// The i-th element of a buffer of f32 or bf16.
inline float adamw_load(const void* buf, DType t, int64_t i) {
  return t == DType::f32 ? static_cast<const float*>(buf)[i]
                         : bf16_to_f32(static_cast<const bf16*>(buf)[i]);
}
inline void adamw_store(void* buf, DType t, int64_t i, float x) {
  if (t == DType::f32) {
    static_cast<float*>(buf)[i] = x;
  } else {
    static_cast<bf16*>(buf)[i] = f32_to_bf16(x);
  }
}

// f32 -> bf16 rounded stochastically with random bits r: the top 16 of r are added to the f32
// bits, which are then truncated (a value between two bf16 rounds up with probability equal to
// its distance from the lower one; exact bf16 values are kept). NaN as f32_to_bf16.
inline bf16 adamw_bf16_stochastic(float x, uint32_t r) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return f32_to_bf16(x);
  return bf16{uint16_t((u + (r >> 16)) >> 16)};
}

inline void adamw_store_moment(const AdamWSpan& s, void* buf, uint32_t key, int64_t i, float x) {
  if (s.moment_type == DType::bf16 && s.stochastic)
    static_cast<bf16*>(buf)[i] = adamw_bf16_stochastic(x, adamw_round_bits(key, s.counter0 + uint32_t(i)));
  else
    adamw_store(buf, s.moment_type, i, x);
}

// Elements [begin, end) one at a time: the scalar variant, and the tails of the vector ones.
inline void adamw_span_scalar(const AdamWConstants& c, const AdamWSpan& s, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    float p = s.master[i];
    float m = adamw_load(s.m, s.moment_type, i);
    float v = adamw_load(s.v, s.moment_type, i);
    adamw_step_element(c, p, m, v, s.grad[i]);
    s.master[i] = p;
    adamw_store_moment(s, s.m, s.key_m, i, m);
    adamw_store_moment(s, s.v, s.key_v, i, v);
    if (s.working) adamw_store(s.working, s.working_type, i, p);
  }
}

}  // namespace
}  // namespace strata::adamw_detail
