// Plain-loop twin of the lm_head + cross-entropy kernels in kernels/cpu/ops.h (same argument
// order). One row's logits (V) at a time, max-subtracted log-softmax; no chunking, no threads.
// The vocab-chunked twins (lm_head_ce_chunk_*) keep per-row stats (N,3) = {max, sum of
// exp(z - max), target logit} across chunks of vocab rows, as ops.h describes.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "src/core/error.h"

namespace strata::ref {

inline constexpr int32_t kCeIgnoreIndex = -100;

// logits (V) of row i = h[i] · w^T, and their log-sum-exp.
template <class T>
T ce_row_logits(std::vector<T>& logits, const T* h, const T* w, int64_t i, int64_t c, int64_t v) {
  logits.assign(size_t(v), T(0));
  T m = 0;
  for (int64_t j = 0; j < v; ++j) {
    T s = 0;
    for (int64_t e = 0; e < c; ++e) s += h[i * c + e] * w[j * c + e];
    logits[j] = s;
    if (j == 0 || s > m) m = s;
  }
  T sum = 0;
  for (int64_t j = 0; j < v; ++j) sum += std::exp(logits[j] - m);
  return m + std::log(sum);
}

inline void ce_check_target(const int32_t* targets, int64_t i, int64_t v) {
  STRATA_CHECK(targets[i] == kCeIgnoreIndex || (targets[i] >= 0 && targets[i] < v),
               "lm_head_ce: row ", i, " has target id ", targets[i], " outside [0, ", v,
               "); use -100 to ignore a token");
}

// h (N,C), w (V,C), targets (N). Returns sum over counted rows of -log p[target].
template <class T>
double lm_head_ce_forward(int64_t* count, const T* h, const T* w, const int32_t* targets, int64_t n,
                          int64_t c, int64_t v) {
  std::vector<T> logits;  // (V)
  T loss = 0;
  *count = 0;
  for (int64_t i = 0; i < n; ++i) {
    ce_check_target(targets, i, v);
    if (targets[i] == kCeIgnoreIndex) continue;
    const T lse = ce_row_logits(logits, h, w, i, c, v);
    loss += lse - logits[targets[i]];
    ++*count;
  }
  return double(loss);
}

// dh (N,C) written, dw (V,C) accumulated, with the gradient of grad_scale * (returned sum).
template <class T>
double lm_head_ce_backward(T* dh, T* dw, int64_t* count, const T* h, const T* w,
                           const int32_t* targets, int64_t n, int64_t c, int64_t v, T grad_scale) {
  std::vector<T> logits;  // (V)
  T loss = 0;
  *count = 0;
  for (int64_t i = 0; i < n; ++i) {
    ce_check_target(targets, i, v);
    for (int64_t e = 0; e < c; ++e) dh[i * c + e] = 0;
    if (targets[i] == kCeIgnoreIndex) continue;
    const T lse = ce_row_logits(logits, h, w, i, c, v);
    loss += lse - logits[targets[i]];
    ++*count;
    for (int64_t j = 0; j < v; ++j) {
      const T g = grad_scale * (std::exp(logits[j] - lse) - (j == targets[i] ? T(1) : T(0)));
      for (int64_t e = 0; e < c; ++e) {
        dh[i * c + e] += g * w[j * c + e];
        dw[j * c + e] += g * h[i * c + e];
      }
    }
  }
  return double(loss);
}

// ---- vocab-chunked: w_chunk (vc,C) holds vocab rows [v0, v0 + vc) -------------------------

// Updates stats (N,3) with one chunk's logits; `first` initialises them.
template <class T>
void lm_head_ce_chunk_stats(T* stats, const T* h, const T* w_chunk, const int32_t* targets,
                            int64_t n, int64_t c, int64_t v, int64_t v0, int64_t vc, bool first) {
  std::vector<T> logits;  // (vc)
  for (int64_t i = 0; i < n; ++i) {
    ce_check_target(targets, i, v);
    T* st = stats + 3 * i;
    if (first) st[0] = st[1] = st[2] = T(0);
    if (targets[i] == kCeIgnoreIndex) continue;
    const T lse = ce_row_logits(logits, h, w_chunk, i, c, vc);
    T m = logits[0];
    for (int64_t j = 1; j < vc; ++j) m = logits[j] > m ? logits[j] : m;
    const T s = std::exp(lse - m);  // sum of exp(z - m)
    if (first) {
      st[0] = m;
      st[1] = s;
    } else {
      const T mx = st[0] > m ? st[0] : m;
      st[1] = st[1] * std::exp(st[0] - mx) + s * std::exp(m - mx);
      st[0] = mx;
    }
    const int64_t t = targets[i] - v0;
    if (t >= 0 && t < vc) st[2] = logits[size_t(t)];
  }
}

// Each counted row's softmax entropy H = -Σ_j p_j log p_j over all V logits of h[i] · w^T,
// log p_j = z_j - logsumexp(z) (GRPO's entropy metric; the fast paths keep an online accumulator,
// ops.h lm_head_ce_chunk_stats_entropy). ent (N); ignored rows get NaN.
template <class T>
void ce_ref_entropy(T* ent, const T* h, const T* w, const int32_t* targets, int64_t n, int64_t c, int64_t v) {
  std::vector<T> logits;  // (V)
  for (int64_t i = 0; i < n; ++i) {
    ce_check_target(targets, i, v);
    if (targets[i] == kCeIgnoreIndex) {
      ent[i] = T(NAN);
      continue;
    }
    const T lse = ce_row_logits(logits, h, w, i, c, v);
    T H = 0;
    for (int64_t j = 0; j < v; ++j) {
      const T logp = logits[size_t(j)] - lse;
      H -= std::exp(logp) * logp;
    }
    ent[i] = H;
  }
}

// Sum over counted rows of max + log(sum) - target logit.
template <class T>
double lm_head_ce_stats_loss(int64_t* count, const T* stats, const int32_t* targets, int64_t n,
                             int64_t v) {
  T loss = 0;
  *count = 0;
  for (int64_t i = 0; i < n; ++i) {
    ce_check_target(targets, i, v);
    if (targets[i] == kCeIgnoreIndex) continue;
    loss += stats[3 * i] + std::log(stats[3 * i + 1]) - stats[3 * i + 2];
    ++*count;
  }
  return double(loss);
}

// dh (N,C) and dw_chunk (vc,C) accumulated with this chunk's share of the gradient of
// grad_scale * (summed loss), from the final stats.
template <class T>
void lm_head_ce_chunk_backward(T* dh, T* dw_chunk, const T* h, const T* w_chunk, const T* stats,
                               const int32_t* targets, int64_t n, int64_t c, int64_t v, int64_t v0,
                               int64_t vc, T grad_scale) {
  std::vector<T> logits;  // (vc)
  for (int64_t i = 0; i < n; ++i) {
    ce_check_target(targets, i, v);
    if (targets[i] == kCeIgnoreIndex) continue;
    ce_row_logits(logits, h, w_chunk, i, c, vc);
    const T* st = stats + 3 * i;
    for (int64_t j = 0; j < vc; ++j) {
      const T p = std::exp(logits[size_t(j)] - st[0]) / st[1];
      const T g = grad_scale * (p - (j + v0 == targets[i] ? T(1) : T(0)));
      for (int64_t e = 0; e < c; ++e) {
        dh[i * c + e] += g * w_chunk[j * c + e];
        dw_chunk[j * c + e] += g * h[i * c + e];
      }
    }
  }
}

// ---- preference objectives: per-sequence sums, per-token weighted backward ----------------

// seq_sums (S,2) = {Σ log p(target), count} per sequence from the final stats; seq (N) in
// [0, S) or -1.
template <class T>
void lm_head_ce_stats_seq_sums(double* seq_sums, const T* stats, const int32_t* targets,
                               const int32_t* seq, int64_t n, int64_t v, int64_t num_seqs) {
  for (int64_t q = 0; q < 2 * num_seqs; ++q) seq_sums[q] = 0;
  for (int64_t i = 0; i < n; ++i) {
    ce_check_target(targets, i, v);
    if (targets[i] == kCeIgnoreIndex || seq[i] < 0) continue;
    const T* st = stats + 3 * i;
    seq_sums[2 * seq[i]] += double(st[2] - st[0] - std::log(st[1]));
    seq_sums[2 * seq[i] + 1] += 1;
  }
}

// lm_head_ce_chunk_backward with row i's gradient scaled by token_weight[i] * grad_scale.
template <class T>
void lm_head_ce_chunk_backward_weighted(T* dh, T* dw_chunk, const T* h, const T* w_chunk,
                                        const T* stats, const int32_t* targets,
                                        const T* token_weight, int64_t n, int64_t c, int64_t v,
                                        int64_t v0, int64_t vc, T grad_scale) {
  std::vector<int32_t> one(1);
  for (int64_t i = 0; i < n; ++i) {  // row by row: the unweighted twin on one row
    ce_check_target(targets, i, v);
    if (targets[i] == kCeIgnoreIndex) continue;
    one[0] = targets[i];
    lm_head_ce_chunk_backward(dh + i * c, dw_chunk, h + i * c, w_chunk, stats + 3 * i, one.data(), 1, c, v, v0,
                              vc, T(grad_scale * token_weight[i]));
  }
}

}  // namespace strata::ref
