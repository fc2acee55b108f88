// The CPU attention kernel's shared parts: tile sizes, the call's shape, per-thread tiles, inputs.
//
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
// Masking: query t sees keys s with doc_start[b,t] <= s <= t, and with a sliding window
// (window > 0) s > t - window too: first(t) = max(doc_start[b,t], t - window + 1). Key tiles entirely outside
// [min first of the query tile, last query of the tile] are skipped, and in the backward,
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
//
// The kernel's files: attention.cpp (the shape, the per-call inputs and scratch, the public ISA
// choice and sizes), attention_fwd.cpp (the forward), attention_bwd.cpp (the backward's entry and
// D_i; P and dS of a tile pair), attention_bwd_portable.cpp and attention_bwd_dpbf16.cpp (the
// backward's two kernels), attention_gemm.h (the portable f32 products), attention_pack.cpp
// (the bf16 tile layouts) and attention_dpbf16.cpp (the vdpbf16ps products, or AMX's).
#pragma once
#include <algorithm>
#include <bit>
#include <cstdint>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/scratch.h"

namespace strata::cpu {

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
  int64_t window;   // sliding window (> 0: query t sees keys s > t - window); <= 0: none
};

// The first key query ti of row bi sees: its document's start, or the window's first key when
// that is later (ti - window + 1).
inline int64_t attention_query_first_key(const int32_t* doc_start, int64_t bi, int64_t ti, const AttentionShape& s) {
  const int64_t ds = doc_start ? int64_t(doc_start[bi * s.t + ti]) : 0;
  return s.window > 0 && ti - s.window + 1 > ds ? ti - s.window + 1 : ds;
}

// Per-thread tiles. The names say the layout: *_rows are (tile, D).
struct AttentionWorkspace {
  LineVector<float> v_rows;           // (kTileK, D) with dpbf16: the widened bf16 values
  LineVector<float> scores, dscores;  // (kTileQ, kTileK)
  LineVector<float> acc, acc2;        // (max tile, D)
  LineVector<float> row_a, row_b;     // (kTileQ)
  std::vector<int64_t> first, last;    // (kTileQ) visible key range of each query
  std::vector<int64_t> key_lo, key_hi;     // (kTileK) range of the queries that see each key
  LineVector<bf16> q_bf, do_bf;           // (kTileQ, dp) with dpbf16: bf16 rows, zero-padded
  LineVector<uint32_t> k_pairs, v_pairs;  // (dp/2, kTileK) with dpbf16: bf16 pairs (e, e+1)
  // With dpbf16, the operands of the products summed over tokens: row pairs (tile/2, da) hold
  // tokens 2p (low half) and 2p + 1 (high half) of one column; weight pairs hold P or dS rounded
  // to bf16, two keys per word in a row (tile, kTileK/2) or two queries per word in a column
  // (kTileQ/2, kTileK).
  LineVector<uint32_t> x_rpairs, y_rpairs;  // (max tile / 2, da)
  LineVector<uint32_t> w_pairs, w2_pairs;   // (kTileQ * kTileK / 2)
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

inline int64_t attention_cols_stride(const AttentionShape& s) { return s.k_tiles * kTileK + 16; }

constexpr int64_t kVecPerTile = kTileK / 16;  // the AVX-512 vdpbf16ps kernels: 16-float vectors per key tile
static_assert(kTileK % 16 == 0);

// The high half of a bf16-valued f32 (its bf16 bits, exactly).
inline uint32_t attention_bf16_bits(float x) { return std::bit_cast<uint32_t>(x) >> 16; }

// x rounded to bf16 (nearest even), kept as f32.
inline float attention_round_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }

// Visible key range [first, last] of each query of the tile, relative to key s0; empty when
// first > last. Queries t0.., first keys from doc_start (or 0) and the window.
inline void attention_tile_ranges(AttentionWorkspace& ws, const int32_t* doc_start, int64_t bi,
                                  int64_t t0, int64_t nq, int64_t s0, int64_t nk,
                                  const AttentionShape& s) {
  for (int64_t i = 0; i < nq; ++i) {
    const int64_t first = attention_query_first_key(doc_start, bi, t0 + i, s);
    ws.first[i] = std::max<int64_t>(first - s0, 0);
    ws.last[i] = std::min<int64_t>(t0 + i - s0, nk - 1);
  }
}

// ---- attention.cpp: the call's shape, checks and inputs ----
// The large transients of a call (the portable kernel's key and value transposes and, with bf16
// dots, its inputs' roundings; the vdpbf16ps and AMX kernels' bf16 input copies and kept dS),
// kept by the calling thread (the device's compute stream) from one call to the next: a step
// makes 2L calls of one shape, and allocating, faulting in and freeing the same megabytes every
// time cost ~15% of the forward and ~7% of the backward at B4 T512 H8/4 D64. They only grow, to
// the largest call's.
struct AttentionScratch {
  LineVector<bf16> inputs[4];       // q, k, v, dout (dpbf16)
  LineVector<float> inputs_f32[4];  // q, k, v, dout head-major (portable)
  LineVector<float> kt, vt;         // AttentionFloats::kt, vt (portable)
  LineVector<uint32_t> ds_words;    // AttentionStoredDs::words
};

AttentionShape attention_shape(int64_t b, int64_t t, int64_t h, int64_t hk, int64_t d,
                               DType dot_type, AttentionIsa isa, int64_t window = 0);
