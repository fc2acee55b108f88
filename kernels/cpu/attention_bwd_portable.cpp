// The portable attention backward: f32 tile products, one pass per kv head group or two passes.
#include <omp.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/attention_gemm.h"
#include "kernels/cpu/attention_tiles.h"

namespace strata::cpu {
namespace {

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

}  // namespace

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

}  // namespace strata::cpu
