// Recipes: TOML files users copy and edit (recipes/README.md documents every key). The schema
// is one table of keys with types, defaults, a line of help and the Recipe member each lands in
// (RecipeKey, below); an unknown key is an error that names the closest valid key; `key=value`
// overrides on the command line use the same schema. Relative paths in a recipe are resolved
// against the recipe file's folder.
#pragma once
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "src/recipe/recipe_modes.h"

namespace strata {

struct Recipe {
  std::string source_path;  // the recipe file
  RecipeModes modes;        // every mode key below, parsed once (src/recipe/recipe_modes.h)
  // [model]
  std::string model_path;     // HF dir with weights (and tokenizer)
  std::string model_config;   // config.json for a freshly initialised model
  int64_t model_init_seed = 0;
  double model_init_std = 0.02;
  std::string model_dtype = "f32";
  // [data]
  std::string data_path, data_format = "auto", data_tokenizer = "auto";
  int64_t sequence_len = 256;
  bool packing = true;
  std::string train_on = "assistant", overlong = "truncate";
  bool skip_bad_lines = false;
  std::string eval_path, prepared_dir;
  double eval_split = 0.0;
  // [train]
  int64_t max_steps = 0, micro_batch_size = 1, gradient_accumulation_steps = 1, seed = 0;
  int64_t global_batch_size = 0;  // 0: micro_batch_size x gradient_accumulation_steps x ranks
  bool micro_batch_size_set = false, gradient_accumulation_steps_set = false;  // given in the recipe
  double num_train_epochs = 1.0;
  int64_t log_steps = 1, eval_steps = 0;
  std::string objective = "sft";  // "sft", a preference objective ("dpo", "ipo", "simpo", "orpo") or "grpo"
  std::string router_aux_loss = "auto";  // "auto" | "true" | "false": MoE load-balancing loss (models/moe_aux_loss.h)
  // [preference] (with a preference objective); beta's default depends on the objective
  // (dpo, ipo, orpo 0.1; simpo 2.0): it is filled in when the recipe loads
  double preference_beta = 0.1, preference_gamma = 0.5;
  // [grpo] (train.objective = "grpo": src/train/grpo_trainer.h), TRL GRPOConfig's names and defaults;
  // epsilon_high unset (< 0) is epsilon's value, filled in when the recipe loads
  int64_t grpo_num_generations = 8, grpo_max_completion_length = 256, grpo_top_k = 0, grpo_num_iterations = 1;
  double grpo_temperature = 1.0, grpo_top_p = 1.0, grpo_beta = 0.0, grpo_epsilon = 0.2, grpo_epsilon_high = -1;
  std::string grpo_loss_type = "dapo", grpo_scale_rewards = "group";
  bool grpo_mask_truncated_completions = false;
  std::vector<std::string> grpo_reward_funcs;
  std::vector<double> grpo_reward_weights;  // empty: 1 each
  std::string grpo_reward_command;
  double grpo_reward_timeout = 60;
  std::string grpo_answer_field = "answer", grpo_answer_regex = "(-?[0-9]+(?:\\.[0-9]+)?)", grpo_format_regex;
  std::vector<std::string> grpo_json_keys;
  int64_t grpo_length_buffer = 0, grpo_log_completions = 1;
  // [optim]
  double learning_rate = 1e-5, weight_decay = 0.0, adam_beta1 = 0.9, adam_beta2 = 0.999;
  double adam_epsilon = 1e-8, max_grad_norm = 1.0, warmup_ratio = 0.0, min_lr_ratio = 0.0;
  int64_t warmup_steps = 0;
  std::string lr_scheduler_type = "cosine";
  std::string optim_type = "adamw";   // "adamw" | "zo-sgd"
  std::string moments_dtype = "f32";  // optim.moments_dtype: AdamW m and v, "f32" | "bf16"
  double zo_eps = 1e-3;
  int64_t zo_perturbations = 1;
  bool max_grad_norm_set = false;     // optim.max_grad_norm was given (zo-sgd warns it does not apply)
  // [offload]
  std::string offload_weights = "auto", offload_checkpoints = "auto";
  int64_t offload_resident_layers = -1;  // with streamed weights: the first N layers resident (-1: the plan's)
  std::string offload_recompute = "auto";  // "auto" | "always" | "never" (offload/stream/engine_buffers.h)
  std::string host_memory;  // unset: the machine's available memory
  std::string offload_optimizer = "auto";  // "auto" | "host" | "nvme": where fp32 master and moments live
  std::string offload_accumulation = "auto";  // "auto" | "layer_major" | "micro_batch" (the schedule over a step's micro-batches)
  std::string offload_working_weights = "auto";  // "auto" | "stored" | "derived" (bf16 working copy made at upload)
  std::string offload_norm_pass = "auto";  // "auto" | "on" | "off" (clipping in two passes, gradients in flight)
  std::string offload_speculative_update = "auto";  // "auto" | "on" | "off" (clipped updates started before the norm)
  std::string nvme_path;    // directory for NVMe-placed state (strata's own subfolder inside it)
  std::string nvme_memory;  // unset: the free space of nvme_path minus 10%
  // [device]
  std::string device_backend = "cpu", device_memory = "2GiB", device_link_bandwidth;
  int64_t device_cpu_threads = 0;
  // the sizes above, parsed when the recipe loads (an unparsable one is a recipe error there)
  size_t host_memory_bytes = 0;        // 0: unset
  size_t nvme_memory_bytes = 0;        // 0: unset
  size_t device_memory_bytes = 0;
  double device_link_bytes_per_s = 0;  // 0: unthrottled
  // [checkpoint]
  std::string output_dir = "out", save_dtype = "bf16";
  int64_t save_steps = 0, keep_last = 0;
  // [lora] (a [lora] table in the recipe turns LoRA on: offload/state/lora.h)
  bool lora_enabled = false;
  int64_t lora_r = 16;
  double lora_alpha = 32, lora_dropout = 0.0;
  std::vector<std::string> lora_target_modules = {"q_proj", "k_proj", "v_proj", "o_proj",
                                                  "gate_proj", "up_proj", "down_proj"};
  // PEFT's target_parameters: a mixture-of-experts layer's router and packed experts
  // ("mlp.gate.weight", "mlp.experts.gate_up_proj", "mlp.experts.down_proj")
  std::vector<std::string> lora_target_parameters;
  bool lora_merge = false;
  std::string lora_adapter;  // a PEFT adapter dir to continue from
  std::string lora_base_dtype = "auto";  // "auto" (model.dtype) or "nf4" (offload/state/nf4_layout.h)
  bool lora_double_quant = true;
  // [distributed] (read only under mpirun: src/train/distributed.h)
  std::string distributed_backend = "auto";
  std::string distributed_shared_host_store = "auto";  // "auto" | "true" | "false" (src/train/distributed.h)
  int64_t distributed_ranks_per_node = 0;  // 0: the machines' nodes; > 0: pretend nodes of that many ranks
  double distributed_timeout_s = 300;
  int64_t distributed_diagnostics_steps = 0;
  std::string distributed_zo = "data";  // zo-sgd: "data" | "perturbation" | "2d" (src/train/zo_step.h)

