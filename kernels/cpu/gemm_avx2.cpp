// strata's own f32 GEMM tile for AVX2 + FMA (kernels/cpu/gemm_avx2.h says what it computes).
//
// Why by hand: oneDNN 2.6's AVX2 f32 matmul ran the mid model's 256 x 256 tiles at 60-75% of
// the FMA units' peak on an AMD EPYC (Zen 3), and 18-33% slower still when a was transposed or
// b stored (K, N); the repacking strata did to feed it (a transposed a along K, a b restrided)
// cost copies of its own. Here both operands are packed once into the kernel's panels, so every
// layout runs the same inner loop. The kernel is the usual register block (as in BLIS and
// OpenBLAS's Haswell kernels): 6 rows x 16 columns of c in 12 ymm accumulators, each step along K
// loading 16 floats of b and broadcasting 6 of a into 12 FMAs; alone, in L1, it runs at ~90% of a
// core's FMA peak. Blocks: kGemmKc steps of K (a 16-column panel of b, 32 KiB, streams through L1
// while the 6-row panels of a pass it) and kGemmMc rows of a (72 x 512 floats, 144 KiB, in L2).
// Measured on Zen 3 (two tiles at a time, one per core, alternated in one process): K blocks of
// 512 ran 2-9% faster than 256 (fewer passes adding into c), 128 slower; 48, 72 or 96 rows alike.
#include "kernels/cpu/gemm_avx2.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include <immintrin.h>

#include "src/core/bf16.h"

