// Causal GQA attention on the CPU, flash-style: queries and keys in 64 x 64 tiles, online
// softmax (running max and sum) in the forward, FlashAttention-2 recomputation in the backward.
// Memory is O(tile) per thread plus one (B,T,H) row-sum buffer in the backward; never O(T^2).
//
// Determinism: every output element is owned by exactly one OpenMP work item and computed in a
// fixed order, so results are bitwise independent of the thread count. The backward therefore
// never accumulates with atomics. The portable kernel runs one pass over (b, kv head) groups
// when there are enough of them for the threads: a group owns dk and dv of its keys and dq of its
// query heads, and forms each tile pair's P and dS once. Otherwise, and on the vdpbf16ps and AMX
// kernels, two passes: pass 1 over (b, kv head, key block) writes dk and dv (summing the query
// heads of the group in order), pass 2 over (b, head, query block) writes dq, in the same orders.
// Scores are recomputed in both, except that with dpbf16 pass 2 reads the dS weights pass 1 kept,
// when they fit the cap (AttentionStoredDs).
//
// The portable kernel reads q, k, v and dout from head-major copies (with bf16 dots, their
// roundings) and the key and value columns from transposes, all made once per
// call; its five products run through one register-blocked kernel (attention_gemm).
//
// Masking: query t sees keys s with doc_start[b,t] <= s <= t. Key tiles entirely outside
// [min doc_start of the query tile, last query of the tile] are skipped, and in the backward,
// query tiles that cannot see a key tile are skipped.
//
// bf16 dots (dot_type bf16, ops.h): q, k, v and dout are rounded to bf16 as they are read, and
// every product (D_i's included) uses those rounded values with f32 accumulation. In the
// backward, the weights of the products summed over keys or queries (P in P^T dO, dS in dS K and
// dS^T Q) are rounded to bf16 too, once P and dS are formed in f32; the forward's P V keeps f32
// weights (the forward is the f32 op on rounded inputs). Where the CPU has AVX512-BF16, the score
// products (Q K^T, dO V^T, summed over D) run on vdpbf16ps from bf16 rows and keys packed in
// (D/2, kTileK) pairs, and the backward's products over tokens from weight pairs and row pairs
// (two tokens' bf16 values per 32-bit word, attention_pairs_gemm). Elsewhere (portable), and for
// the forward's P V, f32 arithmetic on the same rounded values (exact products, f32 sums).
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string_view>
#include <vector>

#include "kernels/cpu/amx.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/vec_exp.h"
#include "src/core/error.h"