void attention_check_inputs(const AttentionShape& s, const int32_t* doc_start);
// Smallest first key (attention_query_first_key) of each query tile: (B, q_tiles).
std::vector<int32_t> attention_tile_first_keys(const AttentionShape& s, const int32_t* doc_start);
// The calling thread's scratch.
AttentionScratch& attention_scratch();
// With dpbf16, the input as the tiles read it: its bf16 rounding, made once into `storage`
// (n elements).
AttentionInput attention_input(const float* x, int64_t n, LineVector<bf16>& storage);
// The portable kernel's inputs for one call, in the calling thread's scratch: the forward (dout
// null) reads the values in place and needs no vt.
AttentionFloats attention_floats(const float* q, const float* k, const float* v, const float* dout,
                                 const AttentionShape& s, AttentionScratch& scratch);

// ---- attention_pack.cpp: the bf16 tile layouts of the vdpbf16ps and AMX kernels ----
// With dpbf16: copies n rows of one head from x (B,T,nh,D) starting at token t0, the bf16 bits
// into rows_bf (n, dp) when not null, the values widened into rows (n, D) when not null.
void attention_load_rows(float* rows, bf16* rows_bf, AttentionInput x, int64_t bi, int64_t t0,
                         int64_t n, int64_t head, int64_t nh, const AttentionShape& s);
// With dpbf16: n rows of one head from x (as attention_load_rows) into row pairs (ceil(n/2), da):
// word (p, e) holds token 2p's column e in its low half and token 2p + 1's in its high half;
// zero past d and past the last token.
void attention_load_row_pairs(uint32_t* pairs, AttentionInput x, int64_t bi, int64_t t0, int64_t n,
                              int64_t head, int64_t nh, const AttentionShape& s);
// With dpbf16: n rows of one head, as attention_load_rows reads them, transposed into pairs
// (dp/2, kTileK), the low half of each word holding element 2p and the high half 2p + 1 (zero
// past d).
void attention_load_cols(uint32_t* pairs, AttentionInput x, int64_t bi, int64_t t0, int64_t n,
                         int64_t head, int64_t nh, const AttentionShape& s);
// Weight pairs along a row: dst (rows, kTileK/2) from the bf16-valued tile w (rows, kTileK),
// word (i, p) = w[i][2p] | w[i][2p + 1] << 16; columns at or past n are zero.
void attention_pack_row_weights(uint32_t* dst, const float* w, int64_t rows, int64_t n);
// Weight pairs down a column: dst (ceil(rows/2), kTileK) from the bf16-valued tile w
// (rows, kTileK), word (p, j) = w[2p][j] | w[2p + 1][j] << 16; row `rows` (odd rows) is zero.
void attention_pack_col_weights(uint32_t* dst, const float* w, int64_t rows);
// Weight pairs down the columns of w one key per row, as AMX reads the weights of a sum over
// queries: dst (nk, kTileQ/2), word (j, p) = w[2p][j] | w[2p + 1][j] << 16 (the high half zero
// where 2p + 1 = rows); `tmp` receives attention_pack_col_weights's layout on the way.
void attention_pack_col_weights_by_key(uint32_t* dst, uint32_t* tmp, const float* w, int64_t rows,
                                       int64_t nk);

// ---- attention_dpbf16.cpp: the bf16 pair products ----
// c (nq, kTileK) = the bf16 rows a_bf · the key pairs over D for one tile, on AMX tiles or
// vdpbf16ps.
void attention_tile_scores_dpbf16(float* c, const bf16* a_bf, const uint32_t* pairs, int64_t nq,
                                  const AttentionShape& s);
// The products summed over tokens, on vdpbf16ps: c (m, ldc) += a · b, where row r of a is m
// weight pairs a[r * a_rs + p * a_ps] (p < np: tokens 2p, 2p + 1) and b is np row pairs (np, ldb)
// of nv 16-column vectors, every c element summed over p in order.
void attention_pairs_gemm(float* c, int64_t ldc, const uint32_t* a, int64_t a_rs, int64_t a_ps,
                          const uint32_t* b, int64_t ldb, int64_t m, int64_t np, int64_t nv);

// ---- attention_bwd.cpp: what both backward kernels share ----
// P and dS = P * (dP - D_i) of one (query tile, key tile) pair, in place of its scores in
// ws.scores and dP in ws.dscores: zero outside the visible ranges (ws.first, ws.last), rounded
// to bf16 with bf16 dots. lse_t, di_t: the query tile's lse and D_i.
void attention_tile_weights(const float* lse_t, const float* di_t, int64_t nq, int64_t nk,
                            float scale, const AttentionShape& s, AttentionWorkspace& ws);
// Loads lse and D_i of query tile (bi, hi, t0..t0+nq) into ws.row_a, ws.row_b.
void attention_load_row_stats(const float* lse, const float* di, int64_t bi, int64_t hi, int64_t t0,
                              int64_t nq, const AttentionShape& s, AttentionWorkspace& ws);

// ---- attention_bwd_portable.cpp, attention_bwd_dpbf16.cpp: the two backward kernels ----
// dq (B,T,H,D), dk and dv (B,T,Hk,D) written; lse and di (B,T,H); tile_first_keys (B, q_tiles).
void attention_backward_portable(float* dq, float* dk, float* dv, const AttentionFloats& in,
                                 const float* lse, const float* di, const int32_t* doc_start,
                                 const int32_t* tile_first_keys, float scale,
                                 const AttentionShape& s);
// stored: pass 1's dS weights for pass 2 (null words: pass 2 recomputes them).
void attention_backward_dpbf16(float* dq, float* dk, float* dv, AttentionInput dout, AttentionInput q,
                               AttentionInput k, AttentionInput v, const float* lse, const float* di,
                               const int32_t* doc_start, const int32_t* tile_first_keys, float scale,
                               const AttentionShape& s, const AttentionStoredDs& stored);

}  // namespace strata::cpu