namespace strata::cpu {
namespace {

#define STRATA_AVX2 __attribute__((target("avx2,fma")))

constexpr int64_t kGemmKc = 512, kGemmMc = 72;  // kGemmMc: a multiple of kGemmMr
static_assert(kGemmMc % kGemmMr == 0);

STRATA_AVX2 inline __m256 gemm_load8(const float* p) { return _mm256_loadu_ps(p); }
STRATA_AVX2 inline __m256 gemm_load8(const bf16* p) {  // bf16 -> f32: the bits shifted up (exact)
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
inline float gemm_to_f32(float x) { return x; }
inline float gemm_to_f32(bf16 x) { return bf16_to_f32(x); }

// r[i] = column i of the 8 x 8 block whose rows were r[0..7].
STRATA_AVX2 inline void gemm_transpose8(__m256 r[8]) {
  __m256 t[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  __m256 u[8];
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

// A panel of `width` (6 or 16) lanes from up to `width` source rows that each run along K
// (rows[r] null: a zero row): dst (K, width), dst[p * width + r] = rows[r][p]. Eight rows at a
// time through an 8 x 8 register transpose; a 6-wide panel takes its 8-row block's first 6 lanes.
template <class T>
STRATA_AVX2 void gemm_pack_rows(float* dst, const T* const* rows, int width, int64_t k) {
  const int64_t k8 = k - k % 8;
  for (int g = 0; g < width; g += 8) {
    const int lanes = std::min(8, width - g);
    for (int64_t p = 0; p < k8; p += 8) {
      __m256 r[8];
      for (int i = 0; i < 8; ++i) r[i] = i < lanes && rows[g + i] ? gemm_load8(rows[g + i] + p) : _mm256_setzero_ps();
      gemm_transpose8(r);
      for (int i = 0; i < 8; ++i) {
        float* d = dst + (p + i) * width + g;
        if (lanes == 8) {
          _mm256_storeu_ps(d, r[i]);
        } else {  // 6 lanes: 4 + 2
          _mm_storeu_ps(d, _mm256_castps256_ps128(r[i]));
          _mm_storel_pi(reinterpret_cast<__m64*>(d + 4), _mm256_extractf128_ps(r[i], 1));
        }
      }
    }
    for (int64_t p = k8; p < k; ++p)
      for (int i = 0; i < lanes; ++i) dst[p * width + g + i] = rows[g + i] ? gemm_to_f32(rows[g + i][p]) : 0.f;
  }
}

// Panels of `width` lanes whose K rows are contiguous in the source: panel q (at dst + q * width
// * k) gets dst[p * width + r] = src[p * ld + q * width + r] for lanes up to count, 0 past it.
// In blocks of K rows, each block's rows copied into every panel before the next block (a
// 6-lane panel takes a quarter of a cache line per row: walking K panel by panel read every
// line again, at ~4.6 GB/s).
template <class T>
STRATA_AVX2 void gemm_pack_cols(float* dst, const T* src, int64_t ld, int width, int64_t count, int64_t k) {
  constexpr int64_t kRows = 32;
  for (int64_t p0 = 0; p0 < k; p0 += kRows) {
    const int64_t p1 = std::min(k, p0 + kRows);
    for (int64_t q = 0; q < count; q += width) {
      const int valid = int(std::min<int64_t>(width, count - q));
      float* d = dst + q * k;
      for (int64_t p = p0; p < p1; ++p) {
        const T* s = src + p * ld + q;
        float* dp = d + p * width;
        if (valid == width && width == kGemmNr) {
          _mm256_storeu_ps(dp, gemm_load8(s));
          _mm256_storeu_ps(dp + 8, gemm_load8(s + 8));
        } else if (valid == width && width == kGemmMr && std::is_same_v<T, float>) {
          const float* f = reinterpret_cast<const float*>(s);
          _mm_storeu_ps(dp, _mm_loadu_ps(f));
          _mm_storel_pi(reinterpret_cast<__m64*>(dp + 4), _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(f + 4))));
        } else {
          for (int r = 0; r < valid; ++r) dp[r] = gemm_to_f32(s[r]);
          for (int r = valid; r < width; ++r) dp[r] = 0.f;
        }
      }
    }
  }
}

// Panels of `width` lanes for the lanes [l0, l0 + count) of x: each lane a row of x (stored with
// lanes as rows, row stride ld: along K contiguous) when lanes_are_rows, else a column (x stored
// (K, lanes), row stride ld).
template <class T>
STRATA_AVX2 void gemm_pack(float* dst, const T* x, int64_t ld, bool lanes_are_rows, int width, int64_t l0,
                           int64_t count, int64_t k) {
  if (!lanes_are_rows) {
    gemm_pack_cols(dst, x + l0, ld, width, count, k);
    return;
  }
  for (int64_t q = 0; q < count; q += width) {
    const int valid = int(std::min<int64_t>(width, count - q));
    const T* rows[kGemmNr];
    for (int r = 0; r < width; ++r) rows[r] = r < valid ? x + (l0 + q + r) * ld : nullptr;
    gemm_pack_rows(dst + q * k, rows, width, k);
  }
}

// c's 6 x 16 block (row stride ldc) = (accumulate: c +) the sum over kc steps of a's 6 rows
// times b's 16-column panel. a's row r at step p is a[r * lda + p] (Direct: rows of the stored
// matrix) or a[p * kGemmMr + r] (a packed panel).
template <bool Direct>
STRATA_AVX2 inline void gemm_block(int64_t kc, const float* __restrict a, int64_t lda, const float* __restrict b,
                                   float* c, int64_t ldc, bool accumulate) {
  for (int r = 0; r < kGemmMr; ++r) {  // c's rows, in cache by the time the sums are done
    _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc + kGemmNr - 1), _MM_HINT_T0);
  }
  const int64_t rs = Direct ? lda : 1, ps = Direct ? 1 : kGemmMr;
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00,
         c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
#pragma GCC unroll 4
  for (int64_t p = 0; p < kc; ++p) {
    const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
    __m256 x = _mm256_broadcast_ss(a);
    c00 = _mm256_fmadd_ps(x, b0, c00), c01 = _mm256_fmadd_ps(x, b1, c01);
    x = _mm256_broadcast_ss(a + rs);
    c10 = _mm256_fmadd_ps(x, b0, c10), c11 = _mm256_fmadd_ps(x, b1, c11);
    x = _mm256_broadcast_ss(a + 2 * rs);
    c20 = _mm256_fmadd_ps(x, b0, c20), c21 = _mm256_fmadd_ps(x, b1, c21);
    x = _mm256_broadcast_ss(a + 3 * rs);
    c30 = _mm256_fmadd_ps(x, b0, c30), c31 = _mm256_fmadd_ps(x, b1, c31);
    x = _mm256_broadcast_ss(a + 4 * rs);
    c40 = _mm256_fmadd_ps(x, b0, c40), c41 = _mm256_fmadd_ps(x, b1, c41);
    x = _mm256_broadcast_ss(a + 5 * rs);
    c50 = _mm256_fmadd_ps(x, b0, c50), c51 = _mm256_fmadd_ps(x, b1, c51);
    a += ps, b += kGemmNr;
  }
  const __m256 rows[kGemmMr][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
  for (int r = 0; r < kGemmMr; ++r) {
    float* cr = c + r * ldc;
    __m256 lo = rows[r][0], hi = rows[r][1];
    if (accumulate) lo = _mm256_add_ps(_mm256_loadu_ps(cr), lo), hi = _mm256_add_ps(_mm256_loadu_ps(cr + 8), hi);
    _mm256_storeu_ps(cr, lo);
    _mm256_storeu_ps(cr + 8, hi);
  }
}

}  // namespace

bool gemm_avx2_available() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok;
}

