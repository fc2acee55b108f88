// `strata estimate RECIPE.toml [key=value ...] [--measure]` and `strata estimate --model DIR|config.json`:
// will the run fit, where does every byte go, and how fast will a step be — without running
// it. The bytes are the trainer's own placement plan (offload/plan/placement_plan.h, with the same
// recipe-to-plan glue, recipe_plan_inputs); the step time is the roofline of
// offload/plan/step_estimate.h. Nothing large is allocated: a 405B config answers in a moment.
// Exit 0 when it fits (GRPO: the generator too, beside the engine), 3 when it does not, 2 on bad input. Its parts: estimate.h.
#include <algorithm>
#include <optional>

#include "src/cli/commands.h"
#include "offload/plan/layer_probe.h"
#include "offload/plan/plan_search.h"
#include "offload/state/nf4_layout.h"
#include "src/cli/estimate.h"
#include "src/core/threads.h"
#include "src/device/peak_flops.h"
#include "src/recipe/recipe_plan.h"

namespace strata {

BatchSplit estimate_max_micro_batch_at_global_batch(const ModelSpec& spec, PlanInputs in, const PlanBudgets& budgets,
                                                    int64_t micro_batch_size, int64_t accumulation) {
  // a preference objective's micro-batch is micro_batch_size pairs: rows_per sequences of the engine's
  const int64_t rows_per = in.micro_batch / micro_batch_size, global = micro_batch_size * accumulation;
  // Not monotone in the micro-batch: a larger one holds bigger activations, but fewer micro-batches
  // per step hold fewer layer-major checkpoints; so every divisor is tried, largest first.
  for (int64_t micro = global; micro >= 1; --micro) {
    if (global % micro) continue;
    in.micro_batch = micro * rows_per;
    in.accumulation_steps = global / micro;
    if (placement_fits(spec, in, budgets)) return {micro, global / micro, global};
  }
  return {0, 0, global};
}

int cmd_estimate(const std::vector<std::string>& args) {
  EstimateArgs a;
  int rc = 0;
  if (!estimate_args_parse(args, a, &rc)) return rc;
  const EstimateRecipe priced = estimate_recipe(a);
  const Recipe& recipe = priced.recipe;
  const ModelConfig cfg = hf_config_load(recipe.model_path.empty() ? recipe.model_config : recipe.model_path);
  const DType dtype = dtype_parse(recipe.model_dtype);
  ModelSpec spec = model_spec_build(cfg, dtype);
  PlanInputs in;
  PlanBudgets budgets;
  estimate_plan_setup(a, recipe, in, budgets);
  if (in.lora.enabled() && in.lora.base_nf4) nf4_base_enable(spec, in.lora.double_quant);

  // the device: a GPU of the table, or the recipe's (the CPU backend is measured here); a GPU's
  // nominal memory loses its context's share first
  if (recipe.device_backend == "cpu" && a.gpu.empty()) {  // the kernels' thread count, as `strata train` sets it
    cpu_threads_set(int(recipe.device_cpu_threads));
    cpu_threads_apply();
  }
  EstimateRates rates = estimate_device(a, recipe, dtype, in, budgets);
  if (in.device_is_cuda) in.device_reserve_bytes = kGpuContextReserve;
  // On the CPU backend the run plans at one layer's rates probed at the model's shapes and at its
  // link (plan_run_rates, as TrainRun::measure_cpu_rates does): the estimate plans at the same, and
  // prices at them unless --measure or --rates-from measure more.
  const bool cpu_run = in.device_in_host_ram && a.gpu.empty();
  StepRates run_rates;
  if (cpu_run) {
    run_rates = plan_run_rates(in, rates.rates.device_flops_per_s, layer_probe_run_rates(spec, in),
                               recipe.device_link_bytes_per_s);
    estimate_run_rates(run_rates, rates);
  }
  if (a.measure) {  // a layer and an lm_head chunk at the model's shapes: streamed or not, the same work
    PlanInputs probe = in;
    if (probe.weights == WeightsMode::automatic) probe.weights = WeightsMode::stream;
    estimate_measure(recipe, spec, probe, budgets, rates);
  }
  estimate_given_rates(a, rates);
  // a CUDA device with bf16 weights: attention at its measured share of the GEMM rate, which the
  // step model would apply anyway (step_device_rates), stated beside the other rates
  if (rates.rates.device_flops_per_s > 0 && rates.rates.attention_flops_per_s <= 0) {
    const StepRates priced = step_device_rates(spec, in, rates.rates);
    if (priced.attention_flops_per_s > 0) {
      rates.rates.attention_flops_per_s = priced.attention_flops_per_s;
      rates.source["attention"] = str_cat(kCudaAttentionGemmFraction, " of the device's GEMM rate (strata's tensor-core "
                                          "attention as measured on an H200)");
    }
  }
  // the fastest plan that fits at these rates (offload/plan/plan_search.h), as the trainer plans: on
  // the CPU backend at the run's rates above, priced at every rate measured here (--measure,
  // --rates-from) or given
  auto plan_now = [&] {
    return cpu_run ? placement_plan(spec, in, budgets, run_rates, &rates.rates) : placement_plan(spec, in, budgets, rates.rates);
  };
  RunPlan plan = plan_now();
  if (!a.rates_from.empty()) {  // the run's own rates, then the plan again at them
    estimate_rates_from(a.rates_from, recipe, spec, plan_resolved_inputs(in, plan), plan, rates);
    estimate_given_rates(a, rates);
    plan = plan_now();
  }
  const PlanInputs used = plan_resolved_inputs(in, plan);  // its split, weights and schedule
  PlanInputs sized = in;  // the largest shapes: the plan's split, every "auto" still open
  sized.micro_batch = plan.micro_batch;
  sized.accumulation_steps = plan.accumulation_steps;
  sized.global_batch = 0;
  const int64_t max_batch = placement_max_micro_batch(spec, sized, budgets, 1 << 14);
  const int64_t max_seq = placement_max_sequence_len(spec, sized, budgets, 1 << 20);
  const BatchSplit split = estimate_max_micro_batch_at_global_batch(
      spec, sized, budgets, plan.micro_batch / std::max<int64_t>(1, in.pair_rows), plan.accumulation_steps);
  // a fit question needs no speeds: without the device's FLOP/s or the link's bandwidth the
  // report answers it and says what a step time would need (the plan was chosen at the search's
  // stated defaults; no step time is printed, nor the opt-ins that only make it faster)
  const std::string missing = estimate_missing_speeds(rates);
  std::optional<StepEstimate> step;
  if (missing.empty()) {
    step = step_estimate(spec, used, plan, plan.accumulation_steps, rates.rates, recipe.zo_perturbations);
  } else {
    if (plan.fits()) plan.changes.clear();
    for (PlanChange& c : plan.changes) c.step_seconds = 0;
    plan.step_seconds = 0;
  }
  // GRPO: its sampling (the generator in what the training plan leaves of the device) and reference pass
  std::optional<GrpoPhaseEstimate> grpo;
  if (recipe.objective == "grpo" && step) {
    const size_t used_device = plan.tier(Tier::device) - plan.grpo_phase_device_bytes;  // the engine's alone
    const size_t left = budgets.device_bytes == 0 ? SIZE_MAX / 4
                        : budgets.device_bytes > used_device ? budgets.device_bytes - used_device : 0;
    grpo = grpo_phase_estimate(spec, recipe_grpo_phase_shape(recipe, in.device_in_host_ram), left, rates.rates);
  }
  const EstimateReport report{spec,     dtype,   recipe, used,  plan,    rates, step ? &*step : nullptr, max_batch,
                              max_seq, split, priced.model_defaults, missing, grpo ? &*grpo : nullptr};
  if (a.json) estimate_print_json(report);
  else estimate_print_text(report);
  // GRPO: the generator must fit what the training engine leaves, even streamed with its cache spilled
  return plan.fits() && (!grpo || grpo->placement_fits) ? 0 : 3;
}

}  // namespace strata
