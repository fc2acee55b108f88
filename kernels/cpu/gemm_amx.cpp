// strata's AMX bf16 GEMM tile (see gemm_amx.h). The tile intrinsics name their tiles by number:
// 0-3 the accumulators of a 32 x 32 block of c (0: rows 0-15 x columns 0-15, 1: rows 0-15 x
// 16-31, 2: rows 16-31 x 0-15, 3: rows 16-31 x 16-31), 4 and 5 the two a tiles of a chunk, 6 and 7
// its two b tiles. Every tile is 16 rows of 64 bytes, configured once per call.
#include "kernels/cpu/gemm_amx.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/amx.h"
#include "src/core/error.h"

namespace strata::cpu {
namespace {

constexpr int64_t kChunk = 32;       // bf16 values of K a tile covers: 16 words
constexpr int64_t kBlock = 32;       // rows and columns of c a block covers
constexpr int64_t kTileWords = 256;  // 16 rows of 16 words

int64_t chunks_of(int64_t k) { return (k + kChunk - 1) / kChunk; }
int64_t blocks16_of(int64_t count) { return (count + kBlock - 1) / kBlock * 2; }

uint32_t pair(uint16_t lo, uint16_t hi) { return uint32_t(lo) | uint32_t(hi) << 16; }

void configure_tiles() {
  AmxTileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  amx_load_tile_config(cfg);
}

// One 32 x 32 block of c into out (row stride ldo floats) over `chunks` chunks.
__attribute__((target("amx-tile,amx-bf16"))) void block_32x32(float* out, int64_t ldo, const uint32_t* a0,
                                                              const uint32_t* a1, const uint32_t* b0,
                                                              const uint32_t* b1, int64_t chunks) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t q = 0; q < chunks; ++q) {
    const int64_t at = q * kTileWords;
    _tile_loadd(4, a0 + at, 64);
    _tile_loadd(6, b0 + at, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_loadd(7, b1 + at, 64);
    _tile_dpbf16ps(1, 4, 7);
    _tile_loadd(5, a1 + at, 64);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  const int64_t s = ldo * 4;
  _tile_stored(0, out, s);
  _tile_stored(1, out + 16, s);
  _tile_stored(2, out + 16 * ldo, s);
  _tile_stored(3, out + 16 * ldo + 16, s);
}

__attribute__((target("amx-tile"))) void release_tiles() { _tile_release(); }

}  // namespace

bool gemm_amx_available() { return amx_bf16_available(); }

int64_t gemm_amx_packed_words(int64_t count, int64_t k) { return blocks16_of(count) * chunks_of(k) * kTileWords; }

namespace {

// The scalar packer: any shape, any stride; zero past `count` and past K. op(x)'s value at index i
// (a row of op(a), a column of op(b)) and position kk of K: x stored index-major (kk contiguous)
// or, when k_major, K-major. A packed a's tile holds an index per row (16 words of pairs); a
// packed b's holds a pair per row (16 indices), so pairs_as_rows.
void pack_scalar(uint32_t* dst, const uint16_t* v, int64_t ld, bool k_major, int64_t i0, int64_t count,
                 int64_t k, bool pairs_as_rows) {
  const int64_t chunks = chunks_of(k), blocks = blocks16_of(count);
  const auto at = [&](int64_t i, int64_t kk) { return k_major ? v[kk * ld + i] : v[i * ld + kk]; };
  for (int64_t blk = 0; blk < blocks; ++blk)
    for (int64_t q = 0; q < chunks; ++q) {
      uint32_t* tile = dst + (blk * chunks + q) * kTileWords;
      for (int64_t r = 0; r < 16; ++r) {  // the index within the block
        const int64_t idx = blk * 16 + r;
        for (int64_t w = 0; w < 16; ++w) {  // the pair within the chunk
          const int64_t k0 = q * kChunk + 2 * w;
          const uint16_t lo = idx < count && k0 < k ? at(i0 + idx, k0) : 0;
          const uint16_t hi = idx < count && k0 + 1 < k ? at(i0 + idx, k0 + 1) : 0;
          tile[pairs_as_rows ? w * 16 + r : r * 16 + w] = pair(lo, hi);
        }
      }
    }
}

// 16 words: x0[j] (low half) and x1[j] (high half) for j = 0..15.
__attribute__((target("avx512f"))) inline __m512i interleave16(const uint16_t* x0, const uint16_t* x1) {
  const __m512i lo = _mm512_maskz_cvtepu16_epi32(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x0)));
  const __m512i hi = _mm512_maskz_cvtepu16_epi32(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x1)));
  return _mm512_or_si512(lo, _mm512_maskz_slli_epi32(0xFFFF, hi, 16));
}

