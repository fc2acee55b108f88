// The load-balancing auxiliary loss of mixture-of-experts models, as transformers computes it
// (load_balancing_loss_func in modeling_qwen3_moe.py / modeling_mixtral.py, no attention mask):
// over the R = (MoE layers) x N (tokens) router rows of a micro-batch,
//   aux = E * sum_e (count_e / R) * (prob_sum_e / R)
// where count_e is how many rows chose expert e among their top k, prob_sum_e the sum of the rows'
// softmax probabilities of e. Only the probabilities carry a gradient (the counts are histograms):
//   d aux / d p[row, e] = E * count_e / R^2, the same for every row of every MoE layer.
// The model's loss adds router_aux_loss_coef * aux. The counts are known once every MoE layer's
// forward has run, which is before any backward: the forwards add to this state, the backwards
// read dprob from it.
#pragma once
#include <cstdint>
#include <vector>

namespace strata {

struct MoeAuxLoss {
  int64_t experts = 0;
  double coef = 0;         // router_aux_loss_coef
  double grad_scale = 1;   // d (the engine's loss) / d (coef * aux): the scale its backward runs at
  std::vector<double> count, prob_sum;  // (E)
  double rows = 0;

  MoeAuxLoss(int64_t e, double c) : experts(e), coef(c), count(size_t(e), 0.0), prob_sum(size_t(e), 0.0) {}
  void reset() {
    count.assign(size_t(experts), 0.0);
    prob_sum.assign(size_t(experts), 0.0);
    rows = 0;
  }
  // coef * aux
  double loss() const {
    if (rows == 0) return 0;
    double s = 0;
    for (int64_t e = 0; e < experts; ++e) s += (count[size_t(e)] / rows) * (prob_sum[size_t(e)] / rows);
    return coef * double(experts) * s;
  }
  // dprob (E) = grad_scale * coef * d aux / d p[row, e]
  std::vector<double> dprob() const {
    std::vector<double> d(size_t(experts), 0.0);
    if (rows == 0) return d;
    for (int64_t e = 0; e < experts; ++e)
      d[size_t(e)] = grad_scale * coef * double(experts) * count[size_t(e)] / (rows * rows);
    return d;
  }
};

}  // namespace strata
