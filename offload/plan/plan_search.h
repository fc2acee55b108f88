// The planner's search (DESIGN §8a): of every plan the inputs leave open, the fastest that fits.
// placement_plan_at (offload/plan/placement_plan.h) counts the bytes of one candidate; the step
// model (offload/plan/step_estimate.h) prices it; this file enumerates the candidates and chooses.
//
// What is open, and so searched:
//   - the split of the global batch (PlanInputs::global_batch, train.global_batch_size): every
//     micro_batch x accumulation_steps = global / ranks whose parts the recipe did not fix
//   - the schedule (offload.accumulation = "auto"): layer-major (where it applies) or one
//     micro-batch at a time
//   - the weights (offload.weights = "auto"): resident on the device or streamed
//   - the spilled checkpoints (offload.checkpoints = "auto" with an NVMe directory): pinned host
//     or NVMe (the device keeps as many as its budget allows either way)
//   - the optimizer state (offload.optimizer = "auto" with an NVMe directory): in RAM, or only the
//     overflow on NVMe: the fewest groups (from the lm_head down) whose move makes the host fit
// Each candidate is priced at `rates`; the fastest that fits every budget wins, ties going to
// the one that moves fewer bytes. Numerics never change unless the user opted in: the split
// only with train.global_batch_size, bf16 moments only as a suggestion.
#pragma once
#include <cstdint>

#include "offload/plan/layer_probe.h"
#include "offload/plan/placement_plan.h"
#include "offload/plan/step_estimate.h"

namespace strata {

// The rates a search prices with where its caller has none (a device FLOP/s or a link rate of 0):
// a GPU of 400 TFLOP/s on a 25 GB/s link, or the CPU backend at 200 GFLOP/s with the link at
// host memory speed. Only the order of the candidates depends on them.
StepRates plan_default_rates(const PlanInputs& in);

// The rates a training run plans with (the trainer, and `strata estimate` showing the run's plan):
// the defaults above with, on the CPU backend, its own device rates at the model's shapes
// (`probe`, offload/plan/layer_probe.h: the GEMMs, attention, the memory-bound ops and the head
// each at its rate) or, where no layer was probed, every op at the square-GEMM peak
// (`cpu_peak_flops_per_s`, also MFU's denominator), and the recipe's device.link_bandwidth when
// set (`link_bytes_per_s` > 0).
StepRates plan_run_rates(const PlanInputs& in, double cpu_peak_flops_per_s, const LayerRates& probe,
                         double link_bytes_per_s);

// The fastest plan that fits, searched as above. When nothing fits: the candidate closest to
// fitting (least bytes over the budgets), with `problems` and `changes` (each applied alone as
// recipe overrides and planned again). When it fits: `changes` lists the opt-ins that would make
// its step faster (bf16 moments, train.global_batch_size). RunPlan::step_seconds is the
// chosen plan's step at `rates`.
// `priced_at`: the rates the chosen plan's step and each change's step are reported at, when they
// are not the ones the search orders the candidates by (`strata estimate --measure` shows the plan
// the run takes at its own rates, priced at every rate it measured).
RunPlan placement_plan(const ModelSpec& spec, const PlanInputs& in, const PlanBudgets& budgets,
                       const StepRates& rates = {}, const StepRates* priced_at = nullptr);

// The inputs as `plan` resolved them (its split, weights, schedule, NVMe choices): what the step
// estimate prices the plan with.
PlanInputs plan_resolved_inputs(const PlanInputs& in, const RunPlan& plan);

// Whether some candidate fits (the leanest one: weights streamed, one micro-batch per pass,
// spilled checkpoints and the optimizer state on NVMe where allowed, or all in RAM).
bool placement_fits(const ModelSpec& spec, const PlanInputs& in, const PlanBudgets& budgets);

// The largest micro_batch (rows, at in.sequence_len) and sequence_len (at in.micro_batch) that
// fit; 0 when even 1 does not. Searched up to `limit`.
int64_t placement_max_micro_batch(const ModelSpec& spec, PlanInputs in, const PlanBudgets& budgets,
                                  int64_t limit = 1 << 16);
int64_t placement_max_sequence_len(const ModelSpec& spec, PlanInputs in, const PlanBudgets& budgets,
                                   int64_t limit = 1 << 22);

}  // namespace strata
