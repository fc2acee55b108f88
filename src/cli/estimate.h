// `strata estimate` in its parts: the command line into the recipe and the plan's inputs
// (cmd_estimate_args.cpp), the step's rates and where each comes from (cmd_estimate_rates.cpp;
// --measure's probes of this host in cmd_estimate_measure.cpp), the table and the --json object
// (cmd_estimate_report.cpp); the command itself, which runs them in order, is cmd_estimate.cpp.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/model_spec.h"
#include "offload/plan/grpo_estimate.h"
#include "offload/plan/placement_plan.h"
#include "offload/plan/step_estimate.h"
#include "src/recipe/recipe.h"

namespace strata {

// ---- the command line (cmd_estimate_args.cpp)

struct EstimateArgs {
  std::string recipe_path, model;
  std::vector<std::string> overrides;
  std::string gpu, gpu_memory, host_memory, nvme_memory, nvme_path, optimizer, rates_from;
  double gpu_flops = 0, link_gbps = 0, nvme_read_gbps = 0, nvme_write_gbps = 0, adamw_params_per_s = 0;
  bool json = false, measure = false, resume = false;
};

// The arguments into `a`; false when the command is not to run (*exit_code: 0 after --help, 2 on
// bad usage). A recipe or --model, one of them (an error otherwise).
bool estimate_args_parse(const std::vector<std::string>& args, EstimateArgs& a, int* exit_code);
// The recipe to price, and the defaults --model chose for what the user left unset.
struct EstimateRecipe {
  Recipe recipe;
  // --model: {"model.dtype": config.json's torch_dtype as bf16 or f32, "data.sequence_len": 2048,
  // "train.gradient_accumulation_steps": about 64k tokens per step}, each only where the user set
  // none; said on the report's first line. Empty for a recipe file.
  nlohmann::json model_defaults;
};
// The recipe file with its overrides, or --model's config with the recipe defaults and the
// model_defaults above; --nvme-path and --optimizer as overrides after the user's, so the
// recipe's checks see them (offload.optimizer = "nvme" needs offload.nvme_path).
EstimateRecipe estimate_recipe(const EstimateArgs& a);
// The recipe's plan inputs and budgets, with --resume, --host-memory and --nvme-memory in place
// of the recipe's; the process baseline measured now (VmRSS).
void estimate_plan_setup(const EstimateArgs& a, const Recipe& recipe, PlanInputs& in, PlanBudgets& budgets);

// ---- the rates (cmd_estimate_rates.cpp, --measure: cmd_estimate_measure.cpp)

// The rates a measurement gives: --measure's on this host, or a run's step (--rates-from).
struct MeasuredRates {
  double adamw_params_per_s = 0, host_bytes_per_s = 0, checksum_bytes_per_s = 0;
  double matmul_flops_per_s = 0, attention_flops_per_s = 0, elementwise_bytes_per_s = 0, head_flops_per_s = 0;
  double nvme_bytes_per_s = 0;  // --rates-from: bytes read + written over the run's disk-busy time (0: none)
  double link_bytes_per_s = 0;  // --rates-from: link bytes over the copy streams' busy time (0: not recorded)
};

// One step of a run's metrics.jsonl (--rates-from): its device time and its rates.
struct RunStepRates {
  int64_t step = 0;
  double device_s = 0;
  MeasuredRates rates;
};

// The step's rates, each with where it comes from ("datasheet", "measured here ...", "given",
// "assumed": the StepRates defaults, ...), printed beside the step time.
struct EstimateRates {
  StepRates rates;
  std::map<std::string, std::string> source;  // rate name ("device", "link", ...) -> where from
  std::string device_text;                    // the report's "device:" line
  std::vector<RunStepRates> run_steps;        // --rates-from: the run's steps, by device time
  // AdamW's bytes per parameter for the recipe's own state: with no AdamW rate measured or given
  // (rates.adamw_params_per_s 0) the report shows host_bytes_per_s over it, while the step model
  // derives each candidate plan's own (bf16 moments, derived working rows).
  double adamw_bytes_per_param = 30;
  // Each rate by name, as reported; attention, elementwise and head only when the CPU backend's
  // own were measured.
  std::map<std::string, double> values() const;
};

// The device: a GPU of the table (--gpu), the recipe's CPU backend (its GEMM peak measured here),
// or a GPU given by its figures; sets the plan's device fields and budget (--gpu-memory wins).
EstimateRates estimate_device(const EstimateArgs& a, const Recipe& recipe, DType dtype, PlanInputs& in,
                              PlanBudgets& budgets);
// The CPU backend: the device rates a training run plans at (one layer's, probed: `run`, from
// plan_run_rates) in place of the square-GEMM peak, with their sources; MFU stays against the peak.
void estimate_run_rates(const StepRates& run, EstimateRates& r);
// --measure: this host's AdamW, memory, checksum and (the CPU backend) device rates, and with an
// NVMe directory its read and write bandwidth.
void estimate_measure(const Recipe& recipe, const ModelSpec& spec, const PlanInputs& in, const PlanBudgets& budgets,
                      EstimateRates& r);
// What the step time still needs, as options to give ("--gpu-flops F and --link-gbps G"; "" when
// nothing): a GPU given by --gpu-memory alone answers whether the run fits, without a step time.
std::string estimate_missing_speeds(const EstimateRates& r);
// --rates-from: the rates a run measures, from its median step by device time: the device's by
// kind of work (op_s), the link's (link_busy_s), AdamW's (the update's exposed time less its NVMe
// waits), NVMe's (nvme_busy_s). The host's memory bandwidth and crc32c rate are not a run's
// (--measure's). The CPU backend only (its device rates are its op times').
void estimate_rates_from(const std::string& path, const Recipe& recipe, const ModelSpec& spec, const PlanInputs& in,
                         const RunPlan& plan, EstimateRates& r);
// --gpu-flops, --link-gbps, --nvme-read-gbps, --nvme-write-gbps, --adamw-params-per-s: given
// rates win over every other source.
void estimate_given_rates(const EstimateArgs& a, EstimateRates& r);
// A run's step's rates in place of StepRates' (the square-GEMM peak stays MFU's); a rate the run
// did not measure (0) leaves StepRates' as it was.
void use_run_rates(StepRates& rates, const MeasuredRates& m);

// ---- the report (cmd_estimate_report.cpp)

// A split of the global batch (micro_batch_size x gradient_accumulation_steps, in sequences).
struct BatchSplit {
  int64_t micro_batch_size = 0, accumulation = 0;  // 0: no split fits
  int64_t global_batch = 0;
};

// The largest micro_batch_size whose plan fits when micro_batch_size x gradient_accumulation_steps
// stays the recipe's global batch (the micro-batch divides it; accumulation = global / micro).
BatchSplit estimate_max_micro_batch_at_global_batch(const ModelSpec& spec, PlanInputs in, const PlanBudgets& budgets,
                                                    int64_t micro_batch_size, int64_t accumulation);

struct EstimateReport {
  const ModelSpec& spec;
  DType dtype;
  const Recipe& recipe;
  const PlanInputs& in;
  const RunPlan& plan;
  const EstimateRates& rates;
  const StepEstimate* step;  // null: no speeds given (missing_speeds says which)
  int64_t max_batch = 0, max_seq = 0;  // the largest micro_batch_size (accumulation held) and sequence_len that fit
  BatchSplit split;                    // the largest micro_batch_size at the recipe's global batch
  const nlohmann::json& model_defaults;
  std::string missing_speeds;
  const GrpoPhaseEstimate* grpo = nullptr;  // train.objective = "grpo": sampling and the reference pass
};

// One JSON object (--json): fits, tiers, states, accumulation, the largest sizes, --model's
// defaults and the step (null without speeds).
void estimate_print_json(const EstimateReport& r);
// The table: the model, the device, whether it fits (and what to change), the plan, the step.
void estimate_print_text(const EstimateReport& r);

}  // namespace strata
