// One GRPO step in one process (issue 41): the streamed generator samples G completions per
// prompt from the current weights, the rewards score them (src/train/rewards.h), the advantages
// are normalised per group (src/train/grpo_advantages.h), and the engine trains on the sampled
// tokens with the GRPO head (offload/objective/grpo_head.h) num_iterations times, each one
// optimizer update over all of the step's micro-batches. The generator and the engine share the
// host store (no copy); the generator is built for the step's generation and freed before the
// training passes, so the two phases use the device memory at different times, and it always
// reads the weights as the last update left them. Temperature: GrpoTemperature (grpo_head.h).
//
// A strata step is one generation batch and its num_iterations updates (TRL counts each update
// as a step). Old log-probs: the first update's own (detached), which equal the generation-time
// policy's; later updates use them (TRL's old_per_token_logps). Sampling is seeded by (seed,
// step, prompt index in the data, completion index): a step does not depend on the batch it
// shares, and a resumed run samples the same tokens.
// LoRA (the engine in LoRA mode, `lora` given): the generator adds the current adapters unmerged
// in its layer pass (offload/engine/generator.h), so each step samples from the policy being
// trained; the base in the store is never merged or changed.
// beta > 0 (TRL's KL term, offload/objective/grpo_loss.h): after sampling, the reference model's
// per-token log-probs of the step's completions come from one streamed forward per micro-batch
// (offload/engine/token_scorer.h), once per generation batch (all num_iterations updates use
// them): under LoRA the frozen base read without the adapters (no extra memory), in full
// fine-tuning a frozen weights-only copy of the starting weights taken when the step is built
// (before a resume loads its checkpoint: the reference stays the starting model).
// Data parallel (GrpoRanks, several ranks under mpirun): every rank is handed the step's same
// prompts and keeps whole groups (grpo_rank_prompts): it samples, scores and trains on its own
// prompts' G completions, so a group's statistics need nothing from another rank, while what is
// global crosses as sums of zero-filled vectors (x + 0 is exact): every completion's rewards,
// length and stop (so scale_rewards = "batch", the reward and length metrics and the advantages
// are computed over the whole step on every rank, in the one-process order), the step's counted
// tokens and micro-batches (the loss_types' normalisers: the gradients are summed across ranks,
// offload/reduce/comm_reduction.h, so each rank's share is scaled as one process scales it), the
// loss and clip/KL/entropy sums per micro-batch (summed in the one-process order), and the
// completion tokens of the first log_prompts prompts (completions.jsonl, written by rank 0).
// With micro_batch_rows a multiple of G the ranks hold exactly the micro-batches one process
// with N times the accumulation would run, in the reduction's order: bit-identical to it. Every
// micro-batch is padded to the step's longest row (every rank's), so they share one shape.
// `strata train` runs it with train.objective = "grpo" (src/train/grpo_trainer.h).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "offload/engine/engine.h"
#include "offload/engine/generator.h"
#include "offload/engine/token_scorer.h"
#include "offload/objective/grpo_head.h"
#include "src/train/grpo_advantages.h"
#include "src/train/grpo_data.h"
#include "src/train/rewards.h"

