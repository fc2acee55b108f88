// GRPO in `strata train` (train.objective = "grpo", issue 41): the [grpo] recipe table made into
// one step's config (src/train/grpo_step.h), the prompt data (src/train/grpo_data.h), the rewards
// (src/train/rewards.h) and the run dir's completions.jsonl. The trainer's loop
// (src/train/trainer.cpp) deals prompts_per_step() prompts a step in its shuffled order and calls
// step(); checkpoints and resume are the trainer's (the step samples with a seed of (train.seed,
// step, prompt index, completion index), so a resumed run samples the same tokens).
//
// Prompts per step: train.micro_batch_size x gradient_accumulation_steps x ranks completions,
// num_generations of each prompt. Data parallel (src/train/grpo_step.h, GrpoRanks): every rank is
// dealt the step's same prompts and samples, scores and trains on its share, whole groups each
// (num_generations must divide micro_batch_size x gradient_accumulation_steps); each rank runs its
// own reward command. A reward command that fails ends the run before the step's
// update (exit 2 for a bad reply, 4 for a program that dies or times out; the message names the
// line): the last checkpoint stays the run's newest, valid.
//
// completions.jsonl (rank 0, every rank's completions): per step, the completions of its first
// grpo.log_completions prompts, one line each: {"step", "prompt_index", "prompt", "completion", "reward", "advantage", "tokens",
// "truncated"}. A resumed run drops the lines of steps after its checkpoint (as metrics.jsonl).
#pragma once
#include <cstdint>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/hf_config.h"
#include "src/recipe/recipe.h"
#include "src/train/grpo_step.h"

namespace strata {

struct GrpoTrainerOutcome {
  double loss = 0, grad_norm = 0;  // the last update's (loss: this rank's share)
  std::vector<double> losses;      // the last update's per micro-batch of this rank (grpo_step.h)
  int64_t completion_tokens = 0;   // sampled tokens of the step (EOS included)
  nlohmann::json metrics;          // TRL's names (grpo_step.h), plus clip_ratio
};

class GrpoTrainer {
 public:
  // `rc`'s [grpo] table; the prompts as read; the model's config (its EOS ids). Installs the
  // GRPO head in `engine`. Starts the reward command, when there is one. `lora`: the adapters of
  // a LoRA run (the generator samples with them), else null.
  GrpoTrainer(const Recipe& rc, GrpoPromptData data, const ModelConfig& cfg, Device& dev, HostStore& store,
              Engine& engine, LoraStore* lora = nullptr, GrpoRanks ranks = {});
  ~GrpoTrainer();
  int64_t prompts_per_step() const { return prompts_per_step_; }  // every rank's
  int64_t train_prompts() const { return int64_t(data_.prompts.size()); }
  int64_t longest_prompt() const { return data_.longest; }
  uint64_t data_hash() const { return data_.hash; }
  // One step over the prompts at these data indices; on rank 0 (`log`) completions.jsonl gets its lines.
  GrpoTrainerOutcome step(const std::vector<int64_t>& prompt_index, int64_t step, const AdamWParams& ap,
                          double max_grad_norm, double weight_decay, bool log);

 private:
  GrpoPromptData data_;
  int64_t prompts_per_step_ = 1, log_prompts_ = 1, G_ = 2;
  std::unique_ptr<Rewards> rewards_;
  std::unique_ptr<GrpoStep> step_;
  std::string completions_path_;
};

// The [grpo] table as GrpoStep's config (eos_ids, micro_batch_rows and the seed included).
GrpoConfig grpo_config_from(const Recipe& rc, std::vector<int32_t> eos_ids);

// completions.jsonl of output_dir without the lines of steps after last_step (0: emptied).
void grpo_completions_truncate(const std::string& output_dir, int64_t last_step);

}  // namespace strata
