// Host routing of the mixture-of-experts layer (models/moe_routing.h).
#include "models/moe_routing.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "src/core/error.h"

namespace strata {

MoeRouting moe_route(const float* logits, int64_t n, int64_t e, int64_t k, bool norm_topk_prob) {
  STRATA_CHECK(n >= 0 && e > 0 && k > 0 && k <= e, "MoE routing: need 0 < k <= experts, got k=", k, " experts=", e);
  MoeRouting r;
  r.n = n, r.e = e, r.k = k;
  r.renormalised = norm_topk_prob;
  r.probs.resize(size_t(n * e));
  r.expert.resize(size_t(n * k));
  r.weight.resize(size_t(n * k));
  std::vector<int32_t> order(static_cast<size_t>(e));
  std::vector<double> p(static_cast<size_t>(e));
  for (int64_t t = 0; t < n; ++t) {
    const float* l = logits + t * e;  // (E)
    const double mx = *std::max_element(l, l + e);
    double sum = 0;
    for (int64_t x = 0; x < e; ++x) sum += p[size_t(x)] = std::exp(double(l[x]) - mx);
    for (int64_t x = 0; x < e; ++x) r.probs[size_t(t * e + x)] = float(p[size_t(x)] / sum);
    // the k largest logits (softmax keeps the order), ties to the lower index
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
    double top = 0;
    for (int64_t j = 0; j < k; ++j) top += p[size_t(order[size_t(j)])] / sum;
    for (int64_t j = 0; j < k; ++j) {
      const double pj = p[size_t(order[size_t(j)])] / sum;
      r.expert[size_t(t * k + j)] = order[size_t(j)];
      r.weight[size_t(t * k + j)] = float(norm_topk_prob ? pj / top : pj);
    }
  }
  // rows expert by expert, tokens ascending within each (a counting sort)
  r.offsets.assign(size_t(e + 1), 0);
  for (int32_t x : r.expert) ++r.offsets[size_t(x) + 1];
  for (int64_t x = 0; x < e; ++x) r.offsets[size_t(x) + 1] += r.offsets[size_t(x)];
  std::vector<int32_t> fill(r.offsets.begin(), r.offsets.end() - 1);
  r.row_token.resize(size_t(n * k));
  r.row_weight.resize(size_t(n * k));
  r.token_row.resize(size_t(n * k));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int32_t row = fill[size_t(r.expert[size_t(t * k + j)])]++;
      r.row_token[size_t(row)] = int32_t(t);
      r.row_weight[size_t(row)] = r.weight[size_t(t * k + j)];
      r.token_row[size_t(t * k + j)] = row;
    }
  return r;
}

void moe_route_backward(float* dlogits, const MoeRouting& r, const float* drow_weight, const double* dprob) {
  const int64_t n = r.n, e = r.e, k = r.k;
  std::vector<double> dp(static_cast<size_t>(e));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t x = 0; x < e; ++x) dp[size_t(x)] = dprob ? dprob[x] : 0.0;
    // through the renormalisation w_j = p_j / S (S the sum of the chosen p): dp_i += (dw_i - sum_j dw_j w_j) / S
    double s = 0, dot = 0;
    for (int64_t j = 0; j < k; ++j) s += r.probs[size_t(t * e + r.expert[size_t(t * k + j)])];
    for (int64_t j = 0; j < k; ++j)
      dot += double(drow_weight[r.token_row[size_t(t * k + j)]]) * double(r.weight[size_t(t * k + j)]);
    const bool renorm = r.renormalised;
    for (int64_t j = 0; j < k; ++j) {
      const double dw = drow_weight[r.token_row[size_t(t * k + j)]];
      dp[size_t(r.expert[size_t(t * k + j)])] += renorm ? (dw - dot) / s : dw;
    }
    // through the softmax: dl_x = p_x (dp_x - sum_y p_y dp_y)
    double pdp = 0;
    for (int64_t x = 0; x < e; ++x) pdp += double(r.probs[size_t(t * e + x)]) * dp[size_t(x)];
    for (int64_t x = 0; x < e; ++x)
      dlogits[t * e + x] = float(double(r.probs[size_t(t * e + x)]) * (dp[size_t(x)] - pdp));
  }
}

}  // namespace strata
