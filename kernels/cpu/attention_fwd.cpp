// The CPU attention forward: per query tile, online softmax over its key tiles (flash-style).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/attention_gemm.h"
#include "kernels/cpu/attention_tiles.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec_exp.h"

namespace strata::cpu {
namespace {

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

}  // namespace

void attention_forward_isa(float* out, float* lse, const float* q, const float* k, const float* v,
                           const int32_t* doc_start, int64_t b, int64_t t, int64_t h, int64_t hk,
                           int64_t d, float scale, DType dot_type, AttentionIsa isa, int64_t window) {
  const AttentionShape s = attention_shape(b, t, h, hk, d, dot_type, isa, window);
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

}  // namespace strata::cpu