namespace strata::cpu {
namespace {

constexpr int64_t kTileQ = 64;  // queries per tile
constexpr int64_t kTileK = 64;  // keys per tile

struct AttentionShape {
  int64_t b, t, h, hk, d;
  int64_t rep;      // query heads per kv head
  int64_t q_tiles;  // ceil(t / kTileQ)
  int64_t k_tiles;  // ceil(t / kTileK)
  bool bf16;        // q, k, v, dout rounded to bf16 (once per call, attention_input)
  bool dpbf16;      // score and backward token-sum products from bf16 pairs (implies bf16)
  bool amx;         // those products on AMX tiles rather than vdpbf16ps (implies dpbf16)
  int64_t dp;       // d rounded up to even: the bf16 row stride
  int64_t da;       // row stride of the (tile, D) accumulators: d, or d rounded up to 16 with
                    // dpbf16 (whole vectors, the padding stays zero)
};

void attention_check_inputs(const AttentionShape& s, const int32_t* doc_start) {
  STRATA_CHECK(s.b >= 0 && s.t >= 0 && s.d > 0,
               "attention: sizes must be non-negative (got b=", s.b, " t=", s.t, " d=", s.d, ")");
  STRATA_CHECK(s.h > 0 && s.hk > 0 && s.h % s.hk == 0, "attention: heads (", s.h,
               ") must be a positive multiple of kv heads (", s.hk, ")");
  if (!doc_start) return;
  for (int64_t bi = 0; bi < s.b; ++bi)
    for (int64_t ti = 0; ti < s.t; ++ti) {
      const int32_t ds = doc_start[bi * s.t + ti];
      STRATA_CHECK(ds >= 0 && ds <= ti, "attention: doc_start[", bi, ",", ti, "] = ", ds,
                   " must lie in [0, ", ti, "] (the start of the token's document)");
    }
}

// Smallest doc_start of each query tile: (B, q_tiles).
std::vector<int32_t> attention_tile_first_keys(const AttentionShape& s, const int32_t* doc_start) {
  std::vector<int32_t> first(size_t(s.b * s.q_tiles), 0);
  if (!doc_start) return first;
  for (int64_t bi = 0; bi < s.b; ++bi)
    for (int64_t qt = 0; qt < s.q_tiles; ++qt) {
      const int64_t t0 = qt * kTileQ, t1 = std::min(s.t, t0 + kTileQ);
      int32_t m = doc_start[bi * s.t + t0];
      for (int64_t ti = t0 + 1; ti < t1; ++ti) m = std::min(m, doc_start[bi * s.t + ti]);
      first[bi * s.q_tiles + qt] = m;
    }
  return first;
}

// Per-thread tiles. The names say the layout: *_rows are (tile, D).
struct AttentionWorkspace {
  std::vector<float> v_rows;           // (kTileK, D) with dpbf16: the widened bf16 values
  std::vector<float> scores, dscores;  // (kTileQ, kTileK)
  std::vector<float> acc, acc2;        // (max tile, D)
  std::vector<float> row_a, row_b;     // (kTileQ)
  std::vector<int64_t> first, last;    // (kTileQ) visible key range of each query
  std::vector<int64_t> key_lo, key_hi;     // (kTileK) range of the queries that see each key
  std::vector<bf16> q_bf, do_bf;           // (kTileQ, dp) with dpbf16: bf16 rows, zero-padded
  std::vector<uint32_t> k_pairs, v_pairs;  // (dp/2, kTileK) with dpbf16: bf16 pairs (e, e+1)
  // With dpbf16, the operands of the products summed over tokens: row pairs (tile/2, da) hold
  // tokens 2p (low half) and 2p + 1 (high half) of one column; weight pairs hold P or dS rounded
  // to bf16, two keys per word in a row (tile, kTileK/2) or two queries per word in a column
  // (kTileQ/2, kTileK).
  std::vector<uint32_t> x_rpairs, y_rpairs;  // (max tile / 2, da)
  std::vector<uint32_t> w_pairs, w2_pairs;   // (kTileQ * kTileK / 2)
  explicit AttentionWorkspace(const AttentionShape& s)
      : AttentionWorkspace(s.d, s.da) {
    if (!s.dpbf16) return;
    q_bf.assign(size_t(kTileQ * s.dp), bf16{0});
    do_bf.assign(size_t(kTileQ * s.dp), bf16{0});
    k_pairs.assign(size_t(s.dp / 2 * kTileK), 0u);
    v_pairs.assign(size_t(s.dp / 2 * kTileK), 0u);
    x_rpairs.assign(size_t(std::max(kTileQ, kTileK) / 2 * s.da), 0u);
    y_rpairs.assign(size_t(std::max(kTileQ, kTileK) / 2 * s.da), 0u);
    w_pairs.assign(size_t(kTileQ * kTileK / 2), 0u);
    w2_pairs.assign(size_t(kTileQ * kTileK / 2), 0u);
  }
  AttentionWorkspace(int64_t d, int64_t da)
      : v_rows(size_t(kTileK * d)),
        scores(size_t(kTileQ * kTileK)),
        dscores(size_t(kTileQ * kTileK)),
        acc(size_t(std::max(kTileQ, kTileK) * da)),
        acc2(size_t(std::max(kTileQ, kTileK) * da)),
        row_a(size_t(kTileQ)),
        row_b(size_t(kTileQ)),
        first(size_t(kTileQ)),
        last(size_t(kTileQ)),
        key_lo(size_t(kTileK)),
        key_hi(size_t(kTileK)) {}
};

// One input tensor of the vdpbf16ps and AMX kernels: its bf16 rounding, made once per call, so
// the many tile loads only widen or copy.
struct AttentionInput {
  const bf16* bf = nullptr;
};

// With dpbf16, pass 1 keeps the dS weight pairs of every (query tile, key tile) pair it visits,
// packed along the rows as pass 2's dQ = dS K reads them (attention_pack_row_weights), so pass 2
// does not recompute P and dS. Pass 1 visits key tile kt for the query tiles qt >= kt that see
// it; pass 2 visits the same pairs (kTileQ == kTileK), so every slot it reads was written. Null
// `words`: pass 2 recomputes (f32 dots, or a store larger than the cap).
struct AttentionStoredDs {
  uint32_t* words = nullptr;  // (B, H, q_tiles (q_tiles + 1) / 2, kTileQ * kTileK / 2)
  int64_t pairs = 0;          // query tile pairs with kt <= qt per (b, head)
  uint32_t* slot(const AttentionShape& s, int64_t bi, int64_t hi, int64_t qt, int64_t kt) const {
    return words + ((bi * s.h + hi) * pairs + qt * (qt + 1) / 2 + kt) * (kTileQ * kTileK / 2);
  }
};
static_assert(kTileQ == kTileK, "the stored dS slots pair query tile qt with key tiles kt <= qt");

// With dpbf16: copies n rows of one head from x (B,T,nh,D) starting at token t0, the bf16 bits
// into rows_bf (n, dp) when not null, the values widened into rows (n, D) when not null.
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

// With dpbf16: n rows of one head from x (as attention_load_rows) into row pairs (ceil(n/2), da):
// word (p, e) holds token 2p's column e in its low half and token 2p + 1's in its high half;
// zero past d and past the last token.
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

// The high half of a bf16-valued f32 (its bf16 bits, exactly).
inline uint32_t attention_bf16_bits(float x) { return std::bit_cast<uint32_t>(x) >> 16; }

// x rounded to bf16 (nearest even), kept as f32.
inline float attention_round_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }

// Weight pairs along a row: dst (rows, kTileK/2) from the bf16-valued tile w (rows, kTileK),
// word (i, p) = w[i][2p] | w[i][2p + 1] << 16; columns at or past n are zero.
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

// Weight pairs down a column: dst (ceil(rows/2), kTileK) from the bf16-valued tile w
// (rows, kTileK), word (p, j) = w[2p][j] | w[2p + 1][j] << 16; row `rows` (odd rows) is zero.
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

// Weight pairs down the columns of w one key per row, as AMX reads the weights of a sum over
// queries: dst (nk, kTileQ/2), word (j, p) = w[2p][j] | w[2p + 1][j] << 16 (the high half zero
// where 2p + 1 = rows); `tmp` receives attention_pack_col_weights's layout on the way.
void attention_pack_col_weights_by_key(uint32_t* dst, uint32_t* tmp, const float* w, int64_t rows,
                                       int64_t nk) {
  attention_pack_col_weights(tmp, w, rows);
  attention_transpose_words(dst, kTileQ / 2, tmp, kTileK, (rows + 1) / 2, nk);
}

// With dpbf16: n rows of one head, as attention_load_rows reads them, transposed into pairs
// (dp/2, kTileK), the low half of each word holding element 2p and the high half 2p + 1 (zero
// past d).
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
constexpr int64_t kVecPerTile = kTileK / 16;  // the AVX-512 vdpbf16ps kernels: 16-float vectors per key tile
static_assert(kTileK % 16 == 0 && kTileK % kLanes == 0);
// The register block of attention_gemm (rows x column vectors of accumulators): 4 x 4 = 16
// accumulators on AVX-512's 32 registers (4 column vectors and 4 row broadcasts beside them); on
// AVX2's 16, 6 x 2 = 12 with the two column vectors and one broadcast beside them, so each column
// vector is loaded once per x and reused by the six rows (the 3 x 4 block it replaced had GCC
// fold every column load into its FMA: 15 loads per 12 FMAs, load-bound on Zen 3).
constexpr int64_t kDotRows = kLanes == 16 ? 4 : 6;
constexpr int64_t kDotVecs = kLanes == 16 ? 4 : 2;
constexpr int64_t kDotCols = kDotVecs * kLanes;  // 64 (AVX-512) or 16 columns per block
static_assert(kTileK % kDotCols == 0);

AttentionVec attention_load_vec(const float* p) {
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

void attention_gemm(float* c, int64_t ldc, const float* a, int64_t a_rs, int64_t a_cs,
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

// Visible key range [first, last] of each query of the tile, relative to key s0; empty when
// first > last. Queries t0.., doc start from doc_start (or 0).
void attention_tile_ranges(AttentionWorkspace& ws, const int32_t* doc_start, int64_t bi, int64_t t0,
                           int64_t nq, int64_t s0, int64_t nk, const AttentionShape& s) {
  for (int64_t i = 0; i < nq; ++i) {
    const int64_t ds = doc_start ? int64_t(doc_start[bi * s.t + t0 + i]) : 0;
    ws.first[i] = std::max<int64_t>(ds - s0, 0);
    ws.last[i] = std::min<int64_t>(t0 + i - s0, nk - 1);
  }
}

// The range [key_lo[j], key_hi[j]] of the tile's queries that see key j (empty: lo > hi), from
// the queries' ranges. Documents are consecutive, so first and last never decrease along the
// queries and the queries that see key j are those from the first whose range reaches j to the
// last whose range starts by j. (A doc_start that decreases somewhere is not a packing; its
// ranges still cover every query that sees the key: P and dS are zero inside them where one
// does not.)
void attention_key_ranges(int64_t nq, int64_t nk, AttentionWorkspace& ws) {
  const int64_t* first = ws.first.data();
  const int64_t* last = ws.last.data();
  bool sorted = true;
  for (int64_t i = 1; i < nq; ++i) sorted = sorted && first[i] >= first[i - 1] && last[i] >= last[i - 1];
  int64_t* q_lo = ws.key_lo.data();
  int64_t* q_hi = ws.key_hi.data();
  if (!sorted) {
    std::fill(q_lo, q_lo + nk, nq);
    std::fill(q_hi, q_hi + nk, int64_t(-1));
    for (int64_t i = 0; i < nq; ++i)
      for (int64_t j = first[i]; j <= last[i]; ++j) {
        q_lo[j] = std::min(q_lo[j], i);
        q_hi[j] = std::max(q_hi[j], i);
      }
    return;
  }
  int64_t lo = 0, hi = -1;
  for (int64_t j = 0; j < nk; ++j) {
    while (lo < nq && last[lo] < j) ++lo;             // the first query whose range reaches j
    while (hi + 1 < nq && first[hi + 1] <= j) ++hi;   // the last query whose range starts by j
    q_lo[j] = lo;
    q_hi[j] = hi;  // empty when lo > hi
  }
}

// The portable kernel's inputs, made once per call: q, k, v and dout head-major, (B, nh, T, D)
// (with bf16 dots their bf16 roundings, as f32), so that a head's tile is one contiguous
// (tile, D) block, and the transposes kt and vt (B, Hk, D, tp) of k and v, zero past T, so that
// a key tile's columns are the (D, kTileK) block at token s0 with row stride tp: T rounded up to
// kTileK, plus 16 so that the rows of a tile's columns do not share a few cache sets (a stride
// of a power of two bytes maps 64 of them to 4 of the L1's 64 sets).
struct AttentionFloats {
  // q, k, v, dout: (B, nh, T, D); kt, vt: (B, Hk, D, tp)
  const float *q = nullptr, *k = nullptr, *v = nullptr, *dout = nullptr;
  const float *kt = nullptr, *vt = nullptr;
  int64_t tp = 0;
};

int64_t attention_cols_stride(const AttentionShape& s) { return s.k_tiles * kTileK + 16; }

// x[0..n) *= scale, and their max (n > 0), kLanes at a time (the compiler leaves the plain
// loop scalar). A max is the same whatever the order: NaN is skipped either way (a lane keeps
// its value unless the new one is greater), and where +0 and -0 tie, either gives the same
// differences and exps downstream.
float attention_scale_max(float* x, int64_t n, float scale) {
  int64_t j = 0;
  float m = -std::numeric_limits<float>::infinity();
  if (n >= kLanes) {
    AttentionVec vm = attention_load_vec(x) * scale;
    for (; j + kLanes <= n; j += kLanes) {
      const AttentionVec v = attention_load_vec(x + j) * scale;
      std::memcpy(x + j, &v, sizeof(v));
      vm = v > vm ? v : vm;
    }
    for (int l = 0; l < kLanes; ++l) m = std::max(m, vm[l]);
  }
  for (; j < n; ++j) {
    x[j] *= scale;
    m = std::max(m, x[j]);
  }
  return m;
}

// Softmax of one tile's scores, row by row (online: running max m and sum l of each query,
// the rows of o (nq, D) rescaled); p becomes the probabilities relative to the running max,
// zero outside each query's visible keys (over the tile's nk keys: P V sums blocks of rows
// over the union of their ranges).
void attention_forward_softmax(float* p, float* o, float* m, float* l, int64_t nq, int64_t nk,
                               float scale, const AttentionShape& s, AttentionWorkspace& ws) {
  for (int64_t i = 0; i < nq; ++i) {
    const int64_t j0 = ws.first[i], j1 = ws.last[i];
    float* pi = p + i * kTileK;
    if (j0 > j1) {
      std::fill(pi, pi + nk, 0.f);
      continue;
    }
    const float tile_max = attention_scale_max(pi + j0, j1 - j0 + 1, scale);
    const float m_new = std::max(m[i], tile_max);
    const float alpha = std::exp(m[i] - m_new);  // 0 on the first visible tile
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = j0; j <= j1; ++j) {
      pi[j] = exp_f32(pi[j] - m_new);
      sum += pi[j];
    }
    std::fill(pi, pi + j0, 0.f);
    std::fill(pi + j1 + 1, pi + nk, 0.f);
    l[i] = l[i] * alpha + sum;
    m[i] = m_new;
    float* oi = o + i * s.d;
    for (int64_t e = 0; e < s.d; ++e) oi[e] *= alpha;
  }
}

// One forward work item: query tile qt of head hi in batch row bi. The score products read the
// portable inputs `in` in place, or with dpbf16 the bf16 tiles loaded from q and k; P V keeps
// f32 weights with bf16 dots too (the forward is the f32 op on rounded inputs, so the cached
// decode kernel, attention_cached.h, computes what it computes).
void attention_forward_tile(float* out, float* lse, AttentionInput q, AttentionInput k,
                            AttentionInput v, const AttentionFloats& in, const int32_t* doc_start,
                            int32_t first_key, int64_t bi, int64_t hi, int64_t qt, float scale,
                            const AttentionShape& s, AttentionWorkspace& ws) {
  const int64_t d = s.d, g = hi / s.rep;
  const int64_t t0 = qt * kTileQ, nq = std::min(kTileQ, s.t - t0);
  float* o = ws.acc.data();     // (nq, D) unnormalised output
  float* m = ws.row_a.data();   // (nq) running max of scaled scores
  float* l = ws.row_b.data();   // (nq) running sum of exp(score - m)
  float* p = ws.scores.data();  // (nq, kTileK)
  if (s.dpbf16) attention_load_rows(nullptr, ws.q_bf.data(), q, bi, t0, nq, hi, s.h, s);
  std::fill(o, o + nq * d, 0.f);
  std::fill(m, m + nq, -std::numeric_limits<float>::infinity());
  std::fill(l, l + nq, 0.f);

  for (int64_t kt = first_key / kTileK; kt * kTileK <= t0 + nq - 1; ++kt) {
    const int64_t s0 = kt * kTileK, nk = std::min(kTileK, s.t - s0);
    const float* v_rows = ws.v_rows.data();  // (nk, D)
    if (s.dpbf16) {
      attention_load_cols(ws.k_pairs.data(), k, bi, s0, nk, g, s.hk, s);
      attention_load_rows(ws.v_rows.data(), nullptr, v, bi, s0, nk, g, s.hk, s);
      attention_tile_scores_dpbf16(p, ws.q_bf.data(), ws.k_pairs.data(), nq, s);
    } else {
      attention_gemm(p, kTileK, in.q + ((bi * s.h + hi) * s.t + t0) * d, d, 1,
                     in.kt + (bi * s.hk + g) * d * in.tp + s0, in.tp, nq, kTileK, d, nullptr,
                     nullptr, false);
      v_rows = in.v + ((bi * s.hk + g) * s.t + s0) * d;
    }
    attention_tile_ranges(ws, doc_start, bi, t0, nq, s0, nk, s);
    attention_forward_softmax(p, o, m, l, nq, nk, scale, s, ws);
    attention_gemm(o, d, p, kTileK, 1, v_rows, d, nq, d, nk, ws.first.data(), ws.last.data(),
                   true);
  }
  // Every query sees at least itself, so l > 0.
  for (int64_t i = 0; i < nq; ++i) {
    const float inv = 1.f / l[i];
    float* dst = out + ((bi * s.t + t0 + i) * s.h + hi) * d;
    for (int64_t e = 0; e < d; ++e) dst[e] = o[i * d + e] * inv;
    lse[(bi * s.t + t0 + i) * s.h + hi] = m[i] + std::log(l[i]);
  }
}

// P and dS = P * (dP - D_i) of one (query tile, key tile) pair, in place of its scores in
// ws.scores and dP in ws.dscores: zero outside the visible ranges (ws.first, ws.last), rounded
// to bf16 with bf16 dots. lse_t, di_t: the query tile's lse and D_i.
void attention_tile_weights(const float* lse_t, const float* di_t, int64_t nq, int64_t nk,
                            float scale, const AttentionShape& s, AttentionWorkspace& ws) {
  float* p = ws.scores.data();
  float* dp = ws.dscores.data();
  for (int64_t i = 0; i < nq; ++i) {
    float* pi = p + i * kTileK;
    float* dpi = dp + i * kTileK;
    const int64_t j0 = ws.first[i], j1 = ws.last[i];
    const float lse_i = lse_t[i], di_i = di_t[i];
    if (s.bf16) {  // the weights of the products over tokens, rounded once formed in f32
#pragma omp simd
      for (int64_t j = 0; j < nk; ++j) {
        const bool visible = j >= j0 && j <= j1;
        const float pij = exp_f32(pi[j] * scale - lse_i);
        const float dsij = pij * (dpi[j] - di_i);
        pi[j] = visible ? attention_round_bf16(pij) : 0.f;
        dpi[j] = visible ? attention_round_bf16(dsij) : 0.f;
      }
      continue;
    }
#pragma omp simd
    for (int64_t j = 0; j < nk; ++j) {
      const bool visible = j >= j0 && j <= j1;
      const float pij = exp_f32(pi[j] * scale - lse_i);
      pi[j] = visible ? pij : 0.f;
      dpi[j] = visible ? pij * (dpi[j] - di_i) : 0.f;
    }
  }
}

// Loads lse and D_i of query tile (bi, hi, t0..t0+nq) into ws.row_a, ws.row_b.
void attention_load_row_stats(const float* lse, const float* di, int64_t bi, int64_t hi, int64_t t0,
                              int64_t nq, const AttentionShape& s, AttentionWorkspace& ws) {
  for (int64_t i = 0; i < nq; ++i) {
    ws.row_a[i] = lse[(bi * s.t + t0 + i) * s.h + hi];
    ws.row_b[i] = di[(bi * s.t + t0 + i) * s.h + hi];
  }
}

// ---- the portable backward ----
// Rows [0, n) of x (row stride ld, D wide) set to zero, or multiplied by scale.
void attention_zero_rows(float* x, int64_t ld, int64_t n, int64_t d) {
  for (int64_t i = 0; i < n; ++i) std::fill(x + i * ld, x + i * ld + d, 0.f);
}

void attention_scale_rows(float* x, int64_t ld, int64_t n, int64_t d, float scale) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t e = 0; e < d; ++e) x[i * ld + e] *= scale;
}

