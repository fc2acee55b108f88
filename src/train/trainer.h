// The first-order trainer (issue 2's first `strata train`): model resident in the device arena,
// fp32 master weights and AdamW moments on the host, gradient accumulation with a token-mean
// loss over the whole optimizer step, exact global-norm clipping, warmup + cosine/linear
// schedule, metrics.jsonl per step and a Hugging Face export at the end.
#pragma once
#include <string>
#include <vector>

#include "src/recipe/recipe.h"

namespace strata {

struct TrainSummary {
  std::vector<double> losses;  // per optimizer step
  double tokens_per_s = 0;     // over the whole run, after the first step
  double matmul_share = 0;     // fraction of compute time spent in matmuls (sampled)
  std::string final_dir;
};

TrainSummary train_run(const Recipe& recipe);

// HF-style learning-rate multiplier for 0-based step `s` of `total`.
double lr_schedule(const std::string& type, int64_t s, int64_t total, int64_t warmup, double min_ratio);

}  // namespace strata