void gemm_pack_a(float* dst, const void* a, bool bf16, int64_t ld, bool trans, int64_t i0, int64_t tm, int64_t k) {
  // op(a)'s rows run along K in a stored (M, K); in a stored (K, M) they are its columns
  if (bf16) gemm_pack(dst, static_cast<const strata::bf16*>(a), ld, !trans, int(kGemmMr), i0, tm, k);
  else gemm_pack(dst, static_cast<const float*>(a), ld, !trans, int(kGemmMr), i0, tm, k);
}

void gemm_pack_b(float* dst, const void* b, bool bf16, int64_t ld, bool trans, int64_t j0, int64_t tn, int64_t k) {
  // op(b)'s columns are b's rows when b is stored (N, K)
  if (bf16) gemm_pack(dst, static_cast<const strata::bf16*>(b), ld, trans, int(kGemmNr), j0, tn, k);
  else gemm_pack(dst, static_cast<const float*>(b), ld, trans, int(kGemmNr), j0, tn, k);
}

STRATA_AVX2 void gemm_tile(float* c, int64_t ldc, const float* a_rows, int64_t lda, const float* a_packed,
                           const float* b_packed, int64_t tm, int64_t tn, int64_t k) {
  alignas(32) float edge[kGemmMr * kGemmNr] = {};  // a block past tm or tn, before its valid part is copied
  const int64_t tm_full = tm - tm % kGemmMr;  // a_rows: the rows of whole panels
  for (int64_t p0 = 0; p0 < k; p0 += kGemmKc) {
    const int64_t kc = std::min(kGemmKc, k - p0);
    const bool accumulate = p0 > 0;
    for (int64_t ic = 0; ic < tm; ic += kGemmMc) {
      const int64_t i1 = std::min(tm, ic + kGemmMc);
      for (int64_t jr = 0; jr < tn; jr += kGemmNr) {
        const int64_t nr = std::min(kGemmNr, tn - jr);
        const float* b = b_packed + jr * k + p0 * kGemmNr;
        for (int64_t ir = ic; ir < i1; ir += kGemmMr) {
          const int64_t mr = std::min(kGemmMr, tm - ir);
          const bool direct = a_rows && ir < tm_full;
          // packed: the panel of row ir (with a_rows only the last, partial one is packed)
          const float* a = direct ? a_rows + ir * lda + p0 : a_packed + (a_rows ? 0 : ir * k) + p0 * kGemmMr;
          float* cb = c + ir * ldc + jr;
          float* out = cb;
          int64_t ldo = ldc;
          if (mr < kGemmMr || nr < kGemmNr) {
            out = edge, ldo = kGemmNr;
            if (accumulate)
              for (int64_t r = 0; r < mr; ++r) std::memcpy(edge + r * kGemmNr, cb + r * ldc, size_t(nr) * sizeof(float));
          }
          if (direct) gemm_block<true>(kc, a, lda, b, out, ldo, accumulate);
          else gemm_block<false>(kc, a, 0, b, out, ldo, accumulate);
          if (out == edge)
            for (int64_t r = 0; r < mr; ++r) std::memcpy(cb + r * ldc, edge + r * kGemmNr, size_t(nr) * sizeof(float));
        }
      }
    }
  }
}

}  // namespace strata::cpu