// One (query tile qt of head hi, key tile kt) pair: P and dS recomputed from the inputs, then
// with `kv` dV += P^T dO and dK += dS^T Q into the key tile's rows of dv and dk, and with `q_grad`
// dQ += dS K into the query tile's rows of dq: sums in place in the outputs, each over the pair's
// tokens in ascending order, so an output element's order is the order its callers visit pairs.
void attention_backward_pair(float* dq, float* dk, float* dv, const AttentionFloats& in,
                             const float* lse, const float* di, const int32_t* doc_start,
                             int64_t bi, int64_t hi, int64_t qt, int64_t kt, float scale, bool kv,
                             bool q_grad, const AttentionShape& s, AttentionWorkspace& ws) {
  const int64_t d = s.d, g = hi / s.rep, ldq = s.h * d, ldk = s.hk * d;
  const int64_t t0 = qt * kTileQ, nq = std::min(kTileQ, s.t - t0);
  const int64_t s0 = kt * kTileK, nk = std::min(kTileK, s.t - s0);
  const int64_t q_at = ((bi * s.t + t0) * s.h + hi) * d, k_at = ((bi * s.t + s0) * s.hk + g) * d;
  const int64_t qh_at = ((bi * s.h + hi) * s.t + t0) * d, kh_at = ((bi * s.hk + g) * s.t + s0) * d;
  const int64_t cols_at = (bi * s.hk + g) * d * in.tp + s0;
  float* p = ws.scores.data();
  float* ds = ws.dscores.data();
  attention_gemm(p, kTileK, in.q + qh_at, d, 1, in.kt + cols_at, in.tp, nq, kTileK, d, nullptr,
                 nullptr, false);
  attention_gemm(ds, kTileK, in.dout + qh_at, d, 1, in.vt + cols_at, in.tp, nq, kTileK, d,
                 nullptr, nullptr, false);
  attention_load_row_stats(lse, di, bi, hi, t0, nq, s, ws);
  attention_tile_ranges(ws, doc_start, bi, t0, nq, s0, nk, s);
  attention_tile_weights(ws.row_a.data(), ws.row_b.data(), nq, nk, scale, s, ws);
  if (kv) {  // the weights of key j: column j of P and dS (a_rs 1, a_cs kTileK)
    attention_key_ranges(nq, nk, ws);
    attention_gemm(dv + k_at, ldk, p, 1, kTileK, in.dout + qh_at, d, nk, d, nq, ws.key_lo.data(),
                   ws.key_hi.data(), true);
    attention_gemm(dk + k_at, ldk, ds, 1, kTileK, in.q + qh_at, d, nk, d, nq, ws.key_lo.data(),
                   ws.key_hi.data(), true);
  }
  if (q_grad)
    attention_gemm(dq + q_at, ldq, ds, kTileK, 1, in.k + kh_at, d, nq, d, nk, ws.first.data(),
                   ws.last.data(), true);
}

