// AdamW, the AVX2 (+FMA) variant: 8 f32 lanes, the same operations in the same order as the
// scalar element step (adamw_kernels.h), fused exactly where it is, so its bits equal the
// scalar variant's. The tail
// (< 8 elements) goes through the scalar step compiled in this file.
#pragma GCC optimize("fp-contract=off")
#include <immintrin.h>

#include "offload/state/adamw_kernels.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma")

namespace strata::adamw_detail {
namespace {

// 8 bf16 -> 8 f32: the bf16 bits are the high half of the f32.
inline __m256 adamw_avx2_load_bf16(const bf16* p) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// 8 f32 -> 8 bf16 bits in 32-bit lanes, round to nearest even, NaN kept quiet: the integer
// form of f32_to_bf16. With kStochastic the top 16 of the random bits r are added instead of
// the tie-to-even bias (adamw_bf16_stochastic); NaN as before.
template <bool kStochastic = false>
inline __m256i adamw_avx2_bf16_bits(__m256 x, __m256i r = __m256i{}) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i hi = _mm256_srli_epi32(u, 16);
  __m256i add;
  if constexpr (kStochastic) add = _mm256_srli_epi32(r, 16);
  else add = _mm256_add_epi32(_mm256_and_si256(hi, _mm256_set1_epi32(1)), _mm256_set1_epi32(0x7fff));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, add), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  return _mm256_blendv_epi8(rounded, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
}

// 8 bf16 bits in 32-bit lanes -> memory
inline void adamw_avx2_pack_store(bf16* p, __m256i r) {
  // values are <= 0xffff, so unsigned saturation never bites; gather qwords 0 and 2
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
}

inline void adamw_avx2_store_bf16(bf16* p, __m256 x) { adamw_avx2_pack_store(p, adamw_avx2_bf16_bits(x)); }

// adamw_round_bits for 8 consecutive counters c .. c+7
inline __m256i adamw_avx2_round_bits(uint32_t key, uint32_t c) {
  __m256i x = _mm256_add_epi32(_mm256_set1_epi32(int(c)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  x = _mm256_xor_si256(x, _mm256_set1_epi32(int(key)));
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(int(0x7feb352du)));
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(int(0x846ca68bu)));
  return _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
}

template <int kMoments>
inline __m256 adamw_avx2_load_moment(const void* buf, int64_t i) {
  if constexpr (kMoments != kMomentsF32) return adamw_avx2_load_bf16(static_cast<const bf16*>(buf) + i);
  else return _mm256_loadu_ps(static_cast<const float*>(buf) + i);
}
template <int kMoments>
inline void adamw_avx2_store_moment(const AdamWSpan& s, void* buf, uint32_t key, int64_t i, __m256 x) {
  if constexpr (kMoments == kMomentsBf16Stochastic)
    adamw_avx2_pack_store(static_cast<bf16*>(buf) + i,
                          adamw_avx2_bf16_bits<true>(x, adamw_avx2_round_bits(key, s.counter0 + uint32_t(i))));
  else if constexpr (kMoments == kMomentsBf16) adamw_avx2_store_bf16(static_cast<bf16*>(buf) + i, x);
  else _mm256_storeu_ps(static_cast<float*>(buf) + i, x);
}

// kWork: 0 no working copy, 1 f32, 2 bf16.
template <int kMoments, int kWork>
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
    __m256 m = adamw_avx2_load_moment<kMoments>(s.m, i);
    __m256 v = adamw_avx2_load_moment<kMoments>(s.v, i);
    m = _mm256_fmadd_ps(omb1, g, _mm256_mul_ps(m, b1));
    v = _mm256_fmadd_ps(_mm256_mul_ps(omb2, g), g, _mm256_mul_ps(v, b2));
    const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(v), bc2s), eps);
    const __m256 p = _mm256_add_ps(pd, _mm256_div_ps(_mm256_mul_ps(nss, m), denom));
    _mm256_storeu_ps(s.master + i, p);
    adamw_avx2_store_moment<kMoments>(s, s.m, s.key_m, i, m);
    adamw_avx2_store_moment<kMoments>(s, s.v, s.key_v, i, v);
    if constexpr (kWork == 1) _mm256_storeu_ps(static_cast<float*>(s.working) + i, p);
    if constexpr (kWork == 2) adamw_avx2_store_bf16(static_cast<bf16*>(s.working) + i, p);
  }
  adamw_span_scalar(c, s, i, end);
}

}  // namespace

void adamw_kernel_avx2(const AdamWConstants& c, const AdamWSpan& s, int64_t begin, int64_t end) {
  adamw_dispatch(s, [&](auto moments, auto work) {
    adamw_avx2_run<decltype(moments)::value, decltype(work)::value>(c, s, begin, end);
  });
}

}  // namespace strata::adamw_detail

#pragma GCC pop_options
