// GRPO's group-normalised advantages (TRL 1.16 GRPOTrainer, multi_objective_aggregation =
// "sum_then_normalize"): rewards r (n = groups x G, a group's G completions adjacent), the
// group mean m_g, and std s = the unbiased standard deviation of the group ("group"), of the
// whole batch ("batch"), or none:  A = r - m_g, divided by (s + 1e-4) unless scale_rewards is
// "none". Also the reward std metric TRL logs (the groups' std, averaged).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace strata {

enum class GrpoScaleRewards { group, batch, none };
GrpoScaleRewards grpo_scale_rewards_parse(const std::string& name);  // exit 2 naming the valid ones

struct GrpoAdvantages {
  std::vector<double> advantages;  // (n)
  double reward_std = 0;           // mean over groups of the group std (TRL's "reward_std")
  double frac_reward_zero_std = 0; // groups whose rewards are all equal (no signal)
};

GrpoAdvantages grpo_advantages(const std::vector<double>& rewards, int64_t G, GrpoScaleRewards scale);

}  // namespace strata