// dst[r * 16 + w] = word r of x[w], r and w in 0..15: a 16 x 16 transpose of 32-bit words in
// registers (unpacks within 128-bit lanes, then a 4 x 4 transpose of the lanes). The maskz forms
// with every lane set are the plain ones; GCC 12 warns of the plain ones' undefined operand.
__attribute__((target("avx512f"))) inline void store_transposed16(uint32_t* dst, const __m512i x[16]) {
  __m512i u[16];  // u[4g + e], lane L: words 4L + e of x[4g .. 4g + 3]
  for (int g = 0; g < 4; ++g) {
    const __m512i t0 = _mm512_maskz_unpacklo_epi32(0xFFFF, x[4 * g], x[4 * g + 1]), t1 = _mm512_maskz_unpackhi_epi32(0xFFFF, x[4 * g], x[4 * g + 1]);
    const __m512i t2 = _mm512_maskz_unpacklo_epi32(0xFFFF, x[4 * g + 2], x[4 * g + 3]), t3 = _mm512_maskz_unpackhi_epi32(0xFFFF, x[4 * g + 2], x[4 * g + 3]);
    u[4 * g] = _mm512_maskz_unpacklo_epi64(0xFF, t0, t2);
    u[4 * g + 1] = _mm512_maskz_unpackhi_epi64(0xFF, t0, t2);
    u[4 * g + 2] = _mm512_maskz_unpacklo_epi64(0xFF, t1, t3);
    u[4 * g + 3] = _mm512_maskz_unpackhi_epi64(0xFF, t1, t3);
  }
  for (int e = 0; e < 4; ++e) {  // row 4L + e gathers lane L of u[e], u[4 + e], u[8 + e], u[12 + e]
    const __m512i v0 = _mm512_maskz_shuffle_i32x4(0xFFFF, u[e], u[4 + e], 0x44), v1 = _mm512_maskz_shuffle_i32x4(0xFFFF, u[e], u[4 + e], 0xEE);
    const __m512i v2 = _mm512_maskz_shuffle_i32x4(0xFFFF, u[8 + e], u[12 + e], 0x44), v3 = _mm512_maskz_shuffle_i32x4(0xFFFF, u[8 + e], u[12 + e], 0xEE);
    _mm512_storeu_si512(dst + e * 16, _mm512_maskz_shuffle_i32x4(0xFFFF, v0, v2, 0x88));
    _mm512_storeu_si512(dst + (4 + e) * 16, _mm512_maskz_shuffle_i32x4(0xFFFF, v0, v2, 0xDD));
    _mm512_storeu_si512(dst + (8 + e) * 16, _mm512_maskz_shuffle_i32x4(0xFFFF, v1, v3, 0x88));
    _mm512_storeu_si512(dst + (12 + e) * 16, _mm512_maskz_shuffle_i32x4(0xFFFF, v1, v3, 0xDD));
  }
}

// The vector packers: whole 32-row (32-column) blocks and K a multiple of 32 only.
__attribute__((target("avx512f"))) void pack_a_fast(uint32_t* dst, const uint16_t* v, int64_t lda, bool trans_a,
                                                    int64_t i0, int64_t tm, int64_t k) {
  const int64_t chunks = k / kChunk, blocks = tm / 16;
  for (int64_t rb = 0; rb < blocks; ++rb) {
    const int64_t i = i0 + rb * 16;
    if (!trans_a) {  // rows of a are already pairs along K: each row read straight along, 64 bytes a tile
      for (int64_t r = 0; r < 16; ++r) {
        const uint16_t* row = v + (i + r) * lda;
        for (int64_t q = 0; q < chunks; ++q)
          std::memcpy(dst + (rb * chunks + q) * kTileWords + r * 16, row + q * kChunk, 64);
      }
      continue;
    }
    for (int64_t q = 0; q < chunks; ++q) {  // pair w of rows i..i+15 from a's rows k0 + 2w, k0 + 2w + 1
      const int64_t k0 = q * kChunk;
      __m512i x[16];
      for (int64_t w = 0; w < 16; ++w) x[w] = interleave16(v + (k0 + 2 * w) * lda + i, v + (k0 + 2 * w + 1) * lda + i);
      store_transposed16(dst + (rb * chunks + q) * kTileWords, x);
    }
  }
}

