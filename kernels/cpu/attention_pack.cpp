// The bf16 tile layouts the vdpbf16ps and AMX attention kernels read: rows, row pairs, weight pairs.
#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/attention_tiles.h"

namespace strata::cpu {
namespace {

// dst (cols, rows) = the transpose of the 32-bit words src (rows, cols), row strides ldd and lds
// (in words): 16 x 16 blocks through registers (four rounds of two-vector shuffles: the unpacks
// and 128-bit lane shuffles of AVX-512, written as generic vector shuffles), the edges word by
// word. src may be bf16 storage (two values per word), so it is read through memcpy only.
typedef uint32_t AttentionWords __attribute__((vector_size(64)));  // 16 words

void attention_transpose_words(uint32_t* dst, int64_t ldd, const void* src, int64_t lds,
                               int64_t rows, int64_t cols) {
  const auto* in = static_cast<const char*>(src);
  auto word = [&](int64_t r, int64_t c) {
    uint32_t w;
    std::memcpy(&w, in + (r * lds + c) * 4, 4);
    return w;
  };
  const int64_t rows16 = rows / 16 * 16, cols16 = cols / 16 * 16;
  for (int64_t r0 = 0; r0 < rows16; r0 += 16) {
    for (int64_t c0 = 0; c0 < cols16; c0 += 16) {
      AttentionWords x[16], t[16];
      for (int i = 0; i < 16; ++i) std::memcpy(&x[i], in + ((r0 + i) * lds + c0) * 4, 64);
      for (int i = 0; i < 16; i += 2) {  // per 128-bit lane: rows i and i + 1 interleaved
        t[i] = __builtin_shufflevector(x[i], x[i + 1], 0, 16, 1, 17, 4, 20, 5, 21, 8, 24, 9, 25,
                                       12, 28, 13, 29);
        t[i + 1] = __builtin_shufflevector(x[i], x[i + 1], 2, 18, 3, 19, 6, 22, 7, 23, 10, 26, 11,
                                           27, 14, 30, 15, 31);
      }
      for (int i = 0; i < 16; i += 4) {  // per lane k: column 4k + m of rows i..i+3 in x[i + m]
        x[i] = __builtin_shufflevector(t[i], t[i + 2], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25,
                                       12, 13, 28, 29);
        x[i + 1] = __builtin_shufflevector(t[i], t[i + 2], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26,
                                           27, 14, 15, 30, 31);
        x[i + 2] = __builtin_shufflevector(t[i + 1], t[i + 3], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9,
                                           24, 25, 12, 13, 28, 29);
        x[i + 3] = __builtin_shufflevector(t[i + 1], t[i + 3], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11,
                                           26, 27, 14, 15, 30, 31);
      }
      for (int i = 0; i < 4; ++i) {  // lanes 0, 2 / 1, 3: rows 0-7 from x[i], x[i + 4], 8-15 likewise
        t[i] = __builtin_shufflevector(x[i], x[i + 4], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24,
                                       25, 26, 27);
        t[i + 4] = __builtin_shufflevector(x[i], x[i + 4], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22,
                                           23, 28, 29, 30, 31);
        t[i + 8] = __builtin_shufflevector(x[i + 8], x[i + 12], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17,
                                           18, 19, 24, 25, 26, 27);
        t[i + 12] = __builtin_shufflevector(x[i + 8], x[i + 12], 4, 5, 6, 7, 12, 13, 14, 15, 20,
                                            21, 22, 23, 28, 29, 30, 31);
      }
      for (int i = 0; i < 8; ++i) {  // t[i] and t[i + 8] hold columns i and i + 8: all 16 rows
        x[i] = __builtin_shufflevector(t[i], t[i + 8], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24,
                                       25, 26, 27);
        x[i + 8] = __builtin_shufflevector(t[i], t[i + 8], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22,
                                           23, 28, 29, 30, 31);
      }
      for (int i = 0; i < 16; ++i) std::memcpy(dst + (c0 + i) * ldd + r0, &x[i], 64);
    }
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = (r < rows16 ? cols16 : 0); c < cols; ++c) dst[c * ldd + r] = word(r, c);
}

}  // namespace

void attention_load_rows(float* rows, bf16* rows_bf, AttentionInput x, int64_t bi, int64_t t0,
                         int64_t n, int64_t head, int64_t nh, const AttentionShape& s) {
  for (int64_t i = 0; i < n; ++i) {
    const bf16* src = x.bf + ((bi * s.t + t0 + i) * nh + head) * s.d;
    if (rows_bf) std::copy(src, src + s.d, rows_bf + i * s.dp);
    if (!rows) continue;
    float* dst = rows + i * s.d;
    for (int64_t e = 0; e < s.d; ++e) dst[e] = bf16_to_f32(src[e]);
  }
}

void attention_load_row_pairs(uint32_t* pairs, AttentionInput x, int64_t bi, int64_t t0, int64_t n,
                              int64_t head, int64_t nh, const AttentionShape& s) {
  for (int64_t p = 0; 2 * p < n; ++p) {
    const bf16* lo = x.bf + ((bi * s.t + t0 + 2 * p) * nh + head) * s.d;
    const bf16* hi = 2 * p + 1 < n ? x.bf + ((bi * s.t + t0 + 2 * p + 1) * nh + head) * s.d : nullptr;
    uint32_t* dst = pairs + p * s.da;
    for (int64_t e = 0; e < s.d; ++e)
      dst[e] = uint32_t(lo[e].bits) | (hi ? uint32_t(hi[e].bits) << 16 : 0u);
    std::fill(dst + s.d, dst + s.da, 0u);
  }
}

void attention_pack_row_weights(uint32_t* dst, const float* w, int64_t rows, int64_t n) {
  for (int64_t i = 0; i < rows; ++i) {
    const float* wi = w + i * kTileK;
    uint32_t* di = dst + i * (kTileK / 2);
    for (int64_t p = 0; p < kTileK / 2; ++p) {
      const uint32_t a = 2 * p < n ? attention_bf16_bits(wi[2 * p]) : 0u;
      const uint32_t b = 2 * p + 1 < n ? attention_bf16_bits(wi[2 * p + 1]) : 0u;
      di[p] = a | b << 16;
    }
  }
}

void attention_pack_col_weights(uint32_t* dst, const float* w, int64_t rows) {
  for (int64_t p = 0; 2 * p < rows; ++p) {
    const float* lo = w + 2 * p * kTileK;
    const float* hi = lo + kTileK;
    uint32_t* dp = dst + p * kTileK;
    if (2 * p + 1 < rows) {
      for (int64_t j = 0; j < kTileK; ++j)
        dp[j] = attention_bf16_bits(lo[j]) | (std::bit_cast<uint32_t>(hi[j]) & 0xffff0000u);
    } else {
      for (int64_t j = 0; j < kTileK; ++j) dp[j] = attention_bf16_bits(lo[j]);
    }
  }
}

void attention_pack_col_weights_by_key(uint32_t* dst, uint32_t* tmp, const float* w, int64_t rows,
                                       int64_t nk) {
  attention_pack_col_weights(tmp, w, rows);
  attention_transpose_words(dst, kTileQ / 2, tmp, kTileK, (rows + 1) / 2, nk);
}

void attention_load_cols(uint32_t* pairs, AttentionInput x, int64_t bi, int64_t t0, int64_t n,
                         int64_t head, int64_t nh, const AttentionShape& s) {
  if (s.d % 2 == 0) {  // the rows' words, transposed
    attention_transpose_words(pairs, kTileK, x.bf + ((bi * s.t + t0) * nh + head) * s.d,
                              nh * s.d / 2, n, s.d / 2);
    return;
  }
  for (int64_t j = 0; j < n; ++j) {
    const bf16* src = x.bf + ((bi * s.t + t0 + j) * nh + head) * s.d;
    for (int64_t p = 0; p < s.d / 2; ++p)
      pairs[p * kTileK + j] = uint32_t(src[2 * p].bits) | uint32_t(src[2 * p + 1].bits) << 16;
    pairs[s.d / 2 * kTileK + j] = src[s.d - 1].bits;  // d odd
  }
}

}  // namespace strata::cpu
