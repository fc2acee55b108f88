// NF4 dequantization by instruction set (kernels/cpu/nf4_dequantize.h): the per-block scale, the
// scalar, AVX2 and AVX-512 block loops, the run-time choice and the split over threads.
// Compiled with -ffp-contract=off (CMakeLists.txt) like nf4.cpp: the double quantization's
// map[q] · absmax2 + offset is two roundings, as bitsandbytes makes them, never one FMA.
#include "kernels/cpu/nf4_dequantize.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <string_view>

#include "kernels/cpu/nf4.h"
#include "src/core/error.h"

namespace strata::cpu {
namespace {

// Block b's scale: its absmax, or map[qabsmax[b]] · absmax2[b / 256] + offset (two f32 roundings).
// Double-quantized, `absmax` is the nested one and is never read at b.
inline float block_scale(const uint8_t* qabsmax, const float* absmax, float offset, const float* map, int64_t b) {
  if (!qabsmax) return absmax[b];
  const float scaled = map[qabsmax[b]] * absmax[b / kNf4NestedBlock];
  return scaled + offset;
}

// ---- scalar: a 16-entry table per block, two loads per code byte ------------------------------

template <Nf4Out O>
using Elem = std::conditional_t<O == Nf4Out::bf16, bf16, float>;

// Elements [begin, begin + len) of one block (len <= 64; begin even).
template <Nf4Out O>
void scalar_block(Elem<O>* w, const uint8_t* codes, float scale, int64_t begin, int64_t len) {
  const float* code = nf4_code();
  Elem<O> table[16];
  for (int k = 0; k < 16; ++k) {
    const float v = code[k] * scale;
    if constexpr (O == Nf4Out::bf16) table[k] = f32_to_bf16(v);
    else if constexpr (O == Nf4Out::bf16_as_f32) table[k] = bf16_to_f32(f32_to_bf16(v));
    else table[k] = v;
  }
  const uint8_t* c = codes + begin / 2;
  Elem<O>* out = w + begin;
  const int64_t pairs = len / 2;
  for (int64_t j = 0; j < pairs; ++j) {
    out[2 * j] = table[c[j] >> 4];
    out[2 * j + 1] = table[c[j] & 0x0f];
  }
  if (len % 2) out[2 * pairs] = table[c[pairs] >> 4];
}

// Full blocks [b0, b1).
template <Nf4Out O>
void scalar_blocks(Elem<O>* w, const uint8_t* codes, const uint8_t* qabsmax, const float* absmax, float offset,
                   int64_t b0, int64_t b1) {
  const float* map = nf4_dynamic_map();
  for (int64_t b = b0; b < b1; ++b)
    scalar_block<O>(w, codes, block_scale(qabsmax, absmax, offset, map, b), b * kNf4Block, kNf4Block);
}

// ---- AVX2: 8 lookups per pair of vpermps and a blend -------------------------------------------

#pragma GCC push_options
#pragma GCC target("avx2")

// f32 (8) -> their bf16 bits in the low half of each lane: f32_to_bf16's integer rounding.
inline __m256i avx2_bf16_bits(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  return _mm256_blendv_epi8(rounded, quiet, nan);
}

template <Nf4Out O>
void avx2_blocks(Elem<O>* w, const uint8_t* codes, const uint8_t* qabsmax, const float* absmax, float offset,
                 int64_t b0, int64_t b1) {
  const float* map = nf4_dynamic_map();
  const __m256 code_lo = _mm256_loadu_ps(nf4_code()), code_hi = _mm256_loadu_ps(nf4_code() + 8);
  const __m128i low4 = _mm_set1_epi8(15);
  for (int64_t b = b0; b < b1; ++b) {
    const __m256 s = _mm256_set1_ps(block_scale(qabsmax, absmax, offset, map, b));
    __m256 t_lo = _mm256_mul_ps(code_lo, s), t_hi = _mm256_mul_ps(code_hi, s);  // table entries 0-7, 8-15
    if constexpr (O == Nf4Out::bf16) {  // the bf16 bits, in the low half of each lane
      t_lo = _mm256_castsi256_ps(avx2_bf16_bits(t_lo)), t_hi = _mm256_castsi256_ps(avx2_bf16_bits(t_hi));
    } else if constexpr (O == Nf4Out::bf16_as_f32) {
      t_lo = _mm256_castsi256_ps(_mm256_slli_epi32(avx2_bf16_bits(t_lo), 16));
      t_hi = _mm256_castsi256_ps(_mm256_slli_epi32(avx2_bf16_bits(t_hi), 16));
    }
    auto lookup = [&](__m128i idx8) {  // 8 indices in the low 8 bytes -> 8 table entries
      const __m256i i = _mm256_cvtepu8_epi32(idx8);
      return _mm256_blendv_ps(_mm256_permutevar8x32_ps(t_lo, i), _mm256_permutevar8x32_ps(t_hi, i),
                              _mm256_castsi256_ps(_mm256_slli_epi32(i, 28)));  // index bit 3 -> the sign bit
    };
    Elem<O>* out = w + b * kNf4Block;
    for (int h = 0; h < 2; ++h) {  // 16 code bytes = 32 elements
      const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + b * kNf4Block / 2 + 16 * h));
      const __m128i hi = _mm_and_si128(_mm_srli_epi16(x, 4), low4), lo = _mm_and_si128(x, low4);
      const __m128i e[2] = {_mm_unpacklo_epi8(hi, lo), _mm_unpackhi_epi8(hi, lo)};  // elements 0-15, 16-31
      for (int q = 0; q < 2; ++q) {
        const __m256 a = lookup(e[q]), c = lookup(_mm_srli_si128(e[q], 8));
        Elem<O>* o = out + 32 * h + 16 * q;
        if constexpr (O == Nf4Out::bf16) {  // packus interleaves 128-bit lanes; the permute undoes it
          const __m256i packed = _mm256_packus_epi32(_mm256_castps_si256(a), _mm256_castps_si256(c));
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(o), _mm256_permute4x64_epi64(packed, 0xD8));
        } else {
          _mm256_storeu_ps(o, a);
          _mm256_storeu_ps(o + 8, c);
        }
      }
    }
  }
}

