// From a recipe to the placement plan's inputs and budgets (offload/plan/placement_plan.h): the
// one road a placement key takes — recipe (strings) -> PlanInputs (typed, parsed here once) ->
// RunPlan (resolved by the plan) -> the host store and the engine. What the trainer plans with
// and what `strata estimate` prices. The process baseline, the data's bytes and whether the run
// resumes are the caller's to fill.
#pragma once
#include "offload/plan/grpo_estimate.h"
#include "offload/plan/placement_plan.h"
#include "src/recipe/recipe.h"

namespace strata {

// ranks: the data-parallel ranks the run has (layer-major applies to one).
PlanInputs recipe_plan_inputs(const Recipe& recipe, int ranks = 1);
PlanBudgets recipe_plan_budgets(const Recipe& recipe);
LoraOptions recipe_lora_options(const Recipe& recipe);  // r = 0 (off) without a [lora] table
// train.objective = "grpo": one rank's phases as offload/plan/grpo_estimate.h prices them. longest_prompt:
// the data's (0: data.sequence_len - max_completion_length - 1, the longest the data keeps);
// reference_tokens: one reference forward's tokens per row (0: data.sequence_len, the most).
GrpoPhaseShape recipe_grpo_phase_shape(const Recipe& recipe, bool device_in_host_ram, int64_t longest_prompt = 0,
                                       int64_t reference_tokens = 0);

}  // namespace strata
