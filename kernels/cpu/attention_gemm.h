// The portable attention kernel's f32 tile products (attention_gemm), register-blocked, fixed order.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/attention_tiles.h"

namespace strata::cpu {

// The portable kernels' vectors are as wide as the compile target's registers: 16 floats with
// AVX-512, 8 with AVX2 (or AVX), 4 otherwise. A generic vector wider than the target is split by
// the compiler through the stack (with 64-byte vectors on an AVX2 CPU these loops ran ~5x
// slower than the same loops in registers). Every output element still sums in the same order
// whatever the width and blocking, so the results do not depend on it.
#if defined(__AVX512F__)
constexpr int64_t kLanes = 16;
#elif defined(__AVX__)
constexpr int64_t kLanes = 8;
#else
constexpr int64_t kLanes = 4;
#endif
typedef float AttentionVec __attribute__((vector_size(kLanes * sizeof(float))));
static_assert(kTileK % kLanes == 0);
// The register block of attention_gemm (rows x column vectors of accumulators): 4 x 4 = 16
// accumulators on AVX-512's 32 registers (4 column vectors and 4 row broadcasts beside them); on
// AVX2's 16, 6 x 2 = 12 with the two column vectors and one broadcast beside them, so each column
// vector is loaded once per x and reused by the six rows (the 3 x 4 block it replaced had GCC
// fold every column load into its FMA: 15 loads per 12 FMAs, load-bound on Zen 3).
constexpr int64_t kDotRows = kLanes == 16 ? 4 : 6;
constexpr int64_t kDotVecs = kLanes == 16 ? 4 : 2;
constexpr int64_t kDotCols = kDotVecs * kLanes;  // 64 (AVX-512) or 16 columns per block
static_assert(kTileK % kDotCols == 0);

inline AttentionVec attention_load_vec(const float* p) {
  AttentionVec v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// c + a b rounded once, where the CPU has FMA: written out, because GCC tuned for AMD Zen leaves a
// single accumulator's chain of multiply-adds uncontracted (multiply, then add: two roundings)
// while it contracts the same expression in a loop of many accumulators, so the bits of a sum
// would depend on how many accumulators its block had.
inline AttentionVec attention_fma(float a, AttentionVec b, AttentionVec c) {
#if defined(__AVX512F__)
  return AttentionVec(_mm512_fmadd_ps(_mm512_set1_ps(a), __m512(b), __m512(c)));
#elif defined(__AVX__) && defined(__FMA__)
  return AttentionVec(_mm256_fmadd_ps(_mm256_set1_ps(a), __m256(b), __m256(c)));
#else
  return a * b + c;
#endif
}

inline float attention_fma(float a, float b, float c) {
#if defined(__FMA__)
  return std::fma(a, b, c);
#else
  return a * b + c;
#endif
}

// c (m, n) = a · b, or c += a · b, over a range of the inner index x: the portable kernel's
// products (the scores Q K^T and dO V^T, P V, dS K, P^T dO and dS^T Q) and the vdpbf16ps
// forward's P V. a's element (r, x) is a[r * a_rs + x * a_cs] (a row-major tile or its transpose,
// read in place), b (x, n) is row-major with row stride ldb, c (m, n) has row stride ldc. Row r
// sums x over [lo[r], hi[r]] (all of [0, k) when lo is null) in ascending order, from c's value
// (`add`) or from zero, so each element has that one summation order whatever the blocking. Rows
// run kDotRows at a time, their accumulators in registers across x, each block over the union of
// its rows' ranges: a must be zero (and b finite) where a row's x lies in its block's range but
// outside its own, where P and dS hold their masked zeros (which add nothing but may turn the
// sign of an exact zero sum).
template <int64_t kRows, int64_t kVecs>
inline void attention_gemm_block(float* c, int64_t ldc, const float* a, int64_t a_rs, int64_t a_cs,
                                 const float* b, int64_t ldb, int64_t x0, int64_t x1, bool add) {
  AttentionVec acc[kRows][kVecs];
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t u = 0; u < kVecs; ++u)
      acc[r][u] = add ? attention_load_vec(c + r * ldc + kLanes * u) : AttentionVec{};
  for (int64_t x = x0; x <= x1; ++x) {
    AttentionVec bv[kVecs];
    for (int64_t u = 0; u < kVecs; ++u) bv[u] = attention_load_vec(b + x * ldb + kLanes * u);
    for (int64_t r = 0; r < kRows; ++r) {
      const float ar = a[r * a_rs + x * a_cs];
      for (int64_t u = 0; u < kVecs; ++u) acc[r][u] = attention_fma(ar, bv[u], acc[r][u]);
    }
  }
  for (int64_t r = 0; r < kRows; ++r) std::memcpy(c + r * ldc, acc[r], sizeof(acc[r]));
}

template <int64_t kRows>
void attention_gemm_rows(float* c, int64_t ldc, const float* a, int64_t a_rs, int64_t a_cs,
                         const float* b, int64_t ldb, int64_t n, int64_t k, const int64_t* lo,
                         const int64_t* hi, bool add) {
  int64_t x0 = 0, x1 = k - 1;
  if (lo) {
    x0 = k, x1 = -1;
    for (int64_t r = 0; r < kRows; ++r)
      if (lo[r] <= hi[r]) x0 = std::min(x0, lo[r]), x1 = std::max(x1, hi[r]);
  }
  int64_t j = 0;
  for (; j + kDotCols <= n; j += kDotCols)
    attention_gemm_block<kRows, kDotVecs>(c + j, ldc, a, a_rs, a_cs, b + j, ldb, x0, x1, add);
  for (; j + kLanes <= n; j += kLanes)
    attention_gemm_block<kRows, 1>(c + j, ldc, a, a_rs, a_cs, b + j, ldb, x0, x1, add);
  for (; j < n; ++j)
    for (int64_t r = 0; r < kRows; ++r) {
      float acc = add ? c[r * ldc + j] : 0.f;
      for (int64_t x = x0; x <= x1; ++x) acc = attention_fma(a[r * a_rs + x * a_cs], b[x * ldb + j], acc);
      c[r * ldc + j] = acc;
    }
}

inline void attention_gemm(float* c, int64_t ldc, const float* a, int64_t a_rs, int64_t a_cs,
                    const float* b, int64_t ldb, int64_t m, int64_t n, int64_t k, const int64_t* lo,
                    const int64_t* hi, bool add) {
  int64_t r = 0;
  for (; r + kDotRows <= m; r += kDotRows)
    attention_gemm_rows<kDotRows>(c + r * ldc, ldc, a + r * a_rs, a_rs, a_cs, b, ldb, n, k,
                                  lo ? lo + r : nullptr, lo ? hi + r : nullptr, add);
  // The last m mod kDotRows rows (64 = 10 x 6 + 4 on AVX2) in one narrower block where they
  // can, rather than one row at a time.
  const auto tail = [&]<int64_t kRows>() {
    for (; r + kRows <= m; r += kRows)
      attention_gemm_rows<kRows>(c + r * ldc, ldc, a + r * a_rs, a_rs, a_cs, b, ldb, n, k,
                                 lo ? lo + r : nullptr, lo ? hi + r : nullptr, add);
  };
  if constexpr (kDotRows > 4) tail.template operator()<4>();
  if constexpr (kDotRows > 2) tail.template operator()<2>();
  tail.template operator()<1>();
}

}  // namespace strata::cpu