#pragma GCC pop_options

// ---- AVX-512: the table in one register, 16 (f32) or 32 (bf16) lookups per permute ------------

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")

inline __m512i avx512_bf16_bits(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
  const __mmask16 nan =
      _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  return _mm512_mask_mov_epi32(rounded, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
}

template <Nf4Out O>
void avx512_blocks(Elem<O>* w, const uint8_t* codes, const uint8_t* qabsmax, const float* absmax, float offset,
                   int64_t b0, int64_t b1) {
  const float* map = nf4_dynamic_map();
  const __m512 code = _mm512_loadu_ps(nf4_code());
  const __m512i low4 = _mm512_set1_epi16(15);
  for (int64_t b = b0; b < b1; ++b) {
    const __m512 t = _mm512_mul_ps(code, _mm512_set1_ps(block_scale(qabsmax, absmax, offset, map, b)));  // (16)
    // the 32 code bytes as words, then as 64 bytes in element order: a byte's high nibble, then its low
    const __m512i v = _mm512_cvtepu8_epi16(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + b * kNf4Block / 2)));
    const __m512i idx = _mm512_or_si512(_mm512_srli_epi16(v, 4), _mm512_slli_epi16(_mm512_and_si512(v, low4), 8));
    Elem<O>* out = w + b * kNf4Block;
    if constexpr (O == Nf4Out::bf16) {
      const __m512i table = _mm512_zextsi256_si512(_mm512_cvtepi32_epi16(avx512_bf16_bits(t)));  // (16) words
      _mm512_storeu_si512(out, _mm512_permutexvar_epi16(_mm512_cvtepu8_epi16(_mm512_castsi512_si256(idx)), table));
      _mm512_storeu_si512(out + 32,
                          _mm512_permutexvar_epi16(_mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(idx, 1)), table));
    } else {
      const __m512 table = O == Nf4Out::f32 ? t : _mm512_castsi512_ps(_mm512_slli_epi32(avx512_bf16_bits(t), 16));
      _mm512_storeu_ps(out, _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(idx, 0)), table));
      _mm512_storeu_ps(out + 16, _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(idx, 1)), table));
      _mm512_storeu_ps(out + 32, _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(idx, 2)), table));
      _mm512_storeu_ps(out + 48, _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(idx, 3)), table));
    }
  }
}

