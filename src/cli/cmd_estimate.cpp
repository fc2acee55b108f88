// `strata estimate RECIPE.toml [key=value ...] [--measure]` and `strata estimate --model DIR|config.json`:
// will the run fit, where does every byte go, and how fast will a step be — without running
// it. The bytes are the trainer's own placement plan (offload/plan/placement_plan.h, with the same
// recipe-to-plan glue, recipe_plan_inputs); the step time is the roofline of
// offload/plan/step_estimate.h. Nothing large is allocated: a 405B config answers in a moment.
// Exit 0 when it fits, 3 when it does not, 2 on bad input. Its parts: estimate.h.
#include "src/cli/commands.h"
#include "offload/plan/plan_search.h"
#include "src/cli/estimate.h"

namespace strata {

int cmd_estimate(const std::vector<std::string>& args) {
  EstimateArgs a;
  int rc = 0;
  if (!estimate_args_parse(args, a, &rc)) return rc;
  const Recipe recipe = estimate_recipe(a);
  const ModelConfig cfg = hf_config_load(recipe.model_path.empty() ? recipe.model_config : recipe.model_path);
  const DType dtype = dtype_parse(recipe.model_dtype);
  const ModelSpec spec = model_spec_build(cfg, dtype);
  PlanInputs in;
  PlanBudgets budgets;
  estimate_plan_setup(a, recipe, in, budgets);

  // the device: a GPU of the table, or the recipe's (the CPU backend is measured here); a GPU's
  // nominal memory loses its context's share first
  EstimateRates rates = estimate_device(a, recipe, dtype, in, budgets);
  if (in.device_is_cuda) in.device_reserve_bytes = kGpuContextReserve;
  if (a.measure) estimate_measure(recipe, spec, in, budgets, rates);
  estimate_given_rates(a, rates);
  // the fastest plan that fits at these rates (offload/plan/plan_search.h), as the trainer plans
  RunPlan plan = placement_plan(spec, in, budgets, rates.rates);
  if (!a.rates_from.empty()) {  // the run's own rates, then the plan again at them
    estimate_rates_from(a.rates_from, recipe, spec, plan_resolved_inputs(in, plan), plan, rates);
    estimate_given_rates(a, rates);
    plan = placement_plan(spec, in, budgets, rates.rates);
  }
  const PlanInputs used = plan_resolved_inputs(in, plan);  // its split, weights and schedule
  const int64_t max_batch = placement_max_micro_batch(spec, used, budgets, 1 << 14);
  const int64_t max_seq = placement_max_sequence_len(spec, used, budgets, 1 << 20);
  const StepEstimate step = step_estimate(spec, used, plan, plan.accumulation_steps, rates.rates, recipe.zo_perturbations);
  const EstimateReport report{spec, dtype, recipe, used, plan, rates, step, max_batch, max_seq};
  if (a.json) estimate_print_json(report);
  else estimate_print_text(report);
  return plan.fits() ? 0 : 3;
}

}  // namespace strata
