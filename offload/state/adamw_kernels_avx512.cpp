// AdamW, the AVX-512 variant: 16 f32 lanes, the same operations in the same order as the
// scalar element step (adamw_kernels.h), fused exactly where it is, so its bits equal the
// scalar variant's. The tail (< 16 elements) runs through the same vector code under a mask.
#pragma GCC optimize("fp-contract=off")
#include <immintrin.h>

#include "offload/state/adamw_kernels.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl")
// GCC 12 flags the deliberate self-initialisation inside _mm512_undefined_ps (used by
// _mm512_sqrt_ps, _mm512_srli_epi32) as maybe-uninitialised; it is not our code.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace strata::adamw_detail {
namespace {

// 16 bf16 -> 16 f32 (lanes outside k read as 0): the bf16 bits are the high half of the f32.
inline __m512 adamw_avx512_load_bf16(const bf16* p, __mmask16 k) {
  const __m256i h = _mm256_maskz_loadu_epi16(k, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// 16 f32 -> 16 bf16 bits, round to nearest even, NaN kept quiet: the integer form of
// f32_to_bf16 (vcvtneps2bf16 would flush subnormal inputs and break agreement with scalar).
// With kStochastic the top 16 of the random bits r are added instead of the tie-to-even bias
// (adamw_bf16_stochastic); NaN as before.
template <bool kStochastic = false>
inline __m256i adamw_avx512_bf16_bits(__m512 x, __m512i r = __m512i{}) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i hi = _mm512_srli_epi32(u, 16);
  __m512i add;
  if constexpr (kStochastic) add = _mm512_srli_epi32(r, 16);
  else add = _mm512_add_epi32(_mm512_and_si512(hi, _mm512_set1_epi32(1)), _mm512_set1_epi32(0x7fff));
  __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, add), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  rounded = _mm512_mask_mov_epi32(rounded, nan, _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
  return _mm512_cvtepi32_epi16(rounded);
}

// adamw_round_bits for 16 consecutive counters c .. c+15
inline __m512i adamw_avx512_round_bits(uint32_t key, uint32_t c) {
  __m512i x = _mm512_add_epi32(_mm512_set1_epi32(int(c)),
                               _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  x = _mm512_xor_si512(x, _mm512_set1_epi32(int(key)));
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
  x = _mm512_mullo_epi32(x, _mm512_set1_epi32(int(0x7feb352du)));
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 15));
  x = _mm512_mullo_epi32(x, _mm512_set1_epi32(int(0x846ca68bu)));
  return _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
}
inline void adamw_avx512_store_bf16(bf16* p, __m512 x, __mmask16 k) {
  _mm256_mask_storeu_epi16(p, k, adamw_avx512_bf16_bits(x));
}

template <int kMoments>
inline __m512 adamw_avx512_load_moment(const void* buf, int64_t i, __mmask16 k) {
  if constexpr (kMoments != kMomentsF32) return adamw_avx512_load_bf16(static_cast<const bf16*>(buf) + i, k);
  else return _mm512_maskz_loadu_ps(k, static_cast<const float*>(buf) + i);
}
template <int kMoments>
inline void adamw_avx512_store_moment(const AdamWSpan& s, void* buf, uint32_t key, int64_t i, __m512 x,
                                      __mmask16 k) {
  if constexpr (kMoments == kMomentsBf16Stochastic)
    _mm256_mask_storeu_epi16(static_cast<bf16*>(buf) + i, k,
                             adamw_avx512_bf16_bits<true>(x, adamw_avx512_round_bits(key, s.counter0 + uint32_t(i))));
  else if constexpr (kMoments == kMomentsBf16) adamw_avx512_store_bf16(static_cast<bf16*>(buf) + i, x, k);
  else _mm512_mask_storeu_ps(static_cast<float*>(buf) + i, k, x);
}

// kWork: 0 no working copy, 1 f32, 2 bf16. Full blocks use mask 0xffff (compiles to plain
// loads and stores); the last partial block a narrower mask. The working copy is write-only, so
// on long aligned ranges it goes out with non-temporal stores (no read for ownership: 2 or 4
// bytes per element less traffic; it is read next by the upload, not by this core).
template <int kMoments, int kWork>
void adamw_avx512_run(const AdamWConstants& c, const AdamWSpan& s, int64_t begin, int64_t end) {
  const size_t work_bytes = kWork == 1 ? 4 : 2;
  const bool stream = kWork != 0 && end - begin >= kAdamWStreamMin &&
                      (reinterpret_cast<uintptr_t>(s.working) + size_t(begin) * work_bytes) % (16 * work_bytes) == 0;
  const __m512 clip = _mm512_set1_ps(c.clip), decay = _mm512_set1_ps(c.decay);
  const __m512 b1 = _mm512_set1_ps(c.beta1), omb1 = _mm512_set1_ps(c.one_minus_beta1);
  const __m512 b2 = _mm512_set1_ps(c.beta2), omb2 = _mm512_set1_ps(c.one_minus_beta2);
  const __m512 bc2s = _mm512_set1_ps(c.bc2_sqrt), eps = _mm512_set1_ps(c.eps);
  const __m512 nss = _mm512_set1_ps(c.neg_step_size);
  auto block = [&](int64_t i, __mmask16 k) __attribute__((always_inline)) {
    const __m512 g = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, s.grad + i), clip);
    const __m512 pd = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, s.master + i), decay);
    __m512 m = adamw_avx512_load_moment<kMoments>(s.m, i, k);
    __m512 v = adamw_avx512_load_moment<kMoments>(s.v, i, k);
    m = _mm512_fmadd_ps(omb1, g, _mm512_mul_ps(m, b1));
    v = _mm512_fmadd_ps(_mm512_mul_ps(omb2, g), g, _mm512_mul_ps(v, b2));
    const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(v), bc2s), eps);
    const __m512 p = _mm512_add_ps(pd, _mm512_div_ps(_mm512_mul_ps(nss, m), denom));
    _mm512_mask_storeu_ps(s.master + i, k, p);
    adamw_avx512_store_moment<kMoments>(s, s.m, s.key_m, i, m, k);
    adamw_avx512_store_moment<kMoments>(s, s.v, s.key_v, i, v, k);
    if constexpr (kWork == 1) {
      if (stream && k == 0xffff) _mm512_stream_ps(static_cast<float*>(s.working) + i, p);
      else _mm512_mask_storeu_ps(static_cast<float*>(s.working) + i, k, p);
    }
    if constexpr (kWork == 2) {
      if (stream && k == 0xffff)
        _mm256_stream_si256(reinterpret_cast<__m256i*>(static_cast<bf16*>(s.working) + i), adamw_avx512_bf16_bits(p));
      else adamw_avx512_store_bf16(static_cast<bf16*>(s.working) + i, p, k);
    }
  };
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) block(i, __mmask16(0xffff));
  if (i < end) block(i, __mmask16((1u << (end - i)) - 1u));
  if (stream) _mm_sfence();  // order the non-temporal stores before whatever reads them next
}

}  // namespace

void adamw_kernel_avx512(const AdamWConstants& c, const AdamWSpan& s, int64_t begin, int64_t end) {
  adamw_dispatch(s, [&](auto moments, auto work) {
    adamw_avx512_run<decltype(moments)::value, decltype(work)::value>(c, s, begin, end);
  });
}

}  // namespace strata::adamw_detail

#pragma GCC pop_options