// Key tile kt of kv head g in batch row bi: dK and dV of its keys, summed over the group's
// heads in order and, for each, its query tiles that see the keys in ascending order; with
// `q_grad` also the dQ these pairs give (for a caller that owns every query tile of the group and
// visits its key tiles in ascending order).
void attention_backward_key_tile(float* dq, float* dk, float* dv, const AttentionFloats& in,
                                 const float* lse, const float* di, const int32_t* doc_start,
                                 const int32_t* tile_first_keys, int64_t bi, int64_t g, int64_t kt,
                                 float scale, bool q_grad, const AttentionShape& s,
                                 AttentionWorkspace& ws) {
  const int64_t s0 = kt * kTileK, nk = std::min(kTileK, s.t - s0), ldk = s.hk * s.d;
  const int64_t k_at = ((bi * s.t + s0) * s.hk + g) * s.d;
  attention_zero_rows(dk + k_at, ldk, nk, s.d);
  attention_zero_rows(dv + k_at, ldk, nk, s.d);
  for (int64_t hi = g * s.rep; hi < (g + 1) * s.rep; ++hi)
    for (int64_t qt = s0 / kTileQ; qt < s.q_tiles; ++qt) {
      if (tile_first_keys[bi * s.q_tiles + qt] > s0 + nk - 1) continue;  // no query sees these keys
      attention_backward_pair(dq, dk, dv, in, lse, di, doc_start, bi, hi, qt, kt, scale, true,
                              q_grad, s, ws);
    }
  attention_scale_rows(dk + k_at, ldk, nk, s.d, scale);
}

// The backward of one batch row and kv head in one pass: its key tiles in ascending order, dQ of
// the group's heads summed in place as the pairs come (each query tile's key tiles ascending).
void attention_backward_group(float* dq, float* dk, float* dv, const AttentionFloats& in,
                              const float* lse, const float* di, const int32_t* doc_start,
                              const int32_t* tile_first_keys, int64_t bi, int64_t g, float scale,
                              const AttentionShape& s, AttentionWorkspace& ws) {
  const int64_t ldq = s.h * s.d;
  for (int64_t hi = g * s.rep; hi < (g + 1) * s.rep; ++hi)
    attention_zero_rows(dq + (bi * s.t * s.h + hi) * s.d, ldq, s.t, s.d);
  for (int64_t kt = 0; kt < s.k_tiles; ++kt)
    attention_backward_key_tile(dq, dk, dv, in, lse, di, doc_start, tile_first_keys, bi, g, kt,
                                scale, true, s, ws);
  for (int64_t hi = g * s.rep; hi < (g + 1) * s.rep; ++hi)
    attention_scale_rows(dq + (bi * s.t * s.h + hi) * s.d, ldq, s.t, s.d, scale);
}

