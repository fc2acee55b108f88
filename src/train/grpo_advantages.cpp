// GRPO's group-normalised advantages (grpo_advantages.h), in double.
#include "src/train/grpo_advantages.h"

#include <cmath>

#include "src/core/error.h"

namespace strata {
namespace {

// mean and unbiased std of x[first, first + n); n = 1: std 0
void mean_std(const std::vector<double>& x, size_t first, size_t n, double* mean, double* sd) {
  double s = 0;
  for (size_t i = first; i < first + n; ++i) s += x[i];
  *mean = s / double(n);
  double q = 0;
  for (size_t i = first; i < first + n; ++i) q += (x[i] - *mean) * (x[i] - *mean);
  *sd = n > 1 ? std::sqrt(q / double(n - 1)) : 0.0;
}

}  // namespace

GrpoScaleRewards grpo_scale_rewards_parse(const std::string& name) {
  if (name == "group") return GrpoScaleRewards::group;
  if (name == "batch") return GrpoScaleRewards::batch;
  if (name == "none") return GrpoScaleRewards::none;
  STRATA_CHECK(false, "grpo.scale_rewards \"", name, "\" is not one of group, batch, none");
  return GrpoScaleRewards::group;
}

GrpoAdvantages grpo_advantages(const std::vector<double>& rewards, int64_t G, GrpoScaleRewards scale) {
  STRATA_CHECK(G >= 1 && !rewards.empty() && rewards.size() % size_t(G) == 0, "GRPO: ", rewards.size(),
               " rewards are not whole groups of num_generations = ", G);
  const size_t n = rewards.size(), g = size_t(G), groups = n / g;
  GrpoAdvantages out;
  out.advantages.resize(n);
  double batch_mean = 0, batch_sd = 0;
  mean_std(rewards, 0, n, &batch_mean, &batch_sd);
  for (size_t k = 0; k < groups; ++k) {
    double m = 0, sd = 0;
    mean_std(rewards, k * g, g, &m, &sd);
    out.reward_std += sd / double(groups);
    if (std::abs(sd) <= 1e-8) out.frac_reward_zero_std += 1.0 / double(groups);  // torch.isclose's atol
    const double s = scale == GrpoScaleRewards::batch ? batch_sd : sd;
    for (size_t i = k * g; i < (k + 1) * g; ++i) {
      const double a = rewards[i] - m;
      out.advantages[i] = scale == GrpoScaleRewards::none ? a : a / (s + 1e-4);
    }
  }
  return out;
}

}  // namespace strata
