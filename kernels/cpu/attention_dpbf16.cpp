// The attention tile products on AVX512-BF16 (vdpbf16ps), and the score products' AMX dispatch.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/amx.h"
#include "kernels/cpu/attention_tiles.h"

namespace strata::cpu {
namespace {

// c (nq, kTileK) = a (nq, dp) · pairs (dp/2, kTileK) on vdpbf16ps: each lane adds the products
// of one (2p, 2p + 1) pair to its f32 sum, pairs in order. a holds bf16 rows, zero-padded.
__attribute__((target("avx512f,avx512bf16"))) void attention_tile_dot_dpbf16(
    float* c, const bf16* a, const uint32_t* pairs, int64_t nq, int64_t dp) {
  constexpr int64_t kRows = 4;
  const int64_t np = dp / 2;
  int64_t i = 0;
  for (; i < nq; i += kRows) {
    const int64_t rows = std::min(kRows, nq - i);
    __m512 acc[kRows][kVecPerTile];
    for (int64_t r = 0; r < kRows; ++r)
      for (int64_t u = 0; u < kVecPerTile; ++u) acc[r][u] = _mm512_setzero_ps();
    if (rows == kRows) {
      for (int64_t p = 0; p < np; ++p) {
        __m512bh b[kVecPerTile];
        for (int64_t u = 0; u < kVecPerTile; ++u)
          b[u] = (__m512bh)_mm512_loadu_si512(pairs + p * kTileK + 16 * u);
        for (int64_t r = 0; r < kRows; ++r) {
          uint32_t w;
          std::memcpy(&w, a + (i + r) * dp + 2 * p, sizeof(w));
          const __m512bh av = (__m512bh)_mm512_set1_epi32(int(w));
          for (int64_t u = 0; u < kVecPerTile; ++u)
            acc[r][u] = _mm512_dpbf16_ps(acc[r][u], av, b[u]);
        }
      }
    } else {
      for (int64_t p = 0; p < np; ++p)
        for (int64_t r = 0; r < rows; ++r) {
          uint32_t w;
          std::memcpy(&w, a + (i + r) * dp + 2 * p, sizeof(w));
          const __m512bh av = (__m512bh)_mm512_set1_epi32(int(w));
          for (int64_t u = 0; u < kVecPerTile; ++u)
            acc[r][u] = _mm512_dpbf16_ps(
                acc[r][u], av, (__m512bh)_mm512_loadu_si512(pairs + p * kTileK + 16 * u));
        }
    }
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t u = 0; u < kVecPerTile; ++u)
        _mm512_storeu_ps(c + (i + r) * kTileK + 16 * u, acc[r][u]);
  }
}

// The products summed over tokens, on vdpbf16ps: c (m, ldc) += a · b, where row r of a is m
// weight pairs a[r * a_rs + p * a_ps] (p < np: tokens 2p, 2p + 1) and b is np row pairs (np, ldb)
// of nv 16-column vectors. Each lane adds the products of one token pair to its f32 sum, pairs in
// order, so every c element has one fixed summation order whatever the blocking: blocks of
// kRows rows by kVecs vectors keep their accumulators in registers across p.
template <int64_t kRows, int64_t kVecs>
__attribute__((target("avx512f,avx512bf16"))) inline void attention_pairs_block(
    float* c, int64_t ldc, const uint32_t* a, int64_t a_rs, int64_t a_ps, const uint32_t* b,
    int64_t ldb, int64_t np) {
  __m512 acc[kRows][kVecs];
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t u = 0; u < kVecs; ++u) acc[r][u] = _mm512_loadu_ps(c + r * ldc + 16 * u);
  for (int64_t p = 0; p < np; ++p) {
    __m512bh bv[kVecs];
    for (int64_t u = 0; u < kVecs; ++u)
      bv[u] = (__m512bh)_mm512_loadu_si512(b + p * ldb + 16 * u);
    for (int64_t r = 0; r < kRows; ++r) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(int(a[r * a_rs + p * a_ps]));
      for (int64_t u = 0; u < kVecs; ++u) acc[r][u] = _mm512_dpbf16_ps(acc[r][u], av, bv[u]);
    }
  }
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t u = 0; u < kVecs; ++u) _mm512_storeu_ps(c + r * ldc + 16 * u, acc[r][u]);
}

template <int64_t kVecs>
__attribute__((target("avx512f,avx512bf16"))) void attention_pairs_cols(
    float* c, int64_t ldc, const uint32_t* a, int64_t a_rs, int64_t a_ps, const uint32_t* b,
    int64_t ldb, int64_t m, int64_t np) {
  constexpr int64_t kRows = 4;
  int64_t r = 0;
  for (; r + kRows <= m; r += kRows)
    attention_pairs_block<kRows, kVecs>(c + r * ldc, ldc, a + r * a_rs, a_rs, a_ps, b, ldb, np);
  for (; r < m; ++r)
    attention_pairs_block<1, kVecs>(c + r * ldc, ldc, a + r * a_rs, a_rs, a_ps, b, ldb, np);
}

}  // namespace

void attention_pairs_gemm(float* c, int64_t ldc, const uint32_t* a, int64_t a_rs, int64_t a_ps,
                          const uint32_t* b, int64_t ldb, int64_t m, int64_t np, int64_t nv) {
  int64_t v = 0;
  for (; v + 4 <= nv; v += 4)
    attention_pairs_cols<4>(c + 16 * v, ldc, a, a_rs, a_ps, b + 16 * v, ldb, m, np);
  const int64_t rest = nv - v;
  if (rest == 3) attention_pairs_cols<3>(c + 16 * v, ldc, a, a_rs, a_ps, b + 16 * v, ldb, m, np);
  if (rest == 2) attention_pairs_cols<2>(c + 16 * v, ldc, a, a_rs, a_ps, b + 16 * v, ldb, m, np);
  if (rest == 1) attention_pairs_cols<1>(c + 16 * v, ldc, a, a_rs, a_ps, b + 16 * v, ldb, m, np);
}

// c (nq, kTileK) = the bf16 rows a_bf · the key pairs over D for one tile, on AMX tiles or
// vdpbf16ps.
void attention_tile_scores_dpbf16(float* c, const bf16* a_bf, const uint32_t* pairs, int64_t nq,
                                  const AttentionShape& s) {
  if (s.amx)
    amx_pairs_gemm(c, kTileK, false, reinterpret_cast<const uint32_t*>(a_bf), s.dp / 2, pairs,
                   kTileK, nq, s.dp / 2, kVecPerTile);
  else
    attention_tile_dot_dpbf16(c, a_bf, pairs, nq, s.dp);
}

}  // namespace strata::cpu