// dQ of query tile qt of head hi in batch row bi, over the key tiles it sees in ascending order
// (the second pass when the backward runs in two).
void attention_backward_query_tile(float* dq, const AttentionFloats& in, const float* lse,
                                   const float* di, const int32_t* doc_start, int32_t first_key,
                                   int64_t bi, int64_t hi, int64_t qt, float scale,
                                   const AttentionShape& s, AttentionWorkspace& ws) {
  const int64_t t0 = qt * kTileQ, nq = std::min(kTileQ, s.t - t0), ldq = s.h * s.d;
  float* rows = dq + ((bi * s.t + t0) * s.h + hi) * s.d;
  attention_zero_rows(rows, ldq, nq, s.d);
  for (int64_t kt = first_key / kTileK; kt * kTileK <= t0 + nq - 1; ++kt)
    attention_backward_pair(dq, nullptr, nullptr, in, lse, di, doc_start, bi, hi, qt, kt, scale,
                            false, true, s, ws);
  attention_scale_rows(rows, ldq, nq, s.d, scale);
}

// ---- the vdpbf16ps and AMX backward ----
// Recomputes P and dS of one (query tile, key tile) pair into ws.scores and ws.dscores (as
// attention_tile_weights leaves them). Needs ws.q_bf, ws.do_bf, ws.k_pairs, ws.v_pairs loaded and
// the query tile's lse and D_i in lse_t, di_t.
void attention_tile_probs_grads(const float* lse_t, const float* di_t, const int32_t* doc_start,
                                int64_t bi, int64_t t0, int64_t nq, int64_t s0, int64_t nk,
                                float scale, const AttentionShape& s, AttentionWorkspace& ws) {
  attention_tile_scores_dpbf16(ws.scores.data(), ws.q_bf.data(), ws.k_pairs.data(), nq, s);
  attention_tile_scores_dpbf16(ws.dscores.data(), ws.do_bf.data(), ws.v_pairs.data(), nq, s);
  attention_tile_ranges(ws, doc_start, bi, t0, nq, s0, nk, s);
  attention_tile_weights(lse_t, di_t, nq, nk, scale, s, ws);
}

// dV_j += sum_i P_ij dO_i and dK_j += sum_i dS_ij Q_i over one (query tile, key tile) pair, from
// weight pairs down the columns of P and dS and the row pairs of dO (ws.y_rpairs) and Q
// (ws.x_rpairs), in query order (P and dS are zero where i does not see j).
void attention_backward_kv_accumulate(float* dk_acc, float* dv_acc, int64_t nq, int64_t nk,
                                      const AttentionShape& s, AttentionWorkspace& ws) {
  const float* p = ws.scores.data();
  const float* ds = ws.dscores.data();
  if (s.amx) {  // AMX reads a row by row: key j's weight pairs down its column of P or dS
    const int64_t np = (nq + 1) / 2;
    attention_pack_col_weights_by_key(ws.w_pairs.data(), ws.w2_pairs.data(), p, nq, nk);
    amx_pairs_gemm(dv_acc, s.da, true, ws.w_pairs.data(), kTileQ / 2, ws.y_rpairs.data(), s.da, nk,
                   np, s.da / 16);
    attention_pack_col_weights_by_key(ws.w_pairs.data(), ws.w2_pairs.data(), ds, nq, nk);
    amx_pairs_gemm(dk_acc, s.da, true, ws.w_pairs.data(), kTileQ / 2, ws.x_rpairs.data(), s.da,
                   nk, np, s.da / 16);
    return;
  }
  attention_pack_col_weights(ws.w_pairs.data(), p, nq);
  attention_pack_col_weights(ws.w2_pairs.data(), ds, nq);
  attention_pairs_gemm(dv_acc, s.da, ws.w_pairs.data(), 1, kTileK, ws.y_rpairs.data(), s.da, nk,
                       (nq + 1) / 2, s.da / 16);
  attention_pairs_gemm(dk_acc, s.da, ws.w2_pairs.data(), 1, kTileK, ws.x_rpairs.data(), s.da, nk,
                       (nq + 1) / 2, s.da / 16);
}

// Loads query tile (bi, hi, t0..t0+nq) of q and dout as the backward's products read it: bf16
// rows for the score products, and row pairs (Q into ws.x_rpairs, dO into ws.y_rpairs) when
// `pairs`.
void attention_load_query_tile(AttentionInput q, AttentionInput dout, int64_t bi, int64_t hi,
                               int64_t t0, int64_t nq, bool pairs, const AttentionShape& s,
                               AttentionWorkspace& ws) {
  attention_load_rows(nullptr, ws.q_bf.data(), q, bi, t0, nq, hi, s.h, s);
  attention_load_rows(nullptr, ws.do_bf.data(), dout, bi, t0, nq, hi, s.h, s);
  if (!pairs) return;
  attention_load_row_pairs(ws.x_rpairs.data(), q, bi, t0, nq, hi, s.h, s);
  attention_load_row_pairs(ws.y_rpairs.data(), dout, bi, t0, nq, hi, s.h, s);
}

// vdpbf16ps and AMX backward pass 1 work item: key tile kt of kv head g in batch row bi; writes dk, dv there.
void attention_backward_kv_tile(float* dk, float* dv, AttentionInput dout, AttentionInput q,
                                AttentionInput k, AttentionInput v, const float* lse,
                                const float* di,
                                const int32_t* doc_start, const int32_t* tile_first_keys,
                                int64_t bi, int64_t g, int64_t kt, float scale,
                                const AttentionShape& s, AttentionWorkspace& ws,
                                const AttentionStoredDs& stored) {
  const int64_t d = s.d, da = s.da;
  const int64_t s0 = kt * kTileK, nk = std::min(kTileK, s.t - s0);
  float* dk_acc = ws.acc.data();   // (nk, da)
  float* dv_acc = ws.acc2.data();  // (nk, da)
  std::fill(dk_acc, dk_acc + nk * da, 0.f);
  std::fill(dv_acc, dv_acc + nk * da, 0.f);
  attention_load_cols(ws.k_pairs.data(), k, bi, s0, nk, g, s.hk, s);
  attention_load_cols(ws.v_pairs.data(), v, bi, s0, nk, g, s.hk, s);
  for (int64_t hi = g * s.rep; hi < (g + 1) * s.rep; ++hi) {
    for (int64_t qt = s0 / kTileQ; qt < s.q_tiles; ++qt) {
      if (tile_first_keys[bi * s.q_tiles + qt] > s0 + nk - 1) continue;  // no query sees these keys
      const int64_t t0 = qt * kTileQ, nq = std::min(kTileQ, s.t - t0);
      attention_load_query_tile(q, dout, bi, hi, t0, nq, true, s, ws);
      attention_load_row_stats(lse, di, bi, hi, t0, nq, s, ws);
      attention_tile_probs_grads(ws.row_a.data(), ws.row_b.data(), doc_start, bi, t0, nq, s0, nk,
                                 scale, s, ws);
      if (stored.words) attention_pack_row_weights(stored.slot(s, bi, hi, qt, kt), ws.dscores.data(), nq, nk);
      attention_backward_kv_accumulate(dk_acc, dv_acc, nq, nk, s, ws);
    }
  }
  for (int64_t j = 0; j < nk; ++j) {
    float* dkj = dk + ((bi * s.t + s0 + j) * s.hk + g) * d;
    float* dvj = dv + ((bi * s.t + s0 + j) * s.hk + g) * d;
    for (int64_t e = 0; e < d; ++e) {
      dkj[e] = dk_acc[j * da + e] * scale;
      dvj[e] = dv_acc[j * da + e];
    }
  }
}