#pragma GCC pop_options

// ---- dispatch ---------------------------------------------------------------------------------

template <Nf4Out O>
void dequantize(Nf4Isa isa, Elem<O>* w, const uint8_t* codes, const uint8_t* qabsmax, const float* absmax,
                float offset, int64_t n) {
  const int64_t full = n / kNf4Block;
  auto blocks = [&](int64_t b0, int64_t b1) {
    switch (isa) {
      case Nf4Isa::avx512: return avx512_blocks<O>(w, codes, qabsmax, absmax, offset, b0, b1);
      case Nf4Isa::avx2: return avx2_blocks<O>(w, codes, qabsmax, absmax, offset, b0, b1);
      case Nf4Isa::scalar: return scalar_blocks<O>(w, codes, qabsmax, absmax, offset, b0, b1);
    }
  };
  // chunks of 256 blocks (16384 weights): a thread's writes never share a cache line with another's
  constexpr int64_t kChunk = 256;
  const int64_t chunks = (full + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n >= kNf4SerialBelow)
  for (int64_t k = 0; k < chunks; ++k) blocks(k * kChunk, std::min(full, (k + 1) * kChunk));
  if (full * kNf4Block < n)  // the last, partial block
    scalar_block<O>(w, codes, block_scale(qabsmax, absmax, offset, nf4_dynamic_map(), full), full * kNf4Block,
                    n - full * kNf4Block);
}

}  // namespace

const char* nf4_isa_name(Nf4Isa isa) {
  constexpr const char* kNames[] = {"scalar", "avx2", "avx512"};  // Nf4Isa's order
  return size_t(isa) < std::size(kNames) ? kNames[size_t(isa)] : "?";
}

bool nf4_isa_supported(Nf4Isa isa) {
  __builtin_cpu_init();
  switch (isa) {
    case Nf4Isa::scalar: return true;
    case Nf4Isa::avx2: return __builtin_cpu_supports("avx2");
    case Nf4Isa::avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  }
  return false;
}

Nf4Isa nf4_isa_active() {
  static const Nf4Isa active = [] {
    Nf4Isa isa = nf4_isa_supported(Nf4Isa::avx512) ? Nf4Isa::avx512
                 : nf4_isa_supported(Nf4Isa::avx2) ? Nf4Isa::avx2
                                                   : Nf4Isa::scalar;
    if (const char* env = std::getenv("STRATA_NF4_ISA"); env && *env) {
      const std::string_view want(env);
      bool found = false;
      for (Nf4Isa c : {Nf4Isa::scalar, Nf4Isa::avx2, Nf4Isa::avx512})
        if (want == nf4_isa_name(c)) isa = c, found = true;
      STRATA_CHECK(found, "STRATA_NF4_ISA=", want, " is not a variant; use scalar, avx2 or avx512");
      STRATA_CHECK(nf4_isa_supported(isa), "STRATA_NF4_ISA=", want,
                   " but this CPU cannot run it; unset it or pick a narrower one");
    }
    return isa;
  }();
  return active;
}

void nf4_dequantize_isa(Nf4Isa isa, Nf4Out out, void* w, const uint8_t* codes, const uint8_t* qabsmax,
                        const float* absmax, float offset, int64_t n) {
  STRATA_CHECK(nf4_isa_supported(isa), "NF4 dequantization: this CPU cannot run the ", nf4_isa_name(isa), " variant");
  STRATA_ASSERT(n >= 0, "NF4 dequantization of ", n, " weights");
  switch (out) {
    case Nf4Out::bf16: return dequantize<Nf4Out::bf16>(isa, static_cast<bf16*>(w), codes, qabsmax, absmax, offset, n);
    case Nf4Out::bf16_as_f32:
      return dequantize<Nf4Out::bf16_as_f32>(isa, static_cast<float*>(w), codes, qabsmax, absmax, offset, n);
    case Nf4Out::f32: return dequantize<Nf4Out::f32>(isa, static_cast<float*>(w), codes, qabsmax, absmax, offset, n);
  }
}

}  // namespace strata::cpu
