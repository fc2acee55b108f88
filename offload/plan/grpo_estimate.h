// GRPO's phases beside its training step (issue 41; src/train/grpo_step.h), priced with the step
// model's rates (offload/plan/step_estimate.h) so `strata estimate` shows a GRPO step whole and
// the trainer can hold its measured phases against them:
//   sampling   per prompt of the rank, one prefill pass (G rows x the longest prompt) and
//              max_completion_length decode passes (G rows x 1 token, attending over a context
//              that grows to the prompt + completion), each pass max(its device work, the weights
//              it streams): with the generator's weights streamed every pass uploads every decoder
//              layer and the lm_head (link bytes x passes), resident ones cross once per step (the
//              generator is built for each step); a spilled KV cache adds 2 x rows x context x Hk x
//              D x 4 bytes per spilled layer and pass each way (generator.h), priced at the
//              context's mean.
//   reference  grpo.beta > 0: one forward per micro-batch of the rank (the layers' forward, the
//              lm_head statistics), its weights streamed once per micro-batch (the frozen copy, or
//              the LoRA base), max(work, link) each.
// Device memory: the generator's buffers (generator_device_bytes: weight slots or resident
// weights, its KV cache for num_generations rows x (longest prompt + max_completion_length)) in
// what the training plan leaves of the device, as GrpoTrainer builds it each step; the training
// engine keeps its own buffers meanwhile, so the two add up (they do not take turns). The plan's
// own row for these phases (placement_plan.h, PlanInputs::grpo) counts the generator at its least.
// Legend: G generations (rows per pass), Tp longest prompt, Tc max_completion_length.
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "models/model_spec.h"
#include "offload/plan/step_estimate.h"
#include "offload/stream/engine_buffers.h"

namespace strata {

struct GrpoPhaseShape {
  int64_t prompts = 0;             // the rank's prompts per step
  int64_t generations = 0;         // G
  int64_t prompt_tokens = 0;       // Tp, the longest prompt
  int64_t completion_tokens = 0;   // Tc
  bool reference = false;          // grpo.beta > 0
  int64_t micro_batches = 0;       // the rank's per step (the reference pass's)
  int64_t micro_batch_rows = 0, micro_batch_tokens = 0;  // one reference forward's B, T
  bool device_in_host_ram = false;  // the CPU backend: the link is a memcpy on the compute cores
};

struct GrpoPhaseEstimate {
  GeneratorShape generator;        // G rows, Tp, Tp + Tc
  GeneratorPlacement placement;    // weights resident or streamed, KV layers on the device
  bool placement_fits = false;     // some placement fits the budget left
  size_t generator_device_bytes = 0;
  double passes = 0;               // prefill + decode passes per step
  double sampling_s = 0, sampling_compute_s = 0, sampling_link_s = 0;
  double sampling_link_bytes = 0;  // per step
  double reference_s = 0, reference_compute_s = 0, reference_link_s = 0;
  double reference_link_bytes = 0;
  std::map<std::string, double> rows() const;  // the estimate's rows, seconds
};

// Decoder layer i's weights as the store holds them (bytes over the link when streamed).
double grpo_layer_weight_bytes(const ModelSpec& spec, size_t layer);

// The phases of one GRPO step at `rates`; the generator's placement chosen in `device_left_bytes`
// (what the training plan leaves of the device budget) as generator_choose_placement does.
GrpoPhaseEstimate grpo_phase_estimate(const ModelSpec& spec, const GrpoPhaseShape& shape, size_t device_left_bytes,
                                      const StepRates& rates);

}  // namespace strata
