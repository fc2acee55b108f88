#include "src/train/accumulation.h"

#include "src/core/error.h"

namespace strata {

std::string accumulation_layer_major_obstacle(const Recipe& rc, bool tied_lm_head, int ranks) {
  if (rc.optim_type != "adamw") return str_cat("optim.type = \"", rc.optim_type, "\" has no backward to accumulate");
  if (ranks > 1) return "data parallel runs all-reduce each micro-batch's gradient (one rank only in this version)";
  if (tied_lm_head && !rc.lora_enabled)
    return "a tied lm_head's gradient shares the embedding's rows with every micro-batch's scatter-add, so a sum "
           "over the step on the device would change the order of the additions";
  if (rc.offload_recompute == "never")
    return "offload.recompute = \"never\" keeps one micro-batch's activations per layer, and a layer-major pass "
           "runs several through each layer";
  return "";
}

int64_t accumulation_group(const Recipe& rc, bool tied_lm_head, int ranks, const std::function<bool(int64_t)>& plan_fits) {
  const int64_t k = rc.gradient_accumulation_steps;
  if (rc.offload_accumulation == "micro_batch" || k <= 1) return 1;
  const std::string obstacle = accumulation_layer_major_obstacle(rc, tied_lm_head, ranks);
  if (rc.offload_accumulation == "layer_major") {
    STRATA_CHECK(obstacle.empty(), "offload.accumulation = \"layer_major\" does not apply here: ", obstacle,
                 "; set offload.accumulation = \"micro_batch\" or \"auto\"");
    return k;
  }
  return obstacle.empty() && plan_fits(k) ? k : 1;
}

}  // namespace strata
