#include "src/recipe/recipe_plan.h"

#include <algorithm>

#include "src/core/dtype.h"
#include "src/core/error.h"
#include "src/device/device.h"
#include "src/recipe/recipe_modes.h"

namespace strata {

LoraOptions recipe_lora_options(const Recipe& rc) {
  LoraOptions o;
  if (!rc.lora_enabled) return o;
  o.r = rc.lora_r;
  o.alpha = rc.lora_alpha;
  o.dropout = rc.lora_dropout;
  o.seed = uint64_t(rc.seed);
  std::vector<std::string> names = rc.lora_target_modules;
  names.insert(names.end(), rc.lora_target_parameters.begin(), rc.lora_target_parameters.end());
  o.targets = lora_targets_parse(names, "lora.target_modules");
  o.base_nf4 = rc.lora_base_dtype == "nf4";
  o.double_quant = rc.lora_double_quant;
  return o;
}

PlanInputs recipe_plan_inputs(const Recipe& rc, int ranks) {
  PlanInputs in;
  in.lora = recipe_lora_options(rc);
  in.router_aux_loss = rc.router_aux_loss == "auto" ? -1 : rc.router_aux_loss == "true" ? 1 : 0;
  in.weights = rc.modes.weights;
  in.resident_layers = rc.offload_resident_layers;
  in.checkpoints = rc.modes.checkpoints;
  in.recompute = rc.modes.recompute;
  in.optimizer_kind = rc.modes.optimizer;  // which host arrays and which engine's device rows
  in.optimizer = rc.modes.optimizer_tier;
  // zeroth order keeps the master in RAM and has no moments: "auto" is RAM for it
  if (in.optimizer_kind == OptimizerKind::zo_sgd && in.optimizer == StateTier::automatic) in.optimizer = StateTier::host;
  in.moments = dtype_parse(rc.moments_dtype);
  // a preference objective's micro-batch holds pairs: 2 rows each (chosen, rejected)
  in.micro_batch = rc.micro_batch_size * (rc.modes.preference ? 2 : 1);
  in.sequence_len = rc.sequence_len;
  in.accumulation = rc.modes.accumulation;
  in.speculate = rc.modes.speculate;
  in.working = rc.modes.working;
  in.norm_pass = rc.modes.norm_pass;
  in.accumulation_steps = rc.gradient_accumulation_steps;
  in.pair_rows = rc.modes.preference ? 2 : 1;
  in.global_batch = rc.global_batch_size;
  in.micro_batch_fixed = rc.global_batch_size == 0 || rc.micro_batch_size_set;
  in.accumulation_fixed = rc.global_batch_size == 0 || rc.gradient_accumulation_steps_set;
  in.ranks = ranks;
  // GRPO's step lands every gradient before its optimizer_step (src/train/grpo_step.cpp), as clipping does
  in.clip_grad = rc.max_grad_norm > 0 || rc.objective == "grpo";
  in.reference_copy = rc.objective == "grpo" && rc.grpo_beta > 0 && !in.lora.enabled();
  if (rc.objective == "grpo") {  // the data keeps prompts of at most sequence_len - max_completion_length - 1
    in.grpo = true;
    const int64_t prompt = std::max<int64_t>(1, rc.sequence_len - rc.grpo_max_completion_length - 1);
    in.grpo_generator = {rc.grpo_num_generations, prompt, prompt + rc.grpo_max_completion_length};
    if (rc.grpo_beta > 0) in.grpo_reference_rows = rc.micro_batch_size, in.grpo_reference_tokens = rc.sequence_len;
  }
  in.zo_perturbations = rc.zo_perturbations;
  in.save_dtype = dtype_parse(rc.save_dtype);
  in.load_from_dir = !rc.model_path.empty();
  in.f32_master_shared = true;  // HostStore: in f32 compute mode the master is the working copy
  in.device_in_host_ram = rc.modes.device == DeviceBackend::cpu;
  in.device_is_cuda = rc.modes.device == DeviceBackend::cuda;
  return in;
}

PlanBudgets recipe_plan_budgets(const Recipe& rc) {
  PlanBudgets b;
  b.device_bytes = rc.device_memory_bytes;
  b.device_origin = str_cat("device.memory = \"", rc.device_memory, "\"");
  placement_host_budget(b, rc.host_memory_bytes, rc.host_memory);
  b.nvme_dir = rc.nvme_path;
  b.nvme_bytes = rc.nvme_memory_bytes;
  return b;
}

GrpoPhaseShape recipe_grpo_phase_shape(const Recipe& recipe, bool device_in_host_ram, int64_t longest_prompt,
                                       int64_t reference_tokens) {
  GrpoPhaseShape s;
  const int64_t completions = recipe.micro_batch_size * recipe.gradient_accumulation_steps;  // one rank's
  s.generations = std::max<int64_t>(1, recipe.grpo_num_generations);
  s.prompts = completions / s.generations;
  s.completion_tokens = std::max<int64_t>(1, recipe.grpo_max_completion_length);
  s.prompt_tokens = longest_prompt > 0 ? longest_prompt
                                       : std::max<int64_t>(1, recipe.sequence_len - recipe.grpo_max_completion_length - 1);
  s.reference = recipe.grpo_beta != 0;
  s.micro_batches = recipe.gradient_accumulation_steps;
  s.micro_batch_rows = recipe.micro_batch_size;
  s.micro_batch_tokens = reference_tokens > 0 ? reference_tokens : recipe.sequence_len;
  s.device_in_host_ram = device_in_host_ram;
  return s;
}

}  // namespace strata