  std::string to_toml() const;  // the effective recipe, every key
};

// Where a key's value lands: the Recipe member of the key's type.
using RecipeField = std::variant<std::string Recipe::*, int64_t Recipe::*, double Recipe::*, bool Recipe::*,
                                 std::vector<std::string> Recipe::*, std::vector<double> Recipe::*>;

// One row per key (src/recipe/recipe_schema.cpp), in the order to_toml writes them. Reading,
// defaults, to_toml and the closest-key suggestion all loop over these rows, so a plain key is
// its Recipe member, its row and its line in recipes/README.md (a test holds the README to the rows).
// What does not fit a row keeps a few lines in recipe.cpp: sizes ("2GiB" -> *_bytes), paths made
// absolute, preference.beta's default, the [lora] table turning LoRA on, the allowed values of
// string keys and the checks across keys.
struct RecipeKey {
  const char* name;      // "optim.learning_rate"
  const char* type;      // "string" | "int" | "float" | "bool" | "size" | "path" | "list"
  const char* fallback;  // the default as TOML text, as recipes/README.md shows it; "": unset. Text that is
                         // not one TOML value describes a default another key decides (preference.beta)
  RecipeField field;
  const char* help;
};
const std::vector<RecipeKey>& recipe_schema();

// Parses a recipe file and applies "section.key=value" overrides; throws strata::Error.
Recipe recipe_load(const std::string& path, const std::vector<std::string>& overrides);
Recipe recipe_parse(const std::string& toml_text, const std::string& origin,
                    const std::vector<std::string>& overrides);

// "512MiB", "2GiB", "1.5GB", "4096" -> bytes; "16GB/s" -> bytes per second. Throws a bad-input
// error naming `what` (the key or flag) on text that is neither.
size_t parse_bytes(const std::string& text, const std::string& what);
double parse_bandwidth(const std::string& text, const std::string& what);

// Levenshtein distance; used to suggest the closest key name.
size_t edit_distance(const std::string& a, const std::string& b);

}  // namespace strata
