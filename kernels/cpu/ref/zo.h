// Plain-loop twins of the zeroth-order kernels (kernels/cpu/zo.h), same argument order.
//  - f32 twins: one element at a time through kernels/common/zo_rng.h, no blocking, no threads;
//    the fast CPU path and the CUDA kernels must equal them bit for bit. They are compiled in
//    kernels/cpu/zo.cpp (contraction off), so only declared here.
//  - fp64 twins: Box–Muller of the same Philox words with the C library's log, sqrt, cos, sin
//    in T, and the ZO-SGD update in T; the f32 code is measured against them.
#pragma once
#include <cmath>
#include <cstdint>

#include "src/core/bf16.h"
#include "kernels/common/zo_rng.h"

namespace strata::ref {

void zo_generate(float* z, uint64_t seed, uint32_t tensor, uint64_t offset, int64_t n);
void zo_perturb_f32(float* p, uint64_t seed, uint32_t tensor, uint64_t offset, float scale,
                    int64_t n);
void zo_perturb_bf16(bf16* p, uint64_t seed, uint32_t tensor, uint64_t offset, float scale,
                     int64_t n);
void zo_sgd_update(float* master, void* working, bool working_bf16, const uint64_t* seeds,
                   const float* coefs, int q, uint32_t tensor, uint64_t offset, float lr,
                   float wd, int64_t n);

// ln(k / 2^24), and sin, cos of 2π j / 2^24, in T.
template <class T>
T zo_ln_unit(uint32_t k) {
  return std::log(T(k) / T(16777216));
}
template <class T>
void zo_sincos_turn(uint32_t j, T* s, T* c) {
  const T angle = T(2) * T(3.14159265358979323846264338327950288L) * (T(j) / T(16777216));
  *s = std::sin(angle);
  *c = std::cos(angle);
}

// z(seed, tensor, element) by Box–Muller in T from the generator's Philox words.
template <class T>
T zo_gaussian(uint64_t seed, uint32_t tensor, uint64_t element) {
  uint32_t w[4];
  zo::zo_block_words(seed, tensor, element >> 2, w[0], w[1], w[2], w[3]);
  const unsigned pair = unsigned(element & 3u) / 2u;
  const T r = std::sqrt(T(-2) * zo_ln_unit<T>((w[2 * pair] >> 8) + 1u));
  T s, c;
  zo_sincos_turn<T>(w[2 * pair + 1] >> 8, &s, &c);
  return (element & 1u) ? r * s : r * c;
}

// master (n) -= lr * (Σ_j coef[j] z_j[i] + wd * master), with z_j (q arrays of n) given.
template <class T>
void zo_sgd_update(T* master, const float* const* z, const T* coefs, int q, T lr, T wd,
                   int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    T gz = 0;
    for (int j = 0; j < q; ++j) gz += coefs[j] * T(z[j][i]);
    master[i] -= lr * (gz + wd * master[i]);
  }
}

}  // namespace strata::ref
