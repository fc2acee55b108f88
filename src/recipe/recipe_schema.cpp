// The recipe schema: one row per key, in the order Recipe::to_toml writes them (recipe.h says
// what a row holds). recipes/README.md documents each row with the same type and default; a test
// (tests/recipe/test_recipe_schema.cpp) fails when the two drift apart.
#include "src/recipe/recipe.h"

#include <iterator>

namespace strata {

namespace {

constexpr RecipeKey kRecipeKeys[] = {
    // [model]
    {"model.path", "path", "", &Recipe::model_path,
     "Hugging Face model dir (config.json + safetensors) to fine-tune"},
    {"model.config", "path", "", &Recipe::model_config,
     "config.json of a model to initialise from model.init_seed instead of loading weights"},
    {"model.init_seed", "int", "0", &Recipe::model_init_seed,
     "seed of the random initialisation (with model.config)"},
    {"model.init_std", "float", "0.02", &Recipe::model_init_std,
     "standard deviation of initial matrix weights (with model.config)"},
    {"model.dtype", "string", "\"f32\"", &Recipe::model_dtype,
     "compute dtype of the weights on the device: \"f32\" or \"bf16\""},

    // [data]
    {"data.path", "path", "", &Recipe::data_path,
     "training data: .txt (documents separated by blank lines), .jsonl ({\"text\"} per line) or .json ({\"input_ids\": [[...]]})"},
    {"data.format", "string", "\"auto\"", &Recipe::data_format,
     "\"auto\" (by extension and, for JSONL, by the fields of the first record), \"text\", \"jsonl\" ({\"text\"} pretraining), \"alpaca\", \"sharegpt\", \"messages\", \"preference\" or \"tokens\""},
    {"data.tokenizer", "string", "\"auto\"", &Recipe::data_tokenizer,
     "\"bytes\" (UTF-8 bytes as ids; vocab >= 256), a directory holding tokenizer.json, or \"auto\" (model.path's tokenizer.json when present, else bytes)"},
    {"data.sequence_len", "int", "256", &Recipe::sequence_len,
     "tokens per row"},
    {"data.packing", "bool", "true", &Recipe::packing,
     "pack documents into full rows; attention and positions restart at each document"},
    {"data.train_on", "string", "\"assistant\"", &Recipe::train_on,
     "which tokens of a chat sample carry loss: \"assistant\" (every assistant turn), \"last\" (the last assistant turn) or \"all\""},
    {"data.overlong", "string", "\"truncate\"", &Recipe::overlong,
     "a chat/instruction/preference sample longer than sequence_len (and pretraining text without packing) is \"truncate\"d or \"drop\"ped; counted and reported"},
    {"data.skip_bad_lines", "bool", "false", &Recipe::skip_bad_lines,
     "skip malformed JSONL lines (counted and reported) instead of stopping at the first"},
    {"data.eval_split", "float", "0.0", &Recipe::eval_split,
     "fraction of data.path's samples held out (evenly spaced) for eval loss when data.eval_path is unset"},
    {"data.eval_path", "path", "", &Recipe::eval_path,
     "held-out dataset for eval loss (same formats as data.path)"},
    {"data.prepared_dir", "path", "", &Recipe::prepared_dir,
     "binary token shards written by `strata prepare`; when set and present, training reads them instead of data.path"},

    // [train]
    {"train.max_steps", "int", "0", &Recipe::max_steps,
     "optimizer steps to run (0 = from num_train_epochs)"},
    {"train.num_train_epochs", "float", "1.0", &Recipe::num_train_epochs,
     "passes over the training rows when max_steps is 0"},
    {"train.micro_batch_size", "int", "1", &Recipe::micro_batch_size,
     "rows per micro-batch"},
    {"train.gradient_accumulation_steps", "int", "1", &Recipe::gradient_accumulation_steps,
     "micro-batches per optimizer step"},
    {"train.global_batch_size", "int", "0", &Recipe::global_batch_size,
     "rows (preference: pairs) per optimizer step across all ranks; when set, micro_batch_size and "
     "gradient_accumulation_steps not given are chosen by the plan (the fastest split that fits), and a resumed run "
     "keeps the split it started with (0 = micro_batch_size x gradient_accumulation_steps x ranks)"},
    {"train.seed", "int", "0", &Recipe::seed,
     "seed of the data order"},
    {"train.log_steps", "int", "1", &Recipe::log_steps,
     "print a progress line every this many steps"},
    {"train.eval_steps", "int", "0", &Recipe::eval_steps,
     "eval loss on the held-out split every this many steps and at the end (0 = only at the end, when there is a split)"},
    {"train.objective", "string", "\"sft\"", &Recipe::objective,
     "\"sft\" (token cross-entropy), a preference objective on preference data: \"dpo\", \"ipo\", \"simpo\" or \"orpo\", "
     "or \"grpo\" (online RL on prompt data: [grpo])"},

    {"train.router_aux_loss", "string", "\"auto\"", &Recipe::router_aux_loss,
     "mixture-of-experts models: add transformers' load-balancing loss times router_aux_loss_coef: \"auto\" (as config.json's output_router_logits), true or false"},

    // [preference]
    {"preference.beta", "float", "0.1 (simpo: 2.0)", &Recipe::preference_beta,
     "the preference objective's beta: dpo/ipo 0.1, simpo 2.0, orpo (its lambda) 0.1 when unset, as TRL's configs"},
    {"preference.gamma", "float", "0.5", &Recipe::preference_gamma,
     "simpo's target reward margin gamma"},

    // [grpo] (train.objective = "grpo"; TRL GRPOConfig's names)
    {"grpo.num_generations", "int", "8", &Recipe::grpo_num_generations,
     "completions sampled per prompt (G); it must divide micro_batch_size x gradient_accumulation_steps"},
    {"grpo.max_completion_length", "int", "256", &Recipe::grpo_max_completion_length,
     "the most tokens a completion has (EOS included); longer ones are truncated"},
    {"grpo.temperature", "float", "1.0", &Recipe::grpo_temperature,
     "sampling temperature; the loss's log-probs are of logits / temperature too"},
    {"grpo.top_p", "float", "1.0", &Recipe::grpo_top_p,
     "nucleus sampling (1.0 = off)"},
    {"grpo.top_k", "int", "0", &Recipe::grpo_top_k,
     "top-k sampling (0 = off)"},
    {"grpo.beta", "float", "0.0", &Recipe::grpo_beta,
     "KL coefficient to the starting model (0 = no reference pass)"},
    {"grpo.epsilon", "float", "0.2", &Recipe::grpo_epsilon,
     "lower clipping of the probability ratio: 1 - epsilon"},
    {"grpo.epsilon_high", "float", "epsilon's value", &Recipe::grpo_epsilon_high,
     "upper clipping of the probability ratio: 1 + epsilon_high"},
    {"grpo.num_iterations", "int", "1", &Recipe::grpo_num_iterations,
     "updates (mu) per generation batch; the old policy's log-probs are the first update's"},
    {"grpo.loss_type", "string", "\"dapo\"", &Recipe::grpo_loss_type,
     "\"grpo\", \"bnpo\", \"dr_grpo\" or \"dapo\" (how token losses are normalised)"},
    {"grpo.scale_rewards", "string", "\"group\"", &Recipe::grpo_scale_rewards,
     "advantages divided by the std of the \"group\", the \"batch\", or \"none\""},
    {"grpo.mask_truncated_completions", "bool", "false", &Recipe::grpo_mask_truncated_completions,
     "completions that hit max_completion_length carry no loss"},
    {"grpo.reward_funcs", "list", "[]", &Recipe::grpo_reward_funcs,
     "built-in rewards: \"accuracy\", \"format\", \"json\", \"length\""},
    {"grpo.reward_weights", "list", "[]", &Recipe::grpo_reward_weights,
     "one weight per reward function (reward_funcs, then the command); [] = 1 each"},
    {"grpo.reward_command", "string", "", &Recipe::grpo_reward_command,
     "an external reward program (sh -c) speaking JSON lines"},
    {"grpo.reward_timeout", "float", "60.0", &Recipe::grpo_reward_timeout,
     "seconds the reward command has for one step's completions"},
    {"grpo.answer_field", "string", "\"answer\"", &Recipe::grpo_answer_field,
     "accuracy: the example's field holding the answer"},
    {"grpo.answer_regex", "string", "'(-?[0-9]+(?:\\.[0-9]+)?)'", &Recipe::grpo_answer_regex,
     "accuracy: PCRE2 pattern whose last match (first group) is the completion's answer"},
    {"grpo.format_regex", "string", "", &Recipe::grpo_format_regex,
     "format: PCRE2 pattern the completion must match"},
    {"grpo.json_keys", "list", "[]", &Recipe::grpo_json_keys,
     "json: keys the completion's JSON object must hold"},
    {"grpo.length_buffer", "int", "0", &Recipe::grpo_length_buffer,
     "length: DAPO's soft overlong buffer in tokens (0 = max_completion_length / 4)"},
    {"grpo.log_completions", "int", "1", &Recipe::grpo_log_completions,
     "prompts per step whose completions go to completions.jsonl (0 = none)"},

    // [optim]
    {"optim.type", "string", "\"adamw\"", &Recipe::optim_type,
     "\"adamw\" (first order: forward + backward) or \"zo-sgd\" (zeroth order, MeZO: two perturbed forward passes, no gradients or moments)"},
    {"optim.moments_dtype", "string", "\"f32\"", &Recipe::moments_dtype,
     "AdamW m and v in host RAM or on NVMe: \"f32\" (8 B/param) or \"bf16\" (4 B/param: read as bf16, computed in f32, rounded back stochastically with a counter-based RNG; resume stays bit-exact)"},
    {"optim.learning_rate", "float", "1e-5", &Recipe::learning_rate,
     "peak learning rate"},
    {"optim.weight_decay", "float", "0.0", &Recipe::weight_decay,
     "AdamW decoupled weight decay (matrices only; norms and biases are not decayed)"},
    {"optim.adam_beta1", "float", "0.9", &Recipe::adam_beta1,
     "AdamW beta1"},
    {"optim.adam_beta2", "float", "0.999", &Recipe::adam_beta2,
     "AdamW beta2"},
    {"optim.adam_epsilon", "float", "1e-8", &Recipe::adam_epsilon,
     "AdamW epsilon"},
    {"optim.max_grad_norm", "float", "1.0", &Recipe::max_grad_norm,
     "clip the global gradient L2 norm to this (0 = no clipping)"},
    {"optim.lr_scheduler_type", "string", "\"cosine\"", &Recipe::lr_scheduler_type,
     "\"cosine\", \"linear\" or \"constant\" after warmup"},
    {"optim.warmup_steps", "int", "0", &Recipe::warmup_steps,
     "linear warmup steps (overrides warmup_ratio when > 0)"},
    {"optim.warmup_ratio", "float", "0.0", &Recipe::warmup_ratio,
     "warmup as a fraction of max_steps"},
    {"optim.min_lr_ratio", "float", "0.0", &Recipe::min_lr_ratio,
     "the schedule decays to learning_rate * min_lr_ratio"},
    {"optim.zo_eps", "float", "1e-3", &Recipe::zo_eps,
     "zo-sgd: perturbation size epsilon (the passes use theta + eps z and theta - eps z)"},
    {"optim.zo_perturbations", "int", "1", &Recipe::zo_perturbations,
     "zo-sgd: independent perturbations z per step, their updates averaged (each costs one dual forward)"},

    // [offload]
    {"offload.weights", "string", "\"auto\"", &Recipe::offload_weights,
     "\"stream\": layers cross to the device one at a time (two slots); \"device\": every layer resident; \"auto\": resident when the placement plan fits that way at no cost, else streamed"},
    {"offload.checkpoints", "string", "\"auto\"", &Recipe::offload_checkpoints,
     "layer-input checkpoints: \"auto\" (on the device while the budget allows, then pinned host), \"device\", \"host\" or \"nvme\" (files under offload.nvme_path)"},
    {"offload.recompute", "string", "\"auto\"", &Recipe::offload_recompute,
     "recompute each layer's forward in its backward (\"always\"), keep every layer's activations on the device instead (\"never\"), or keep the last layers' while the device budget allows after the checkpoints (\"auto\"); bit-identical either way"},
    {"offload.accumulation", "string", "\"auto\"", &Recipe::offload_accumulation,
     "the schedule over a step's micro-batches: \"layer_major\" (every micro-batch through each layer while its weights are on the device: weights cross twice per step), \"micro_batch\" (one micro-batch at a time: twice per micro-batch) or \"auto\" (layer_major where it applies and fits); zo-sgd: the step's perturbations x micro-batches dual forwards, the weights once per step layer_major, once per dual forward micro_batch"},
    {"offload.speculative_update", "string", "\"auto\"", &Recipe::offload_speculative_update,
     "with optim.max_grad_norm > 0: \"on\" starts the AdamW of the last groups (head, last layers) as their gradients land in the last backward, before the global norm is known, their master and moments backed up in host RAM so a clipping norm redoes them exactly (bit-identical either way); as many groups as the host budget holds; \"auto\": where the step model finds it faster (never on the cpu backend); \"off\": never"},
    {"offload.working_weights", "string", "\"auto\"", &Recipe::offload_working_weights,
     "full fine-tuning in bf16 with AdamW: keep the decoder layers' bf16 working copy in RAM (\"stored\"), or make it from the fp32 master at each upload into a small pinned staging buffer (\"derived\": 2 bytes a parameter less in RAM, the same bits on the device, a host conversion per upload; layers whose state is on NVMe keep theirs); \"auto\": the placement plan's choice by the step model"},
    {"offload.host_memory", "size", "", &Recipe::host_memory,
     "host RAM budget for weights, optimizer state and staging (unset = the machine's available memory)"},
    {"offload.optimizer", "string", "\"auto\"", &Recipe::offload_optimizer,
     "where the fp32 master weights and AdamW moments live: \"host\" (RAM), \"nvme\" (files under offload.nvme_path, streamed through a pipelined step) or \"auto\" (the placement plan: RAM when it fits, else NVMe when offload.nvme_path is set)"},
    {"offload.nvme_path", "path", "", &Recipe::nvme_path,
     "an existing, writable directory for NVMe-placed state; strata creates its own subfolder in it and removes it at exit"},
    {"offload.nvme_memory", "size", "", &Recipe::nvme_memory,
     "NVMe space strata may use under offload.nvme_path (unset = its free space minus 10%)"},

    // [device]
    {"device.backend", "string", "\"cpu\"", &Recipe::device_backend,
     "\"cpu\", \"cuda\" or \"auto\""},
    {"device.memory", "size", "\"2GiB\"", &Recipe::device_memory,
     "device arena budget, e.g. \"512MiB\", \"20GiB\""},
    {"device.cpu_threads", "int", "0", &Recipe::device_cpu_threads,
     "CPU threads for kernels and the optimizer (0 = OMP_NUM_THREADS or all cores); results do not depend on it"},
    {"device.link_bandwidth", "string", "", &Recipe::device_link_bandwidth,
     "CPU backend only: throttle host<->device copies, e.g. \"16GB/s\" (unset = unthrottled)"},

    // [checkpoint]
    {"checkpoint.output_dir", "path", "\"out\"", &Recipe::output_dir,
     "where metrics.jsonl and the final model are written"},
    {"checkpoint.save_steps", "int", "0", &Recipe::save_steps,
     "save every this many steps (0 = only at the end)"},
    {"checkpoint.save_dtype", "string", "\"bf16\"", &Recipe::save_dtype,
     "dtype of exported weights: \"bf16\" or \"f32\""},
    {"checkpoint.keep_last", "int", "0", &Recipe::keep_last,
     "keep only the newest this many checkpoint-<step> dirs (0 = keep all)"},

    // [lora]
    {"lora.r", "int", "16", &Recipe::lora_r,
     "LoRA rank; a [lora] table in the recipe turns LoRA on: the base is frozen (bf16 on the host, streamed) and only the adapters train"},
    {"lora.alpha", "float", "32", &Recipe::lora_alpha,
     "LoRA alpha: the adapter path is scaled by alpha / r"},
    {"lora.dropout", "float", "0.0", &Recipe::lora_dropout,
     "LoRA dropout on the adapter path's input, in [0, 1) (training passes only)"},
    {"lora.target_modules", "list", "[\"q_proj\", \"k_proj\", \"v_proj\", \"o_proj\", \"gate_proj\", \"up_proj\", \"down_proj\"]", &Recipe::lora_target_modules,
     "the linear layers that get adapters, in PEFT's names (a list, or one comma-separated string); the default is all seven (Phi-3: qkv_proj, o_proj, gate_up_proj, down_proj)"},
    {"lora.merge", "bool", "false", &Recipe::lora_merge,
     "at the end also export a merged Hugging Face model (W + alpha/r B A) to output_dir/merged"},
    {"lora.adapter", "path", "", &Recipe::lora_adapter,
     "a PEFT adapter dir (adapter_config.json + adapter_model.safetensors) to continue training from, with model.path its base"},
    {"lora.base_dtype", "string", "\"auto\"", &Recipe::lora_base_dtype,
     "how the frozen base is held on the host and streamed: \"auto\" (in model.dtype) or \"nf4\" (QLoRA: the decoder layers' linear weights as bitsandbytes' 4-bit NormalFloat codes + absmax, dequantized to bf16 on the device; needs model.dtype = \"bf16\")"},
    {"lora.double_quant", "bool", "true", &Recipe::lora_double_quant,
     "with lora.base_dtype = \"nf4\": quantize the absmax again to 8 bits (bitsandbytes' bnb_4bit_use_double_quant)"},

    // [distributed]
    {"distributed.backend", "string", "\"auto\"", &Recipe::distributed_backend,
     "under mpirun: \"auto\" (nccl for the cuda backend, mpi for cpu), \"nccl\" or \"mpi\""},
    {"distributed.shared_host_store", "string", "\"auto\"", &Recipe::distributed_shared_host_store,
     "under mpirun: the ranks of a node share one host store in POSIX shared memory and split the optimizer update; \"auto\" (shared where a node runs several ranks and the run supports it), true or false"},
    {"distributed.ranks_per_node", "int", "0", &Recipe::distributed_ranks_per_node,
     "under mpirun: 0 = the machines' nodes; N > 0 pretends nodes of N consecutive ranks (one shared store each), e.g. to run the multi-node layout on one machine"},
    {"distributed.timeout", "float", "300", &Recipe::distributed_timeout_s,
     "seconds a collective may wait for the other ranks before every rank exits naming the missing one"},
    {"distributed.diagnostics_steps", "int", "0", &Recipe::distributed_diagnostics_steps,
     "every this many steps, per-rank loss, gradient norm and cosine go to metrics.jsonl (0 = never)"},
    {"distributed.zo", "string", "\"data\"", &Recipe::distributed_zo,
     "zo-sgd under mpirun: \"data\" (ranks run different micro-batches), \"perturbation\" (2 ranks: one runs theta + eps z, the other theta - eps z) or \"2d\" (pairs x data groups); only loss scalars cross"},
};

}  // namespace

const std::vector<RecipeKey>& recipe_schema() {
  static const std::vector<RecipeKey> keys(std::begin(kRecipeKeys), std::end(kRecipeKeys));
  return keys;
}

}  // namespace strata
