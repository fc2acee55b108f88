// AdamW, the AVX2 (+FMA) variant: 8 f32 lanes, the same operations in the same order as the
// scalar element step (adamw_kernels.h), fused exactly where it is, so its bits equal the
// scalar variant's. The tail
// (< 8 elements) goes through the scalar step compiled in this file.
#pragma GCC optimize("fp-contract=off")
#include <immintrin.h>

#include "offload/adamw_kernels.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma")

namespace strata::adamw_detail {
namespace {

// 8 bf16 -> 8 f32: the bf16 bits are the high half of the f32.
inline __m256 adamw_avx2_load_bf16(const bf16* p) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// 8 f32 -> 8 bf16, round to nearest even, NaN kept quiet: the integer form of f32_to_bf16.
inline void adamw_avx2_store_bf16(bf16* p, __m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i hi = _mm256_srli_epi32(u, 16);
  const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
  // values are <= 0xffff, so unsigned saturation never bites; gather qwords 0 and 2
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
}

template <bool kBf16Moments>
inline __m256 adamw_avx2_load_moment(const void* buf, int64_t i) {
  if constexpr (kBf16Moments) return adamw_avx2_load_bf16(static_cast<const bf16*>(buf) + i);
  else return _mm256_loadu_ps(static_cast<const float*>(buf) + i);
}
template <bool kBf16Moments>
inline void adamw_avx2_store_moment(void* buf, int64_t i, __m256 x) {
  if constexpr (kBf16Moments) adamw_avx2_store_bf16(static_cast<bf16*>(buf) + i, x);
  else _mm256_storeu_ps(static_cast<float*>(buf) + i, x);
}

// kWork: 0 no working copy, 1 f32, 2 bf16.
template <bool kBf16Moments, int kWork>
void adamw_avx2_run(const AdamWConstants& c, const AdamWSpan& s, int64_t begin, int64_t end) {
  const __m256 clip = _mm256_set1_ps(c.clip), decay = _mm256_set1_ps(c.decay);
  const __m256 b1 = _mm256_set1_ps(c.beta1), omb1 = _mm256_set1_ps(c.one_minus_beta1);
  const __m256 b2 = _mm256_set1_ps(c.beta2), omb2 = _mm256_set1_ps(c.one_minus_beta2);
  const __m256 bc2s = _mm256_set1_ps(c.bc2_sqrt), eps = _mm256_set1_ps(c.eps);
  const __m256 nss = _mm256_set1_ps(c.neg_step_size);
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    const __m256 g = _mm256_mul_ps(_mm256_loadu_ps(s.grad + i), clip);
    const __m256 pd = _mm256_mul_ps(_mm256_loadu_ps(s.master + i), decay);
    __m256 m = adamw_avx2_load_moment<kBf16Moments>(s.m, i);
    __m256 v = adamw_avx2_load_moment<kBf16Moments>(s.v, i);
    m = _mm256_fmadd_ps(omb1, g, _mm256_mul_ps(m, b1));
    v = _mm256_fmadd_ps(_mm256_mul_ps(omb2, g), g, _mm256_mul_ps(v, b2));
    const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(v), bc2s), eps);
    const __m256 p = _mm256_add_ps(pd, _mm256_div_ps(_mm256_mul_ps(nss, m), denom));
    _mm256_storeu_ps(s.master + i, p);
    adamw_avx2_store_moment<kBf16Moments>(s.m, i, m);
    adamw_avx2_store_moment<kBf16Moments>(s.v, i, v);
    if constexpr (kWork == 1) _mm256_storeu_ps(static_cast<float*>(s.working) + i, p);
    if constexpr (kWork == 2) adamw_avx2_store_bf16(static_cast<bf16*>(s.working) + i, p);
  }
  adamw_span_scalar(c, s, i, end);
}

}  // namespace

void adamw_kernel_avx2(const AdamWConstants& c, const AdamWSpan& s, int64_t begin, int64_t end) {
  adamw_dispatch(s, [&](auto moments_bf16, auto work) {
    adamw_avx2_run<decltype(moments_bf16)::value, decltype(work)::value>(c, s, begin, end);
  });
}

}  // namespace strata::adamw_detail

#pragma GCC pop_options