// dQ_i += dS_i K over one key tile, from weight pairs along the rows of dS (pass 1's `stored`
// ones, else packed from ws.dscores) and K's row pairs (ws.x_rpairs).
void attention_backward_q_accumulate(float* dq_acc, int64_t nq, int64_t nk, const uint32_t* stored,
                                     const AttentionShape& s, AttentionWorkspace& ws) {
  if (!stored) attention_pack_row_weights(ws.w_pairs.data(), ws.dscores.data(), nq, nk);
  if (s.amx) {
    amx_pairs_gemm(dq_acc, s.da, true, stored ? stored : ws.w_pairs.data(), kTileK / 2,
                   ws.x_rpairs.data(), s.da, nq, (nk + 1) / 2, s.da / 16);
    return;
  }
  attention_pairs_gemm(dq_acc, s.da, stored ? stored : ws.w_pairs.data(), kTileK / 2, 1,
                       ws.x_rpairs.data(), s.da, nq, (nk + 1) / 2, s.da / 16);
}

// vdpbf16ps and AMX backward pass 2 work item: query tile qt of head hi in batch row bi; writes dq there.
void attention_backward_q_tile(float* dq, AttentionInput dout, AttentionInput q, AttentionInput k,
                               AttentionInput v, const float* lse, const float* di,
                               const int32_t* doc_start, int32_t first_key, int64_t bi, int64_t hi,
                               int64_t qt, float scale, const AttentionShape& s,
                               AttentionWorkspace& ws, const AttentionStoredDs& stored) {
  const int64_t d = s.d, da = s.da, g = hi / s.rep;
  const int64_t t0 = qt * kTileQ, nq = std::min(kTileQ, s.t - t0);
  float* dq_acc = ws.acc.data();  // (nq, da)
  std::fill(dq_acc, dq_acc + nq * da, 0.f);
  if (!stored.words) {
    attention_load_query_tile(q, dout, bi, hi, t0, nq, false, s, ws);
    attention_load_row_stats(lse, di, bi, hi, t0, nq, s, ws);
  }
  for (int64_t kt = first_key / kTileK; kt * kTileK <= t0 + nq - 1; ++kt) {
    const int64_t s0 = kt * kTileK, nk = std::min(kTileK, s.t - s0);
    attention_load_row_pairs(ws.x_rpairs.data(), k, bi, s0, nk, g, s.hk, s);
    if (stored.words) {
      attention_backward_q_accumulate(dq_acc, nq, nk, stored.slot(s, bi, hi, qt, kt), s, ws);
      continue;
    }
    attention_load_cols(ws.k_pairs.data(), k, bi, s0, nk, g, s.hk, s);
    attention_load_cols(ws.v_pairs.data(), v, bi, s0, nk, g, s.hk, s);
    attention_tile_probs_grads(ws.row_a.data(), ws.row_b.data(), doc_start, bi, t0, nq, s0, nk,
                               scale, s, ws);
    attention_backward_q_accumulate(dq_acc, nq, nk, nullptr, s, ws);
  }
  for (int64_t i = 0; i < nq; ++i) {
    float* dst = dq + ((bi * s.t + t0 + i) * s.h + hi) * d;
    for (int64_t e = 0; e < d; ++e) dst[e] = dq_acc[i * da + e] * scale;
  }
}

// sum_e a[e] b[e] in order. One function for both dot types, so that bf16 dots on bf16-valued
// inputs give the f32 op's bits (the compiler contracts one loop one way).
[[gnu::noinline]] float attention_row_dot(const float* a, const float* b, int64_t d) {
  float acc = 0.f;
  for (int64_t e = 0; e < d; ++e) acc += a[e] * b[e];
  return acc;
}

// D_i = rowsum(dout * out) (B,T,H), dout as the kernel reads it: the portable kernel's head-major
// values (B,H,T,D), or bf16 ones widened.
void attention_output_dots(float* di, const float* dout_hm, const bf16* dout_bf, const float* out,
                           const AttentionShape& s) {
  const int64_t rows = s.b * s.t * s.h, d = s.d;
#pragma omp parallel
  {
    std::vector<float> widened(size_t(dout_bf ? d : 0));  // (D) one dout row, bf16 widened
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t bi = r / (s.t * s.h), ti = r / s.h % s.t, head = r % s.h;
      const float* g = dout_hm ? dout_hm + ((bi * s.h + head) * s.t + ti) * d : widened.data();
      if (dout_bf)
        for (int64_t e = 0; e < d; ++e) widened[e] = bf16_to_f32(dout_bf[r * d + e]);
      di[r] = attention_row_dot(g, out + r * d, d);
    }
  }
}

// The portable backward. One pass over the (batch row, kv head) groups when they spread evenly
// over the threads (the busiest thread's share at most 1.25 times the mean): each P and dS is
// formed once, where the two passes form them twice (7 products a tile pair instead of 5).
// Else two passes over the finer key tiles (dK, dV) and query tiles (dQ). Every output element
// sums in the same order either way, so the bits do not depend on the choice or the threads.
void attention_backward_portable(float* dq, float* dk, float* dv, const AttentionFloats& in,
                                 const float* lse, const float* di, const int32_t* doc_start,
                                 const int32_t* tile_first_keys, float scale,
                                 const AttentionShape& s) {
  const int64_t groups = s.b * s.hk, threads = omp_get_max_threads();
  const bool one_pass = (groups + threads - 1) / threads * threads * 4 <= groups * 5;
  const int64_t kv_items = s.b * s.hk * s.k_tiles;
  const int64_t q_items = s.b * s.h * s.q_tiles;
#pragma omp parallel
  {
    AttentionWorkspace ws(s);
    if (one_pass) {
#pragma omp for schedule(dynamic, 1)
      for (int64_t it = 0; it < groups; ++it)
        attention_backward_group(dq, dk, dv, in, lse, di, doc_start, tile_first_keys, it / s.hk,
                                 it % s.hk, scale, s, ws);
    } else {
      // Early key tiles are seen by the most queries, late query tiles see the most keys: both
      // handed out first.
#pragma omp for schedule(dynamic, 1)
      for (int64_t it = 0; it < kv_items; ++it) {
        const int64_t kt = it % s.k_tiles;
        const int64_t g = (it / s.k_tiles) % s.hk, bi = it / (s.k_tiles * s.hk);
        attention_backward_key_tile(nullptr, dk, dv, in, lse, di, doc_start, tile_first_keys, bi,
                                    g, kt, scale, false, s, ws);
      }
#pragma omp for schedule(dynamic, 1)
      for (int64_t it = 0; it < q_items; ++it) {
        const int64_t qt = s.q_tiles - 1 - it % s.q_tiles;
        const int64_t hi = (it / s.q_tiles) % s.h, bi = it / (s.q_tiles * s.h);
        attention_backward_query_tile(dq, in, lse, di, doc_start,
                                      tile_first_keys[bi * s.q_tiles + qt], bi, hi, qt, scale, s,
                                      ws);
      }
    }
  }
}

