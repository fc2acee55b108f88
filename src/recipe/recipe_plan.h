// From a recipe to the placement plan's inputs and budgets (offload/plan/placement_plan.h): the
// one road a placement key takes — recipe (strings) -> PlanInputs (typed, parsed here once) ->
// RunPlan (resolved by the plan) -> the host store and the engine. What the trainer plans with
// and what `strata estimate` prices. The process baseline, the data's bytes and whether the run
// resumes are the caller's to fill.
#pragma once
#include "offload/plan/placement_plan.h"
#include "src/recipe/recipe.h"

namespace strata {

// ranks: the data-parallel ranks the run has (layer-major applies to one).
PlanInputs recipe_plan_inputs(const Recipe& recipe, int ranks = 1);
PlanBudgets recipe_plan_budgets(const Recipe& recipe);
LoraOptions recipe_lora_options(const Recipe& recipe);  // r = 0 (off) without a [lora] table

}  // namespace strata
