// offload.accumulation (DESIGN §3, offload/engine.cpp, "Layer-major passes"): which schedule a run's
// gradient accumulation takes. "layer_major" runs the step's k micro-batches through each layer
// together (EngineOptions::group = k); "micro_batch" one at a time (group 1); "auto" takes
// layer_major where it applies and its placement plan fits the budgets (LoRA included: the base
// is frozen, and each micro-batch of a pass draws its own dropout masks; preference objectives
// too: each micro-batch of a pass keeps its own pair layout in the head).
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "src/recipe/recipe.h"

namespace strata {

// Why layer-major does not apply to this run ("" when it does): zo-sgd, several ranks, or a tied lm_head outside LoRA mode (its gradient shares the embedding's rows with
// each micro-batch's scatter, so summing it on the device would change the sums' order).
std::string accumulation_layer_major_obstacle(const Recipe& rc, bool tied_lm_head, int ranks);

// The micro-batches one engine pass runs: k = gradient_accumulation_steps for layer_major, 1 for
// micro_batch; for "auto" k when there is no obstacle and plan_fits(k), else 1. An explicit
// "layer_major" with an obstacle is Error(input) naming it.
int64_t accumulation_group(const Recipe& rc, bool tied_lm_head, int ranks, const std::function<bool(int64_t)>& plan_fits);

}  // namespace strata