__attribute__((target("avx512f"))) void pack_b_fast(uint32_t* dst, const uint16_t* v, int64_t ldb, bool trans_b,
                                                    int64_t j0, int64_t tn, int64_t k) {
  const int64_t chunks = k / kChunk, panels = tn / 16;
  for (int64_t pb = 0; pb < panels; ++pb)
    for (int64_t q = 0; q < chunks; ++q) {
      uint32_t* tile = dst + (pb * chunks + q) * kTileWords;
      const int64_t j = j0 + pb * 16, k0 = q * kChunk;
      if (trans_b) {  // b's rows j..j+15 hold 16 pairs each along K: the tile is their transpose
        __m512i x[16];
        for (int64_t r = 0; r < 16; ++r) x[r] = _mm512_loadu_si512(v + (j + r) * ldb + k0);
        store_transposed16(tile, x);
        continue;
      }
      for (int64_t p = 0; p < 16; ++p)
        _mm512_storeu_si512(tile + p * 16, interleave16(v + (k0 + 2 * p) * ldb + j, v + (k0 + 2 * p + 1) * ldb + j));
    }
}

}  // namespace

void gemm_amx_pack_a(uint32_t* dst, const bf16* a, int64_t lda, bool trans_a, int64_t i0, int64_t tm,
                     int64_t k) {
  const auto* v = reinterpret_cast<const uint16_t*>(a);
  static const bool vector = __builtin_cpu_supports("avx512f");
  if (vector && k % kChunk == 0 && tm % kBlock == 0)
    pack_a_fast(dst, v, lda, trans_a, i0, tm, k);
  else
    pack_scalar(dst, v, lda, trans_a, i0, tm, k, false);
}

void gemm_amx_pack_b(uint32_t* dst, const bf16* b, int64_t ldb, bool trans_b, int64_t j0, int64_t tn,
                     int64_t k) {
  const auto* v = reinterpret_cast<const uint16_t*>(b);
  static const bool vector = __builtin_cpu_supports("avx512f");
  if (vector && k % kChunk == 0 && tn % kBlock == 0)
    pack_b_fast(dst, v, ldb, trans_b, j0, tn, k);
  else
    pack_scalar(dst, v, ldb, !trans_b, j0, tn, k, true);
}

void gemm_amx_tile(float* c, int64_t ldc, const uint32_t* a, const uint32_t* b, int64_t tm, int64_t tn,
                   int64_t k) {
  STRATA_ASSERT(gemm_amx_available(), "gemm_amx_tile: this CPU or OS offers no AMX-BF16");
  if (tm <= 0 || tn <= 0) return;
  const int64_t chunks = chunks_of(k);
  if (chunks == 0) {
    for (int64_t i = 0; i < tm; ++i) std::fill(c + i * ldc, c + i * ldc + tn, 0.f);
    return;
  }
  const int64_t block_words = chunks * kTileWords;  // one 16-row block's (or 16-column panel's) tiles
  configure_tiles();
  alignas(64) float edge[kBlock * kBlock];
  for (int64_t i = 0; i < tm; i += kBlock) {
    const uint32_t* a0 = a + (i / 16) * block_words;
    for (int64_t j = 0; j < tn; j += kBlock) {
      const uint32_t* b0 = b + (j / 16) * block_words;
      const int64_t rows = std::min(kBlock, tm - i), cols = std::min(kBlock, tn - j);
      if (rows == kBlock && cols == kBlock) {
        block_32x32(c + i * ldc + j, ldc, a0, a0 + block_words, b0, b0 + block_words, chunks);
      } else {  // an edge block: the whole 32 x 32 into a buffer, its valid part copied
        block_32x32(edge, kBlock, a0, a0 + block_words, b0, b0 + block_words, chunks);
        for (int64_t r = 0; r < rows; ++r) std::memcpy(c + (i + r) * ldc + j, edge + r * kBlock, size_t(cols) * 4);
      }
    }
  }
  release_tiles();
}

}  // namespace strata::cpu
