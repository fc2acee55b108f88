// The attention backward on vdpbf16ps or AMX: pass 1 dK and dV per key tile, pass 2 dQ per query tile.
#include <algorithm>
#include <cstdint>

#include "kernels/cpu/amx.h"
#include "kernels/cpu/attention_tiles.h"

namespace strata::cpu {
namespace {

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

}  // namespace

// The two passes; dk, dv and dq written (pass 2 reads what pass 1 kept in `stored`).
void attention_backward_dpbf16(float* dq, float* dk, float* dv, AttentionInput dout, AttentionInput q,
                               AttentionInput k, AttentionInput v, const float* lse, const float* di,
                               const int32_t* doc_start, const int32_t* tile_first_keys, float scale,
                               const AttentionShape& s, const AttentionStoredDs& stored) {
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
      attention_backward_kv_tile(dk, dv, dout, q, k, v, lse, di, doc_start, tile_first_keys, bi, g, kt,
                                 scale, s, ws, stored);
    }
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < q_items; ++it) {
      const int64_t qt = s.q_tiles - 1 - it % s.q_tiles;
      const int64_t hi = (it / s.q_tiles) % s.h, bi = it / (s.q_tiles * s.h);
      attention_backward_q_tile(dq, dout, q, k, v, lse, di, doc_start, tile_first_keys[bi * s.q_tiles + qt],
                                bi, hi, qt, scale, s, ws, stored);
    }
  }
}

}  // namespace strata::cpu
