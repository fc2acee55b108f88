// GRPO in `strata train` (src/train/grpo_trainer.h).
#include "src/train/grpo_trainer.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "io/generation_text.h"
#include "src/core/error.h"
#include "src/train/run_dir.h"
#include "src/train/training_data.h"

namespace strata {

GrpoConfig grpo_config_from(const Recipe& rc, std::vector<int32_t> eos_ids) {
  GrpoConfig c;
  c.loss.loss_type = grpo_loss_type_parse(rc.grpo_loss_type);
  c.loss.beta = rc.grpo_beta;
  c.loss.epsilon = rc.grpo_epsilon;
  c.loss.epsilon_high = rc.grpo_epsilon_high;
  c.loss.temperature = rc.grpo_temperature;
  c.loss.max_completion_length = rc.grpo_max_completion_length;
  c.num_generations = rc.grpo_num_generations;
  c.num_iterations = rc.grpo_num_iterations;
  c.top_p = rc.grpo_top_p;
  c.top_k = rc.grpo_top_k;
  c.scale_rewards = grpo_scale_rewards_parse(rc.grpo_scale_rewards);
  c.mask_truncated_completions = rc.grpo_mask_truncated_completions;
  c.seed = uint64_t(rc.seed);
  c.eos_ids = std::move(eos_ids);
  c.micro_batch_rows = rc.micro_batch_size;
  c.log_prompts = rc.grpo_log_completions;
  return c;
}

GrpoTrainer::GrpoTrainer(const Recipe& rc, GrpoPromptData data, const ModelConfig& cfg, Device& dev, HostStore& store,
                         Engine& engine, LoraStore* lora, GrpoRanks ranks)
    : data_(std::move(data)), log_prompts_(rc.grpo_log_completions), G_(rc.grpo_num_generations),
      completions_path_(rc.output_dir + "/completions.jsonl") {
  const int64_t per_rank = rc.micro_batch_size * rc.gradient_accumulation_steps;
  STRATA_CHECK(per_rank % G_ == 0, "grpo.num_generations (", G_, ") must divide train.micro_batch_size x "
               "gradient_accumulation_steps (", per_rank, ")",
               ranks.size > 1 ? ": each rank keeps whole groups of a prompt's completions" : "");
  prompts_per_step_ = per_rank * ranks.size / G_;
  STRATA_CHECK(train_prompts() >= prompts_per_step_, rc.data_path, " holds ", train_prompts(), " prompts, fewer than "
               "a step's ", prompts_per_step_, " (micro_batch_size x gradient_accumulation_steps x ranks / "
               "num_generations)");
  // the model's EOS ids: generation_config.json or config.json beside the weights (model.config's dir)
  const std::string model_dir = !rc.model_path.empty() ? rc.model_path
                                : std::filesystem::path(rc.model_config).parent_path().string();
  std::vector<int32_t> eos = model_eos_ids(model_dir, cfg);
  if (eos.empty())
    std::fprintf(stderr, "strata train: warning: the model names no eos_token_id (generation_config.json or "
                 "config.json): every completion runs to grpo.max_completion_length\n");
  RewardOptions ro;
  ro.funcs = rc.grpo_reward_funcs;
  ro.weights = rc.grpo_reward_weights;
  ro.answer_field = rc.grpo_answer_field;
  ro.answer_regex = rc.grpo_answer_regex;
  ro.format_regex = rc.grpo_format_regex;
  ro.json_keys = rc.grpo_json_keys;
  ro.max_completion_length = rc.grpo_max_completion_length;
  ro.length_buffer = rc.grpo_length_buffer;
  ro.command = rc.grpo_reward_command;
  ro.timeout_s = rc.grpo_reward_timeout;
  rewards_ = std::make_unique<Rewards>(ro);
  auto encoder = std::make_shared<TextEncoder>(training_encoder(rc, cfg.vocab_size));
  auto decode = [encoder](const std::vector<int32_t>& ids) { return decode_text(*encoder, ids); };
  // the generator: one prompt's G completions per call, its KV cache for the longest prompt
  const GeneratorShape shape{G_, data_.longest, data_.longest + rc.grpo_max_completion_length};
  step_ = std::make_unique<GrpoStep>(grpo_config_from(rc, std::move(eos)), dev, store, engine, shape, *rewards_,
                                     std::move(decode), lora);
  step_->set_ranks(std::move(ranks));
  // The generator is built for each step's sampling in what the engine leaves of the device (the
  // placement plan does not price it yet): a budget too small even for streamed weights and a
  // spilled KV cache is said now (exit 3), not at step 1.
  try {
    Generator::placement_for(dev, store.spec(), step_->generator_shape(), step_->generator_lora());
  } catch (const Error& e) {
    throw Error(e.kind(), str_cat("GRPO's sampling, beside the training engine: ", e.what(), " (the keys of strata "
                                  "train: device.memory, grpo.max_completion_length, grpo.num_generations)"));
  }
  // beta > 0: the reference pass's buffers (one micro-batch at data.sequence_len) beside the engine
  if (rc.grpo_beta != 0) {
    const size_t need = token_scorer_device_bytes(store.spec(), rc.micro_batch_size, rc.sequence_len);
    const size_t free_bytes = dev.budget_bytes() > dev.used_bytes() ? dev.budget_bytes() - dev.used_bytes() : 0;
    STRATA_CHECK_BUDGET(need <= free_bytes, "GRPO's reference pass (grpo.beta > 0) needs ", format_bytes(need),
                        " of device memory beside the training engine, the budget leaves ", format_bytes(free_bytes),
                        ": raise device.memory, or lower train.micro_batch_size or data.sequence_len");
    if (step_->reference_store())
      std::fprintf(stderr, "strata train: grpo: the reference model is a frozen copy of the starting weights (%s of "
                   "host memory)\n", format_bytes(step_->reference_store()->host_bytes() +
                                                   step_->reference_store()->pinned_bytes()).c_str());
  }
  std::fprintf(stderr, "strata train: grpo: %ld prompts a step x %ld generations of at most %ld tokens (temperature %g), "
               "%ld update%s per generation batch, loss_type %s, rewards %s\n", long(prompts_per_step_), long(G_),
               long(rc.grpo_max_completion_length), rc.grpo_temperature, long(rc.grpo_num_iterations),
               rc.grpo_num_iterations == 1 ? "" : "s", rc.grpo_loss_type.c_str(),
               [&] {
                 std::string s;
                 for (const std::string& n : rewards_->names()) s += (s.empty() ? "" : ", ") + n;
                 return s;
               }().c_str());
}

GrpoTrainer::~GrpoTrainer() = default;

GrpoTrainerOutcome GrpoTrainer::step(const std::vector<int64_t>& prompt_index, int64_t step, const AdamWParams& ap,
                                     double max_grad_norm, double weight_decay, bool log) {
  std::vector<const GrpoPrompt*> ps;
  for (int64_t i : prompt_index) ps.push_back(&data_.prompts.at(size_t(i)));
  GrpoStepOutcome o = step_->run(ps, prompt_index, step, ap, max_grad_norm, weight_decay);
  GrpoTrainerOutcome out;
  out.loss = o.loss;
  out.losses = std::move(o.losses);
  out.grad_norm = o.grad_norm;
  for (const GrpoCompletion& c : o.completions) out.completion_tokens += c.tokens;
  out.metrics = std::move(o.metrics);
  out.metrics["clip_ratio"] = out.metrics["clip_ratio/region_mean"];
  if (log && log_prompts_ > 0) {
    std::string lines;  // text that is not UTF-8 (a byte-level model's) is written with U+FFFD
    const size_t n = std::min(o.completions.size(), size_t(log_prompts_ * G_));
    for (size_t i = 0; i < n; ++i) {
      const GrpoCompletion& c = o.completions[i];
      const nlohmann::json j = {{"step", step}, {"prompt_index", c.prompt}, {"prompt", data_.prompts[size_t(c.prompt)].text},
                                {"completion", c.completion}, {"reward", c.reward}, {"advantage", c.advantage},
                                {"tokens", c.tokens}, {"truncated", c.truncated}};
      lines += j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    }
    std::FILE* f = std::fopen(completions_path_.c_str(), "a");
    STRATA_CHECK_IO(f, "cannot open ", completions_path_, ": ", std::strerror(errno));
    const size_t wrote = std::fwrite(lines.data(), 1, lines.size(), f);
    const bool closed = std::fclose(f) == 0;
    STRATA_CHECK_IO(wrote == lines.size() && closed, "writing ", completions_path_, " failed: ", std::strerror(errno));
  }
  return out;
}

void grpo_completions_truncate(const std::string& output_dir, int64_t last_step) {
  run_dir_truncate_steps(output_dir + "/completions.jsonl", last_step);
}

}  // namespace strata