namespace strata {

struct GrpoConfig {
  GrpoParams loss;                 // loss_type, epsilon(s), temperature, max_completion_length
  int64_t num_generations = 8;     // G
  int64_t num_iterations = 1;      // μ
  double top_p = 1;
  int64_t top_k = 0;
  GrpoScaleRewards scale_rewards = GrpoScaleRewards::group;
  bool mask_truncated_completions = false;
  uint64_t seed = 0;
  std::vector<int32_t> eos_ids;    // a stopped completion ends with the first of them
  int64_t micro_batch_rows = 1;    // completions per micro-batch (train.micro_batch_size)
  int64_t log_prompts = 0;         // data parallel: prompts whose completions every rank gets (text)
};

// The ranks of a data-parallel step (one rank: nothing crosses).
struct GrpoRanks {
  int rank = 0, size = 1;
  // values <- their elementwise sum over the ranks in rank order, on every rank (collective)
  std::function<void(std::vector<double>&)> all_reduce_sum;
};

// Which of a step's P prompts (G completions each, micro-batches of `rows` completions) rank r of
// N samples and trains on, in its micro-batches' order. rows a multiple of G: the prompts of
// micro-batches r, r + N, ... of the one-process order; else (each rank's P / N prompts filling
// whole micro-batches) the block [r P / N, (r + 1) P / N). Exit 2 when whole groups do not
// split over the ranks that way.
std::vector<size_t> grpo_rank_prompts(size_t P, int64_t G, int64_t rows, int r, int N);

struct GrpoCompletion {  // for completions.jsonl
  int64_t prompt = 0;    // the prompt's index in the data
  std::string completion;  // data parallel: "" for another rank's not among the first log_prompts
  double reward = 0, advantage = 0;
  int64_t tokens = 0;
  bool truncated = false;
};

struct GrpoStepOutcome {
  double loss = 0;                 // the last update's loss (data parallel: this rank's share)
  std::vector<double> losses;      // the last update's, per micro-batch of this rank, in its order
  double grad_norm = 0;            // the last update's norm before clipping
  nlohmann::json metrics;          // TRL's names: reward, reward_std, rewards/<f>/mean, ...
  std::vector<GrpoCompletion> completions;  // every rank's, in the step's order (prompt, then completion)
  // This rank's micro-batches and their layouts as the updates saw them (advantages, the reference
  // log-probs with beta > 0): what `strata grad --objective grpo` would be given for this batch.
  std::vector<MicroBatch> batches;
  std::vector<GrpoLayout> layouts;
};

class GrpoStep {
 public:
  // decode(ids) -> text of a completion; gen_shape: the generator's rows (>= num_generations),
  // longest prompt and context. Installs the GRPO head in `engine`. `lora`: the engine's adapters
  // (LoRA mode), which the generator adds; null: full fine-tuning.
  GrpoStep(const GrpoConfig& config, Device& dev, HostStore& store, Engine& engine, const GeneratorShape& gen_shape,
           Rewards& rewards, std::function<std::string(const std::vector<int32_t>&)> decode,
           LoraStore* lora = nullptr);
  // The generator's shape and adapters (GRPO with LoRA), as each step builds it.
  const GeneratorShape& generator_shape() const { return gen_shape_; }
  const GeneratorLora& generator_lora() const { return gen_lora_; }
  // beta > 0 in full fine-tuning: the frozen copy of the starting weights (else null).
  const HostStore* reference_store() const { return ref_store_.get(); }
  // Data parallel: this rank's place (before the first run).
  void set_ranks(GrpoRanks ranks);
  // prompts: this step's prompts with their data indices (every rank's: data parallel, each rank
  // is given the same and runs its share, grpo_rank_prompts); step counts from 1.
  GrpoStepOutcome run(const std::vector<const GrpoPrompt*>& prompts, const std::vector<int64_t>& prompt_index,
                      int64_t step, const AdamWParams& params, double max_grad_norm, double weight_decay);

 private:
  GrpoConfig c_;
  Device& dev_;
  HostStore& store_;
  Engine& engine_;
  GeneratorShape gen_shape_;
  GeneratorLora gen_lora_;  // LoRA: the adapters' rank and arena; else none
  Rewards& rewards_;
  LoraStore* lora_ = nullptr;
  std::unique_ptr<HostStore> ref_store_;  // beta > 0, full fine-tuning: the starting weights
  std::function<std::string(const std::vector<int32_t>&)> decode_;
  GrpoHead* head_ = nullptr;  // owned by the engine
  GrpoRanks ranks_;
};

// The sampling seed of a step (a SplitMix64 mix of the run's seed and the step).
uint64_t grpo_step_seed(uint64_t seed, int64_t step);

}  // namespace strata