// The large transients of a call (the portable kernel's key and value transposes and, with bf16
// dots, its inputs' roundings; the vdpbf16ps and AMX kernels' bf16 input copies and kept dS),
// kept by the calling thread (the device's compute stream) from one call to the next: a step
// makes 2L calls of one shape, and allocating, faulting in and freeing the same megabytes every
// time cost ~15% of the forward and ~7% of the backward at B4 T512 H8/4 D64. They only grow, to
// the largest call's.
struct AttentionScratch {
  std::vector<bf16> inputs[4];      // q, k, v, dout (dpbf16)
  std::vector<float> inputs_f32[4];  // q, k, v, dout head-major (portable)
  std::vector<float> kt, vt;        // AttentionFloats::kt, vt (portable)
  std::vector<uint32_t> ds_words;   // AttentionStoredDs::words
};

AttentionScratch& attention_scratch() {
  static thread_local AttentionScratch scratch;
  return scratch;
}

// With dpbf16, the input as the tiles read it: its bf16 rounding, made once into `storage`
// (n elements).
AttentionInput attention_input(const float* x, int64_t n, std::vector<bf16>& storage) {
  bf16* dst = scratch_grow(storage, size_t(n));
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(x[i]);
  return {dst};
}

// x (B, T, nh, D) head-major into `storage` (B, nh, T, D), with bf16 dots rounded to bf16 (kept
// as f32).
const float* attention_head_major(const float* x, int64_t nh, const AttentionShape& s,
                                  std::vector<float>& storage) {
  const int64_t d = s.d;
  float* xh = scratch_grow(storage, size_t(s.b * s.t * nh * d));
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t bi = 0; bi < s.b; ++bi)
    for (int64_t ti = 0; ti < s.t; ++ti)
      for (int64_t head = 0; head < nh; ++head) {
        const float* src = x + ((bi * s.t + ti) * nh + head) * d;
        float* row = xh + ((bi * nh + head) * s.t + ti) * d;
        if (s.bf16)
          for (int64_t e = 0; e < d; ++e) row[e] = attention_round_bf16(src[e]);
        else
          std::copy(src, src + d, row);
      }
  return xh;
}

// xt (B, nh, D, tp) = the head-major xh (B, nh, T, D) by head and dimension, tokens along the
// rows, zero past T (up to tp), a key tile of 64 tokens at a time.
void attention_transpose_heads(float* xt, const float* xh, int64_t nh, int64_t tp,
                               const AttentionShape& s) {
  const int64_t d = s.d, tiles = s.k_tiles;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t bh = 0; bh < s.b * nh; ++bh)
    for (int64_t tile = 0; tile < tiles; ++tile) {
      const int64_t t0 = tile * kTileK, n = std::min(kTileK, s.t - t0);
      const float* src = xh + (bh * s.t + t0) * d;
      float* dst = xt + bh * d * tp + t0;
      for (int64_t e = 0; e < d; ++e) {
        float* row = dst + e * tp;
        for (int64_t j = 0; j < n; ++j) row[j] = src[j * d + e];
        std::fill(row + n, row + (tile + 1 == tiles ? tp - t0 : kTileK), 0.f);
      }
    }
}

// The portable kernel's inputs for one call, in the calling thread's scratch: the forward (dout
// null) reads the values in place and needs no vt.
AttentionFloats attention_floats(const float* q, const float* k, const float* v, const float* dout,
                                 const AttentionShape& s, AttentionScratch& scratch) {
  AttentionFloats in;
  in.tp = attention_cols_stride(s);
  in.q = attention_head_major(q, s.h, s, scratch.inputs_f32[0]);
  in.k = attention_head_major(k, s.hk, s, scratch.inputs_f32[1]);
  in.v = attention_head_major(v, s.hk, s, scratch.inputs_f32[2]);
  if (dout) in.dout = attention_head_major(dout, s.h, s, scratch.inputs_f32[3]);
  const size_t cols = size_t(s.b * s.hk * s.d * in.tp);
  float* kt = scratch_grow(scratch.kt, cols);
  attention_transpose_heads(kt, in.k, s.hk, in.tp, s);
  in.kt = kt;
  if (!dout) return in;
  float* vt = scratch_grow(scratch.vt, cols);
  attention_transpose_heads(vt, in.v, s.hk, in.tp, s);
  in.vt = vt;
  return in;
}

AttentionShape attention_shape(int64_t b, int64_t t, int64_t h, int64_t hk, int64_t d,
                               DType dot_type, AttentionIsa isa) {
  STRATA_CHECK(dot_type == DType::f32 || dot_type == DType::bf16,
               "attention: dot products run in f32 or bf16 (got ", dtype_name(dot_type), ")");
  STRATA_CHECK(attention_isa_supported(isa), "attention: this CPU cannot run the ",
               attention_isa_name(isa), " kernel");
  const bool bf16 = dot_type == DType::bf16;
  AttentionShape s{b,
                   t,
                   h,
                   hk,
                   d,
                   hk > 0 ? h / hk : 0,
                   (t + kTileQ - 1) / kTileQ,
                   (t + kTileK - 1) / kTileK,
                   bf16,
                   bf16 && isa != AttentionIsa::portable,
                   bf16 && isa == AttentionIsa::amx_bf16,
                   (d + 1) / 2 * 2,
                   bf16 && isa != AttentionIsa::portable ? (d + 15) / 16 * 16 : d};
  return s;
}

}  // namespace

const char* attention_isa_name(AttentionIsa isa) {
  switch (isa) {
    case AttentionIsa::avx512_bf16: return "avx512_bf16";
    case AttentionIsa::amx_bf16: return "amx_bf16";
    case AttentionIsa::portable: break;
  }
  return "portable";
}

bool attention_isa_supported(AttentionIsa isa) {
  if (isa == AttentionIsa::portable) return true;
  __builtin_cpu_init();
  // every CPU with AMX has AVX512-BF16; asking for both keeps the ISAs a ladder
  const bool avx512_bf16 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
  return isa == AttentionIsa::amx_bf16 ? avx512_bf16 && amx_bf16_available() : avx512_bf16;
}

AttentionIsa attention_isa_best() {
  static const AttentionIsa best = [] {
    for (AttentionIsa isa : {AttentionIsa::amx_bf16, AttentionIsa::avx512_bf16})
      if (attention_isa_supported(isa)) return isa;
    return AttentionIsa::portable;
  }();
  return best;
}

AttentionIsa attention_isa_choose(const char* want) {
  if (!want || !*want) return attention_isa_best();
  const std::string_view name(want);
  for (AttentionIsa isa : {AttentionIsa::portable, AttentionIsa::avx512_bf16, AttentionIsa::amx_bf16}) {
    if (name != attention_isa_name(isa)) continue;
    STRATA_CHECK(attention_isa_supported(isa), "STRATA_ATTENTION_ISA=", name,
                 " but this CPU (or OS) cannot run it; unset it or pick portable");
    return isa;
  }
  throw Error(ErrorKind::input, str_cat("STRATA_ATTENTION_ISA=", name,
                                        " is not a variant; use portable, avx512_bf16 or amx_bf16"));
}

AttentionIsa attention_isa_active() {
  static const AttentionIsa active = attention_isa_choose(std::getenv("STRATA_ATTENTION_ISA"));
  return active;
}

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const int32_t* doc_start, int64_t b, int64_t t, int64_t h, int64_t hk,
                       int64_t d, float scale, DType dot_type) {
  attention_forward_isa(out, lse, q, k, v, doc_start, b, t, h, hk, d, scale, dot_type,
                        attention_isa_active());
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* out, const float* lse,
                        const int32_t* doc_start, int64_t b, int64_t t, int64_t h, int64_t hk,
                        int64_t d, float scale, DType dot_type) {
  attention_backward_isa(dq, dk, dv, dout, q, k, v, out, lse, doc_start, b, t, h, hk, d, scale,
                         dot_type, attention_isa_active());
}

size_t attention_scratch_bytes(int64_t b, int64_t t, int64_t h, int64_t hk, int64_t d, DType dot_type,
                               AttentionIsa isa, size_t stored_ds_max_bytes) {
  const AttentionShape s = attention_shape(b, t, h, hk, d, dot_type, isa);
  if (!s.dpbf16)  // the transposes kt and vt, the inputs head-major
    return size_t(2 * b * hk * d * attention_cols_stride(s) + 2 * b * t * h * d + 2 * b * t * hk * d) *
           sizeof(float);
  const size_t inputs = size_t(2 * b * t * h * d + 2 * b * t * hk * d) * sizeof(bf16);  // q, dout; k, v
  const size_t ds = attention_stored_ds_bytes(b, t, h, d, dot_type, isa);
  return inputs + (ds <= stored_ds_max_bytes ? ds : 0);
}

size_t attention_scratch_held_bytes() {
  const AttentionScratch& s = attention_scratch();
  size_t bytes = s.ds_words.capacity() * sizeof(uint32_t);
  for (const auto& v : s.inputs) bytes += v.capacity() * sizeof(bf16);
  for (const auto& v : s.inputs_f32) bytes += v.capacity() * sizeof(float);
  return bytes + (s.kt.capacity() + s.vt.capacity()) * sizeof(float);
}

size_t attention_stored_ds_bytes(int64_t b, int64_t t, int64_t h, int64_t d, DType dot_type, AttentionIsa isa) {
  const AttentionShape s = attention_shape(b, t, h, h, d, dot_type, isa);
  return s.dpbf16 ? size_t(s.b * s.h * (s.q_tiles * (s.q_tiles + 1) / 2)) * (kTileQ * kTileK / 2) * sizeof(uint32_t) : 0;
}

void attention_forward_isa(float* out, float* lse, const float* q, const float* k, const float* v,
                           const int32_t* doc_start, int64_t b, int64_t t, int64_t h, int64_t hk,
                           int64_t d, float scale, DType dot_type, AttentionIsa isa) {
  const AttentionShape s = attention_shape(b, t, h, hk, d, dot_type, isa);
  attention_check_inputs(s, doc_start);
  const std::vector<int32_t> first_keys = attention_tile_first_keys(s, doc_start);  // (B, q_tiles)
  AttentionScratch& scratch = attention_scratch();
  AttentionInput qi{}, ki{}, vi{};
  AttentionFloats in;
  if (s.dpbf16) {
    qi = attention_input(q, b * t * h * d, scratch.inputs[0]);
    ki = attention_input(k, b * t * hk * d, scratch.inputs[1]);
    vi = attention_input(v, b * t * hk * d, scratch.inputs[2]);
  } else {
    in = attention_floats(q, k, v, nullptr, s, scratch);
  }
  const int64_t items = s.b * s.h * s.q_tiles;
#pragma omp parallel
  {
    AttentionWorkspace ws(s);
    // Late query tiles cost the most (causal), so hand them out first.
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t qt = s.q_tiles - 1 - it % s.q_tiles;
      const int64_t hi = (it / s.q_tiles) % s.h, bi = it / (s.q_tiles * s.h);
      attention_forward_tile(out, lse, qi, ki, vi, in, doc_start, first_keys[bi * s.q_tiles + qt],
                             bi, hi, qt, scale, s, ws);
    }
  }
}

void attention_backward_isa(float* dq, float* dk, float* dv, const float* dout, const float* q,
                            const float* k, const float* v, const float* out, const float* lse,
                            const int32_t* doc_start, int64_t b, int64_t t, int64_t h, int64_t hk,
                            int64_t d, float scale, DType dot_type, AttentionIsa isa,
                            size_t stored_ds_max_bytes) {
  const AttentionShape s = attention_shape(b, t, h, hk, d, dot_type, isa);
  attention_check_inputs(s, doc_start);
  const std::vector<int32_t> first_keys = attention_tile_first_keys(s, doc_start);  // (B, q_tiles)
  AttentionScratch& scratch = attention_scratch();
  std::vector<float> di(size_t(b * t * h));  // (B,T,H) rowsum(dout * out)
  if (!s.dpbf16) {
    const AttentionFloats in = attention_floats(q, k, v, dout, s, scratch);
    attention_output_dots(di.data(), in.dout, nullptr, out, s);
    attention_backward_portable(dq, dk, dv, in, lse, di.data(), doc_start, first_keys.data(), scale,
                                s);
    return;
  }
  AttentionStoredDs stored;  // pass 1 writes every slot pass 2 reads: stale words are never read
  stored.pairs = s.q_tiles * (s.q_tiles + 1) / 2;
  const size_t stored_bytes = attention_stored_ds_bytes(b, t, h, d, dot_type, isa);
  if (stored_bytes > 0 && stored_bytes <= stored_ds_max_bytes) {
    const size_t words = stored_bytes / sizeof(uint32_t);
    stored.words = scratch_grow(scratch.ds_words, words);
  }
  const AttentionInput qi = attention_input(q, b * t * h * d, scratch.inputs[0]);
  const AttentionInput ki = attention_input(k, b * t * hk * d, scratch.inputs[1]);
  const AttentionInput vi = attention_input(v, b * t * hk * d, scratch.inputs[2]);
  const AttentionInput doi = attention_input(dout, b * t * h * d, scratch.inputs[3]);
  attention_output_dots(di.data(), nullptr, doi.bf, out, s);
  const int64_t kv_items = s.b * s.hk * s.k_tiles;
  const int64_t q_items = s.b * s.h * s.q_tiles;
#pragma omp parallel
  {
    AttentionWorkspace ws(s);
    // Early key tiles are seen by the most queries, so hand them out first.
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < kv_items; ++it) {
      const int64_t kt = it % s.k_tiles;
      const int64_t g = (it / s.k_tiles) % s.hk, bi = it / (s.k_tiles * s.hk);
      attention_backward_kv_tile(dk, dv, doi, qi, ki, vi, lse, di.data(), doc_start,
                                 first_keys.data(), bi, g, kt, scale, s, ws, stored);
    }
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < q_items; ++it) {
      const int64_t qt = s.q_tiles - 1 - it % s.q_tiles;
      const int64_t hi = (it / s.q_tiles) % s.h, bi = it / (s.q_tiles * s.h);
      attention_backward_q_tile(dq, doi, qi, ki, vi, lse, di.data(), doc_start,
                                first_keys[bi * s.q_tiles + qt], bi, hi, qt, scale, s, ws, stored);
    }
  }
}

}  // namespace strata::cpu
