#include "src/recipe/recipe.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <set>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <toml++/toml.h>

#include "io/files.h"
#include "src/core/error.h"

namespace strata {

const std::vector<RecipeKey>& recipe_schema() {
  static const std::vector<RecipeKey> keys = {
      {"model.path", "path", "", "Hugging Face model dir (config.json + safetensors) to fine-tune"},
      {"model.config", "path", "", "config.json of a model to initialise from model.init_seed instead of loading weights"},
      {"model.init_seed", "int", "0", "seed of the random initialisation (with model.config)"},
      {"model.init_std", "float", "0.02", "standard deviation of initial matrix weights (with model.config)"},
      {"model.dtype", "string", "\"f32\"", "compute dtype of the weights on the device: \"f32\" or \"bf16\""},
      {"data.path", "path", "", "training data: .txt (documents separated by blank lines), .jsonl ({\"text\"} per line) or .json ({\"input_ids\": [[...]]})"},
      {"data.format", "string", "\"auto\"", "\"auto\" (by extension and, for JSONL, by the fields of the first record), \"text\", \"jsonl\" ({\"text\"} pretraining), \"alpaca\", \"sharegpt\", \"messages\", \"preference\" or \"tokens\""},
      {"data.tokenizer", "string", "\"auto\"", "\"bytes\" (UTF-8 bytes as ids; vocab >= 256), a directory holding tokenizer.json, or \"auto\" (model.path's tokenizer.json when present, else bytes)"},
      {"data.sequence_len", "int", "256", "tokens per row"},
      {"data.packing", "bool", "true", "pack documents into full rows; attention and positions restart at each document"},
      {"data.train_on", "string", "\"assistant\"", "which tokens of a chat sample carry loss: \"assistant\" (every assistant turn), \"last\" (the last assistant turn) or \"all\""},
      {"data.overlong", "string", "\"truncate\"", "a chat/instruction/preference sample longer than sequence_len (and pretraining text without packing) is \"truncate\"d or \"drop\"ped; counted and reported"},
      {"data.skip_bad_lines", "bool", "false", "skip malformed JSONL lines (counted and reported) instead of stopping at the first"},
      {"data.eval_path", "path", "", "held-out dataset for eval loss (same formats as data.path)"},
      {"data.eval_split", "float", "0.0", "fraction of data.path's samples held out (evenly spaced) for eval loss when data.eval_path is unset"},
      {"data.prepared_dir", "path", "", "binary token shards written by `strata prepare`; when set and present, training reads them instead of data.path"},
      {"train.max_steps", "int", "0", "optimizer steps to run (0 = from num_train_epochs)"},
      {"train.num_train_epochs", "float", "1.0", "passes over the training rows when max_steps is 0"},
      {"train.micro_batch_size", "int", "1", "rows per micro-batch"},
      {"train.gradient_accumulation_steps", "int", "1", "micro-batches per optimizer step"},
      {"train.seed", "int", "0", "seed of the data order"},
      {"train.log_steps", "int", "1", "print a progress line every this many steps"},
      {"train.eval_steps", "int", "0", "eval loss on the held-out split every this many steps and at the end (0 = only at the end, when there is a split)"},
      {"train.objective", "string", "\"sft\"", "\"sft\" (token cross-entropy), or a preference objective on preference data: \"dpo\", \"ipo\", \"simpo\" or \"orpo\""},
      {"preference.beta", "float", "0.1 (simpo: 2.0)", "the preference objective's beta: dpo/ipo 0.1, simpo 2.0, orpo (its lambda) 0.1 when unset, as TRL's configs"},
      {"preference.gamma", "float", "0.5", "simpo's target reward margin gamma"},
      {"optim.type", "string", "\"adamw\"", "\"adamw\" (first order: forward + backward) or \"zo-sgd\" (zeroth order, MeZO: two perturbed forward passes, no gradients or moments)"},
      {"optim.moments_dtype", "string", "\"f32\"", "AdamW m and v in host RAM or on NVMe: \"f32\" (8 B/param) or \"bf16\" (4 B/param: read as bf16, computed in f32, rounded back stochastically with a counter-based RNG; resume stays bit-exact)"},
      {"optim.learning_rate", "float", "1e-5", "peak learning rate"},
      {"optim.weight_decay", "float", "0.0", "AdamW decoupled weight decay (matrices only; norms and biases are not decayed)"},
      {"optim.adam_beta1", "float", "0.9", "AdamW beta1"},
      {"optim.adam_beta2", "float", "0.999", "AdamW beta2"},
      {"optim.adam_epsilon", "float", "1e-8", "AdamW epsilon"},
      {"optim.max_grad_norm", "float", "1.0", "clip the global gradient L2 norm to this (0 = no clipping)"},
      {"optim.lr_scheduler_type", "string", "\"cosine\"", "\"cosine\", \"linear\" or \"constant\" after warmup"},
      {"optim.warmup_steps", "int", "0", "linear warmup steps (overrides warmup_ratio when > 0)"},
      {"optim.warmup_ratio", "float", "0.0", "warmup as a fraction of max_steps"},
      {"optim.min_lr_ratio", "float", "0.0", "the schedule decays to learning_rate * min_lr_ratio"},
      {"optim.zo_eps", "float", "1e-3", "zo-sgd: perturbation size epsilon (the passes use theta + eps z and theta - eps z)"},
      {"optim.zo_perturbations", "int", "1", "zo-sgd: independent perturbations z per step, their updates averaged (each costs one dual forward)"},
      {"offload.weights", "string", "\"stream\"", "\"stream\": layers cross to the device one at a time (two slots); \"device\": every layer resident"},
      {"offload.host_memory", "size", "", "host RAM budget for weights, optimizer state and staging (unset = the machine's available memory)"},
      {"offload.checkpoints", "string", "\"auto\"", "layer-input checkpoints: \"auto\" (on the device while the budget allows, then pinned host), \"device\", \"host\" or \"nvme\" (files under offload.nvme_path)"},
      {"offload.recompute", "string", "\"auto\"", "recompute each layer's forward in its backward (\"always\"), keep every layer's activations on the device instead (\"never\"), or keep the last layers' while the device budget allows after the checkpoints (\"auto\"); bit-identical either way"},
      {"offload.optimizer", "string", "\"auto\"", "where the fp32 master weights and AdamW moments live: \"host\" (RAM), \"nvme\" (files under offload.nvme_path, streamed through a pipelined step) or \"auto\" (the placement plan: RAM when it fits, else NVMe when offload.nvme_path is set)"},
      {"offload.accumulation", "string", "\"auto\"", "the schedule over a step's micro-batches: \"layer_major\" (every micro-batch through each layer while its weights are on the device: weights cross twice per step), \"micro_batch\" (one micro-batch at a time: twice per micro-batch) or \"auto\" (layer_major where it applies and fits)"},
      {"offload.nvme_path", "path", "", "an existing, writable directory for NVMe-placed state; strata creates its own subfolder in it and removes it at exit"},
      {"offload.nvme_memory", "size", "", "NVMe space strata may use under offload.nvme_path (unset = its free space minus 10%)"},
      {"device.backend", "string", "\"cpu\"", "\"cpu\", \"cuda\" or \"auto\""},
      {"device.memory", "size", "\"2GiB\"", "device arena budget, e.g. \"512MiB\", \"20GiB\""},
      {"device.link_bandwidth", "string", "", "CPU backend only: throttle host<->device copies, e.g. \"16GB/s\" (unset = unthrottled)"},
      {"device.cpu_threads", "int", "0", "CPU threads for kernels and the optimizer (0 = OMP_NUM_THREADS or all cores); results do not depend on it"},
      {"checkpoint.output_dir", "path", "\"out\"", "where metrics.jsonl and the final model are written"},
      {"checkpoint.save_steps", "int", "0", "save every this many steps (0 = only at the end)"},
      {"checkpoint.save_dtype", "string", "\"bf16\"", "dtype of exported weights: \"bf16\" or \"f32\""},
      {"checkpoint.keep_last", "int", "0", "keep only the newest this many checkpoint-<step> dirs (0 = keep all)"},
      {"lora.r", "int", "16", "LoRA rank; a [lora] table in the recipe turns LoRA on: the base is frozen (bf16 on the host, streamed) and only the adapters train"},
      {"lora.alpha", "float", "32", "LoRA alpha: the adapter path is scaled by alpha / r"},
      {"lora.dropout", "float", "0.0", "LoRA dropout on the adapter path's input, in [0, 1) (training passes only)"},
      {"lora.target_modules", "list", "all", "the linear layers that get adapters, in PEFT's names: \"q_proj\", \"k_proj\", \"v_proj\", \"o_proj\", \"gate_proj\", \"up_proj\", \"down_proj\" (default all seven)"},
      {"lora.merge", "bool", "false", "at the end also export a merged Hugging Face model (W + alpha/r B A) to output_dir/merged"},
      {"lora.adapter", "path", "", "a PEFT adapter dir (adapter_config.json + adapter_model.safetensors) to continue training from, with model.path its base"},
      {"distributed.backend", "string", "\"auto\"", "under mpirun: \"auto\" (nccl for the cuda backend, mpi for cpu), \"nccl\" or \"mpi\""},
      {"distributed.shared_host_store", "string", "\"auto\"", "under mpirun: the ranks of a node share one host store in POSIX shared memory and split the optimizer update; \"auto\" (shared where a node runs several ranks and the run supports it), true or false"},
      {"distributed.ranks_per_node", "int", "0", "under mpirun: 0 = the machines' nodes; N > 0 pretends nodes of N consecutive ranks (one shared store each), e.g. to run the multi-node layout on one machine"},
      {"distributed.timeout", "float", "300", "seconds a collective may wait for the other ranks before every rank exits naming the missing one"},
      {"distributed.zo", "string", "\"data\"", "zo-sgd under mpirun: \"data\" (ranks run different micro-batches), \"perturbation\" (2 ranks: one runs theta + eps z, the other theta - eps z) or \"2d\" (pairs x data groups); only loss scalars cross"},
      {"distributed.diagnostics_steps", "int", "0", "every this many steps, per-rank loss, gradient norm and cosine go to metrics.jsonl (0 = never)"},
  };
  return keys;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

namespace {

const RecipeKey* find_key(const std::string& name) {
  for (auto& k : recipe_schema())
    if (name == k.name) return &k;
  return nullptr;
}

std::string closest_key(const std::string& name) {
  std::string best;
  size_t best_d = SIZE_MAX;
  for (auto& k : recipe_schema()) {
    // compare both the full name and the bare key, so "optim.lr_rate" and "train.learning_rate" both hit
    std::string full = k.name, bare = full.substr(full.find('.') + 1);
    std::string nb = name.substr(name.find('.') == std::string::npos ? 0 : name.find('.') + 1);
    size_t d = std::min(edit_distance(name, full), edit_distance(nb, bare) + 1);
    if (d < best_d) best_d = d, best = full;
  }
  return best;
}

using Values = std::map<std::string, toml::node_view<const toml::node>>;

void check_key(const std::string& name, const std::string& origin) {
  STRATA_CHECK(find_key(name), origin, ": unknown key '", name, "'; did you mean '", closest_key(name),
               "'? (recipes/README.md lists every key)");
}

std::string shown(const toml::node* n);

struct Reader {
  std::map<std::string, std::unique_ptr<toml::node>> values;
  std::set<std::string> from_command_line;  // keys an override set (their errors blame it)
  std::string origin;
  bool lora_table = false;  // the recipe has a [lora] table (LoRA on)

  // Where a key's value came from, for messages: the command line or the recipe file.
  std::string where(const char* name) const {
    return from_command_line.count(name) ? std::string("command line") : origin;
  }

  const toml::node* get(const char* name) const {
    auto it = values.find(name);
    return it == values.end() ? nullptr : it->second.get();
  }
  void read(const char* name, std::string& out) const {
    if (auto* n = get(name)) {
      STRATA_CHECK(n->is_string(), where(name), ": ", name, " must be a string (in quotes)");
      out = n->as_string()->get();
    }
  }
  void read(const char* name, int64_t& out) const {
    if (auto* n = get(name)) {
      STRATA_CHECK(n->is_integer(), where(name), ": ", name, " must be an integer", shown(n));
      out = n->as_integer()->get();
    }
  }
  void read(const char* name, double& out) const {
    if (auto* n = get(name)) {
      STRATA_CHECK(n->is_number(), where(name), ": ", name, " must be a number", shown(n));
      out = n->is_integer() ? double(n->as_integer()->get()) : n->as_floating_point()->get();
      STRATA_CHECK(std::isfinite(out), where(name), ": ", name, " is ", out, ", not a number; write a finite "
                   "number such as ", find_key(name)->fallback);
    }
  }
  void read(const char* name, std::vector<std::string>& out) const {  // a list of strings, or "a,b,c"
    if (auto* n = get(name)) {
      std::vector<std::string> v;
      if (auto* str = n->as_string()) {
        std::string item;
        std::istringstream is(str->get());
        while (std::getline(is, item, ','))
          if (!item.empty()) v.push_back(item);
      } else {
        STRATA_CHECK(n->is_array(), where(name), ": ", name, " must be a list of strings, e.g. [\"q_proj\", \"v_proj\"]");
        for (const toml::node& e : *n->as_array()) {
          STRATA_CHECK(e.is_string(), where(name), ": ", name, " must be a list of strings", shown(&e));
          v.push_back(e.as_string()->get());
        }
      }
      out = std::move(v);
    }
  }
  void read(const char* name, bool& out) const {
    if (auto* n = get(name)) {
      STRATA_CHECK(n->is_boolean(), where(name), ": ", name, " must be true or false", shown(n));
      out = n->as_boolean()->get();
    }
  }
};

// " (it is \"abc\")": the offending value, for a type error.
std::string shown(const toml::node* n) {
  if (auto* str = n->as_string()) return " (it is \"" + str->get() + "\")";
  std::ostringstream os;
  n->visit([&](auto&& v) { os << v; });
  return " (it is " + os.str() + ")";
}

void collect(const toml::table& t, const std::string& prefix, Reader& r) {
  for (auto&& [k, v] : t) {
    std::string name = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    if (v.is_table()) {
      STRATA_CHECK(prefix.empty(), r.origin, ": unexpected table [", name, "]");
      if (name == "lora") r.lora_table = true;
      collect(*v.as_table(), name, r);
      continue;
    }
    if (prefix.empty()) {  // a top-level key that belongs to a section
      STRATA_CHECK(false, r.origin, ": key '", name, "' must be inside a section; did you mean '",
                   closest_key(name), "'?");
    }
    check_key(name, r.origin);
    std::unique_ptr<toml::node> copy;
    v.visit([&](auto&& node) { copy = std::make_unique<std::decay_t<decltype(node)>>(node); });
    r.values[name] = std::move(copy);
  }
}

std::string resolve(const std::string& base_dir, const std::string& p) {
  if (p.empty() || std::filesystem::path(p).is_absolute()) return p;
  return (std::filesystem::path(base_dir) / p).lexically_normal().string();
}

}  // namespace

Recipe recipe_parse(const std::string& text, const std::string& origin,
                    const std::vector<std::string>& overrides) {
  Reader r;
  r.origin = origin;
  toml::table tbl;
  try {
    tbl = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    STRATA_CHECK(false, origin, ":", e.source().begin.line, ":", e.source().begin.column,
                 ": invalid TOML: ", e.description());
  }
  collect(tbl, "", r);
  for (const std::string& o : overrides) {
    size_t eq = o.find('=');
    STRATA_CHECK(eq != std::string::npos && eq > 0, "override '", o,
                 "' must look like section.key=value, e.g. train.max_steps=6");
    std::string name = o.substr(0, eq), value = o.substr(eq + 1);
    check_key(name, "command line");
    std::unique_ptr<toml::node> node;
    try {
      toml::table one = toml::parse("v = " + value);
      one["v"].node()->visit([&](auto&& n) { node = std::make_unique<std::decay_t<decltype(n)>>(n); });
    } catch (const toml::parse_error&) {
      node = std::make_unique<toml::value<std::string>>(value);  // bare words are strings
    }
    r.values[name] = std::move(node);
    r.from_command_line.insert(name);
  }

  Recipe rc;
  rc.source_path = origin;
  r.read("model.path", rc.model_path);
  r.read("model.config", rc.model_config);
  r.read("model.init_seed", rc.model_init_seed);
  r.read("model.init_std", rc.model_init_std);
  r.read("model.dtype", rc.model_dtype);
  r.read("data.path", rc.data_path);
  r.read("data.format", rc.data_format);
  r.read("data.tokenizer", rc.data_tokenizer);
  r.read("data.sequence_len", rc.sequence_len);
  r.read("data.packing", rc.packing);
  r.read("data.train_on", rc.train_on);
  r.read("data.overlong", rc.overlong);
  r.read("data.skip_bad_lines", rc.skip_bad_lines);
  r.read("data.eval_path", rc.eval_path);
  r.read("data.eval_split", rc.eval_split);
  r.read("data.prepared_dir", rc.prepared_dir);
  r.read("train.max_steps", rc.max_steps);
  r.read("train.micro_batch_size", rc.micro_batch_size);
  r.read("train.gradient_accumulation_steps", rc.gradient_accumulation_steps);
  r.read("train.seed", rc.seed);
  r.read("train.num_train_epochs", rc.num_train_epochs);
  r.read("train.log_steps", rc.log_steps);
  r.read("train.eval_steps", rc.eval_steps);
  r.read("train.objective", rc.objective);
  const char* objectives[] = {"sft", "dpo", "ipo", "simpo", "orpo"};
  STRATA_CHECK(std::find(std::begin(objectives), std::end(objectives), rc.objective) != std::end(objectives),
               r.where("train.objective"), ": train.objective must be \"sft\", \"dpo\", \"ipo\", \"simpo\" or \"orpo\"");
  rc.preference_beta = rc.objective == "simpo" ? 2.0 : 0.1;  // TRL's defaults
  r.read("preference.beta", rc.preference_beta);
  r.read("preference.gamma", rc.preference_gamma);
  STRATA_CHECK(rc.preference_beta > 0, r.where("preference.beta"), ": preference.beta must be positive");
  r.read("optim.type", rc.optim_type);
  r.read("optim.zo_eps", rc.zo_eps);
  r.read("optim.zo_perturbations", rc.zo_perturbations);
  rc.max_grad_norm_set = r.get("optim.max_grad_norm") != nullptr;
  r.read("optim.moments_dtype", rc.moments_dtype);
  r.read("optim.learning_rate", rc.learning_rate);
  r.read("optim.weight_decay", rc.weight_decay);
  r.read("optim.adam_beta1", rc.adam_beta1);
  r.read("optim.adam_beta2", rc.adam_beta2);
  r.read("optim.adam_epsilon", rc.adam_epsilon);
  r.read("optim.max_grad_norm", rc.max_grad_norm);
  r.read("optim.lr_scheduler_type", rc.lr_scheduler_type);
  r.read("optim.warmup_steps", rc.warmup_steps);
  r.read("optim.warmup_ratio", rc.warmup_ratio);
  r.read("optim.min_lr_ratio", rc.min_lr_ratio);
  r.read("offload.weights", rc.offload_weights);
  r.read("offload.checkpoints", rc.offload_checkpoints);
  r.read("offload.recompute", rc.offload_recompute);
  r.read("offload.host_memory", rc.host_memory);
  r.read("offload.optimizer", rc.offload_optimizer);
  r.read("offload.accumulation", rc.offload_accumulation);
  r.read("offload.nvme_path", rc.nvme_path);
  r.read("offload.nvme_memory", rc.nvme_memory);
  r.read("device.backend", rc.device_backend);
  r.read("device.memory", rc.device_memory);
  r.read("device.link_bandwidth", rc.device_link_bandwidth);
  r.read("device.cpu_threads", rc.device_cpu_threads);
  r.read("checkpoint.output_dir", rc.output_dir);
  r.read("checkpoint.save_steps", rc.save_steps);
  r.read("checkpoint.save_dtype", rc.save_dtype);
  r.read("checkpoint.keep_last", rc.keep_last);
  rc.lora_enabled = r.lora_table;
  for (const auto& [name, node] : r.values)
    if (name.rfind("lora.", 0) == 0) rc.lora_enabled = true;  // a lora.* override turns it on too
  r.read("lora.r", rc.lora_r);
  r.read("lora.alpha", rc.lora_alpha);
  r.read("lora.dropout", rc.lora_dropout);
  r.read("lora.target_modules", rc.lora_target_modules);
  r.read("lora.merge", rc.lora_merge);
  r.read("lora.adapter", rc.lora_adapter);
  r.read("distributed.backend", rc.distributed_backend);
  if (auto* n = r.get("distributed.shared_host_store"); n && n->is_boolean())  // true | false as TOML booleans
    rc.distributed_shared_host_store = n->as_boolean()->get() ? "true" : "false";
  else
    r.read("distributed.shared_host_store", rc.distributed_shared_host_store);
  r.read("distributed.ranks_per_node", rc.distributed_ranks_per_node);
  r.read("distributed.timeout", rc.distributed_timeout_s);
  r.read("distributed.diagnostics_steps", rc.distributed_diagnostics_steps);
  r.read("distributed.zo", rc.distributed_zo);

  // Paths in the recipe file are relative to its folder; paths given on the command line to the
  // current directory, as with every other tool. Both become absolute, so the effective recipe
  // written to output_dir works from anywhere.
  const std::string file_base = std::filesystem::path(origin).parent_path().string();
  auto absolute = [&](const char* key, std::string& p) {
    if (p.empty()) return;
    std::error_code ec;
    const std::string base = r.from_command_line.count(key) ? std::filesystem::current_path(ec).string() : file_base;
    p = std::filesystem::absolute(resolve(base, p), ec).lexically_normal().string();
  };
  absolute("model.path", rc.model_path);
  absolute("model.config", rc.model_config);
  absolute("data.path", rc.data_path);
  absolute("data.eval_path", rc.eval_path);
  absolute("data.prepared_dir", rc.prepared_dir);
  absolute("checkpoint.output_dir", rc.output_dir);
  absolute("lora.adapter", rc.lora_adapter);
  if (rc.data_tokenizer != "auto" && rc.data_tokenizer != "bytes") absolute("data.tokenizer", rc.data_tokenizer);

  // validation: every message names the key and what to write instead
  STRATA_CHECK(rc.model_path.empty() != rc.model_config.empty(), origin,
               ": set exactly one of model.path (load weights) or model.config (random init)");
  STRATA_CHECK(!rc.data_path.empty(), r.where("data.path"), ": data.path is required");
  STRATA_CHECK(rc.model_dtype == "f32" || rc.model_dtype == "bf16", r.where("model.dtype"), ": model.dtype must be \"f32\" or \"bf16\"");
  STRATA_CHECK(rc.save_dtype == "f32" || rc.save_dtype == "bf16", r.where("checkpoint.save_dtype"), ": checkpoint.save_dtype must be \"f32\" or \"bf16\"");
  STRATA_CHECK(rc.sequence_len >= 2, r.where("data.sequence_len"), ": data.sequence_len must be at least 2");
  STRATA_CHECK(rc.max_steps >= 0, r.where("train.max_steps"), ": train.max_steps must be >= 0 (0 = from num_train_epochs)");
  STRATA_CHECK(rc.max_steps > 0 || rc.num_train_epochs > 0, origin,
               ": set train.max_steps or a positive train.num_train_epochs");
  STRATA_CHECK(rc.eval_steps >= 0, r.where("train.eval_steps"), ": train.eval_steps must be >= 0");
  const char* formats[] = {"auto", "text", "jsonl", "alpaca", "sharegpt", "messages", "preference", "tokens"};
  STRATA_CHECK(std::find(std::begin(formats), std::end(formats), rc.data_format) != std::end(formats), r.where("data.format"),
               ": data.format must be one of \"auto\", \"text\", \"jsonl\", \"alpaca\", \"sharegpt\", "
               "\"messages\", \"preference\", \"tokens\"");
  STRATA_CHECK(rc.train_on == "assistant" || rc.train_on == "last" || rc.train_on == "all", r.where("data.train_on"),
               ": data.train_on must be \"assistant\", \"last\" or \"all\"");
  STRATA_CHECK(rc.overlong == "truncate" || rc.overlong == "drop", r.where("data.overlong"),
               ": data.overlong must be \"truncate\" or \"drop\"");
  STRATA_CHECK(rc.eval_split >= 0 && rc.eval_split < 1, r.where("data.eval_split"), ": data.eval_split must be in [0, 1)");
  STRATA_CHECK(rc.keep_last >= 0, r.where("checkpoint.keep_last"), ": checkpoint.keep_last must be >= 0 (0 keeps all)");
  if (rc.lora_enabled) {
    STRATA_CHECK(rc.lora_r >= 1, r.where("lora.r"), ": lora.r must be at least 1 (16 is PEFT's usual)");
    STRATA_CHECK(rc.lora_alpha > 0, r.where("lora.alpha"), ": lora.alpha must be positive");
    const std::set<std::string> modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
    STRATA_CHECK(!rc.lora_target_modules.empty(), r.where("lora.target_modules"), ": lora.target_modules is empty");
    for (const std::string& m : rc.lora_target_modules)
      STRATA_CHECK(modules.count(m), r.where("lora.target_modules"), ": lora.target_modules names \"", m,
                   "\"; use PEFT's names: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj");
    STRATA_CHECK(rc.lora_dropout >= 0.0 && rc.lora_dropout < 1.0, r.where("lora.dropout"), ": lora.dropout = ",
                 rc.lora_dropout, " must be in [0, 1) (PEFT's usual: 0.05 or 0.1)");
    STRATA_CHECK(!rc.model_path.empty(), origin, ": LoRA trains adapters on a pretrained base: set model.path");
    STRATA_CHECK(rc.optim_type == "adamw", r.where("optim.type"), ": LoRA trains with optim.type = \"adamw\"");
    STRATA_CHECK(rc.offload_optimizer != "nvme", r.where("offload.optimizer"), ": with LoRA the base has no optimizer "
                 "state (the adapters' is small and stays in RAM); set offload.optimizer = \"auto\"");
  }
  STRATA_CHECK(rc.distributed_backend == "auto" || rc.distributed_backend == "nccl" || rc.distributed_backend == "mpi",
               r.where("distributed.backend"), ": distributed.backend must be \"auto\", \"nccl\" or \"mpi\"");
  STRATA_CHECK(rc.distributed_zo == "data" || rc.distributed_zo == "perturbation" || rc.distributed_zo == "2d",
               r.where("distributed.zo"), ": distributed.zo must be \"data\", \"perturbation\" or \"2d\"");
  STRATA_CHECK(rc.distributed_shared_host_store == "auto" || rc.distributed_shared_host_store == "true" ||
               rc.distributed_shared_host_store == "false", r.where("distributed.shared_host_store"),
               ": distributed.shared_host_store must be \"auto\", true or false");
  STRATA_CHECK(rc.distributed_ranks_per_node >= 0, r.where("distributed.ranks_per_node"),
               ": distributed.ranks_per_node must be >= 0 (0 = the machines' nodes)");
  STRATA_CHECK(rc.distributed_timeout_s > 0, r.where("distributed.timeout"), ": distributed.timeout must be positive (seconds)");
  STRATA_CHECK(rc.distributed_diagnostics_steps >= 0, r.where("distributed.diagnostics_steps"),
               ": distributed.diagnostics_steps must be >= 0 (0 = never)");
  STRATA_CHECK(rc.micro_batch_size >= 1, r.where("train.micro_batch_size"), ": train.micro_batch_size must be at least 1");
  STRATA_CHECK(rc.gradient_accumulation_steps >= 1, r.where("train.gradient_accumulation_steps"), ": train.gradient_accumulation_steps must be at least 1");
  STRATA_CHECK(rc.log_steps >= 1, r.where("train.log_steps"), ": train.log_steps must be at least 1");
  STRATA_CHECK(rc.learning_rate >= 0, r.where("optim.learning_rate"), ": optim.learning_rate must not be negative");
  STRATA_CHECK(rc.adam_beta1 >= 0 && rc.adam_beta1 < 1 && rc.adam_beta2 >= 0 && rc.adam_beta2 < 1,
               r.where("optim.adam_beta1"), ": optim.adam_beta1 and adam_beta2 must be in [0, 1)");
  STRATA_CHECK(rc.adam_epsilon > 0, r.where("optim.adam_epsilon"), ": optim.adam_epsilon must be positive");
  STRATA_CHECK(rc.max_grad_norm >= 0, r.where("optim.max_grad_norm"), ": optim.max_grad_norm must be >= 0 (0 disables clipping)");
  STRATA_CHECK(rc.warmup_ratio >= 0 && rc.warmup_ratio <= 1, r.where("optim.warmup_ratio"), ": optim.warmup_ratio must be in [0, 1]");
  STRATA_CHECK(rc.warmup_steps >= 0, r.where("optim.warmup_steps"), ": optim.warmup_steps must be >= 0");
  STRATA_CHECK(rc.lr_scheduler_type == "cosine" || rc.lr_scheduler_type == "linear" ||
                   rc.lr_scheduler_type == "constant",
               r.where("optim.lr_scheduler_type"), ": optim.lr_scheduler_type must be \"cosine\", \"linear\" or \"constant\"");
  STRATA_CHECK(rc.optim_type == "adamw" || rc.optim_type == "zo-sgd", r.where("optim.type"),
               ": optim.type must be \"adamw\" or \"zo-sgd\"");
  STRATA_CHECK(rc.moments_dtype == "f32" || rc.moments_dtype == "bf16", r.where("optim.moments_dtype"),
               ": optim.moments_dtype must be \"f32\" or \"bf16\"");
  STRATA_CHECK(rc.moments_dtype == "f32" || rc.optim_type == "adamw", r.where("optim.moments_dtype"),
               ": optim.moments_dtype = \"bf16\" sets AdamW's moments, and optim.type = \"zo-sgd\" keeps none; remove "
               "optim.moments_dtype");
  STRATA_CHECK(rc.moments_dtype == "f32" || !rc.lora_enabled, r.where("optim.moments_dtype"),
               ": with LoRA only the adapters train and their AdamW moments stay f32 (they are small); remove "
               "optim.moments_dtype");
  STRATA_CHECK(rc.moments_dtype == "f32" || rc.distributed_shared_host_store != "true", r.where("optim.moments_dtype"),
               ": distributed.shared_host_store = true keeps f32 moments in this version; set optim.moments_dtype = "
               "\"f32\" or distributed.shared_host_store = false");
  STRATA_CHECK(rc.zo_eps > 0, r.where("optim.zo_eps"), ": optim.zo_eps must be positive (1e-3 is MeZO's)");
  STRATA_CHECK(rc.zo_perturbations >= 1 && rc.zo_perturbations <= 64, r.where("optim.zo_perturbations"),
               ": optim.zo_perturbations must be in [1, 64]");
  STRATA_CHECK(rc.offload_weights == "auto" || rc.offload_weights == "stream" || rc.offload_weights == "device",
               r.where("offload.weights"), ": offload.weights must be \"auto\", \"stream\" or \"device\"");
  STRATA_CHECK(rc.offload_checkpoints == "auto" || rc.offload_checkpoints == "device" ||
                   rc.offload_checkpoints == "host" || rc.offload_checkpoints == "nvme",
               r.where("offload.checkpoints"), ": offload.checkpoints must be \"auto\", \"device\", \"host\" or \"nvme\"");
  STRATA_CHECK(rc.offload_recompute == "auto" || rc.offload_recompute == "always" || rc.offload_recompute == "never",
               r.where("offload.recompute"), ": offload.recompute must be \"auto\", \"always\" or \"never\"");
  STRATA_CHECK(rc.offload_optimizer == "auto" || rc.offload_optimizer == "host" || rc.offload_optimizer == "nvme",
               r.where("offload.optimizer"), ": offload.optimizer must be \"auto\", \"host\" or \"nvme\"");
  STRATA_CHECK(rc.offload_accumulation == "auto" || rc.offload_accumulation == "layer_major" ||
                   rc.offload_accumulation == "micro_batch",
               r.where("offload.accumulation"), ": offload.accumulation must be \"auto\", \"layer_major\" or \"micro_batch\"");
  if (rc.offload_optimizer == "nvme" || rc.offload_checkpoints == "nvme")
    STRATA_CHECK(!rc.nvme_path.empty(), r.where(rc.offload_optimizer == "nvme" ? "offload.optimizer" : "offload.checkpoints"),
                 ": ", rc.offload_optimizer == "nvme" ? "offload.optimizer" : "offload.checkpoints",
                 " = \"nvme\" needs offload.nvme_path: set it to a directory on a fast local disk");
  if (!rc.nvme_memory.empty())
    rc.nvme_memory_bytes = parse_bytes(rc.nvme_memory, r.where("offload.nvme_memory") + ": offload.nvme_memory");
  STRATA_CHECK(rc.device_cpu_threads >= 0, r.where("device.cpu_threads"), ": device.cpu_threads must be >= 0");
  STRATA_CHECK(rc.save_steps >= 0, r.where("checkpoint.save_steps"), ": checkpoint.save_steps must be >= 0");
  if (!rc.host_memory.empty())
    rc.host_memory_bytes = parse_bytes(rc.host_memory, r.where("offload.host_memory") + ": offload.host_memory");
  rc.device_memory_bytes = parse_bytes(rc.device_memory, r.where("device.memory") + ": device.memory");
  if (!rc.device_link_bandwidth.empty())
    rc.device_link_bytes_per_s =
        parse_bandwidth(rc.device_link_bandwidth, r.where("device.link_bandwidth") + ": device.link_bandwidth");
  return rc;
}

Recipe recipe_load(const std::string& path, const std::vector<std::string>& overrides) {
  return recipe_parse(file_read(path, "recipe", "check the path", ErrorKind::input), path, overrides);
}

std::string Recipe::to_toml() const {
  std::ostringstream os;
  auto q = [](const std::string& s) { return "\"" + s + "\""; };
  os << "[model]\n";
  if (!model_path.empty()) os << "path = " << q(model_path) << "\n";
  if (!model_config.empty()) os << "config = " << q(model_config) << "\ninit_seed = " << model_init_seed
                                << "\ninit_std = " << model_init_std << "\n";
  os << "dtype = " << q(model_dtype) << "\n\n[data]\npath = " << q(data_path) << "\nformat = "
     << q(data_format) << "\ntokenizer = " << q(data_tokenizer) << "\nsequence_len = " << sequence_len
     << "\npacking = " << (packing ? "true" : "false") << "\ntrain_on = " << q(train_on)
     << "\noverlong = " << q(overlong) << "\nskip_bad_lines = " << (skip_bad_lines ? "true" : "false")
     << "\neval_split = " << eval_split << "\n";
  if (!eval_path.empty()) os << "eval_path = " << q(eval_path) << "\n";
  if (!prepared_dir.empty()) os << "prepared_dir = " << q(prepared_dir) << "\n";
  os << "\n[train]\nmax_steps = " << max_steps << "\nnum_train_epochs = " << num_train_epochs
     << "\nmicro_batch_size = " << micro_batch_size << "\ngradient_accumulation_steps = "
     << gradient_accumulation_steps << "\nseed = " << seed << "\nlog_steps = " << log_steps << "\neval_steps = " << eval_steps
     << "\nobjective = " << q(objective) << "\n";
  if (objective != "sft") os << "\n[preference]\nbeta = " << preference_beta << "\ngamma = " << preference_gamma << "\n";
  os << "\n[optim]\ntype = " << q(optim_type) << "\nmoments_dtype = " << q(moments_dtype) << "\nlearning_rate = " << learning_rate << "\nweight_decay = " << weight_decay
     << "\nadam_beta1 = " << adam_beta1 << "\nadam_beta2 = " << adam_beta2 << "\nadam_epsilon = "
     << adam_epsilon << "\nmax_grad_norm = " << max_grad_norm << "\nlr_scheduler_type = "
     << q(lr_scheduler_type) << "\nwarmup_steps = " << warmup_steps << "\nwarmup_ratio = " << warmup_ratio
     << "\nmin_lr_ratio = " << min_lr_ratio << "\nzo_eps = " << zo_eps << "\nzo_perturbations = " << zo_perturbations
     << "\n\n[offload]\nweights = " << q(offload_weights)
     << "\ncheckpoints = " << q(offload_checkpoints) << "\nrecompute = " << q(offload_recompute)
     << "\naccumulation = " << q(offload_accumulation) << "\n";
  if (!host_memory.empty()) os << "host_memory = " << q(host_memory) << "\n";
  os << "optimizer = " << q(offload_optimizer) << "\n";
  if (!nvme_path.empty()) os << "nvme_path = " << q(nvme_path) << "\n";
  if (!nvme_memory.empty()) os << "nvme_memory = " << q(nvme_memory) << "\n";
  os << "\n[device]\nbackend = " << q(device_backend)
     << "\nmemory = " << q(device_memory) << "\ncpu_threads = " << device_cpu_threads << "\n";
  if (!device_link_bandwidth.empty()) os << "link_bandwidth = " << q(device_link_bandwidth) << "\n";
  os << "\n[checkpoint]\noutput_dir = " << q(output_dir) << "\nsave_steps = " << save_steps
     << "\nsave_dtype = " << q(save_dtype) << "\nkeep_last = " << keep_last << "\n";
  if (lora_enabled) {
    os << "\n[lora]\nr = " << lora_r << "\nalpha = " << lora_alpha << "\ndropout = " << lora_dropout << "\ntarget_modules = [";
    for (size_t i = 0; i < lora_target_modules.size(); ++i) os << (i ? ", " : "") << q(lora_target_modules[i]);
    os << "]\nmerge = " << (lora_merge ? "true" : "false") << "\n";
    if (!lora_adapter.empty()) os << "adapter = " << q(lora_adapter) << "\n";
  }
  os << "\n[distributed]\nbackend = " << q(distributed_backend) << "\nshared_host_store = "
     << (distributed_shared_host_store == "auto" ? q(distributed_shared_host_store) : distributed_shared_host_store)
     << "\nranks_per_node = " << distributed_ranks_per_node << "\ntimeout = " << distributed_timeout_s
     << "\ndiagnostics_steps = " << distributed_diagnostics_steps << "\nzo = " << q(distributed_zo) << "\n";
  return os.str();
}

size_t parse_bytes(const std::string& text, const std::string& what) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit((unsigned char)text[i]) || text[i] == '.')) ++i;
  STRATA_CHECK(i > 0, what, " = \"", text, "\" is not a size: write e.g. \"512MiB\", \"24GiB\" or \"8GB\"");
  double value = std::stod(text.substr(0, i));
  std::string unit = text.substr(i);
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  double scale = 0;
  if (unit.empty() || unit == "B") scale = 1;
  else if (unit == "KiB" || unit == "K") scale = 1024.0;
  else if (unit == "MiB" || unit == "M") scale = 1024.0 * 1024;
  else if (unit == "GiB" || unit == "G") scale = 1024.0 * 1024 * 1024;
  else if (unit == "TiB" || unit == "T") scale = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "KB") scale = 1e3;
  else if (unit == "MB") scale = 1e6;
  else if (unit == "GB") scale = 1e9;
  else if (unit == "TB") scale = 1e12;
  STRATA_CHECK(scale > 0, what, " = \"", text, "\": unknown unit '", unit,
               "' (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)");
  return size_t(std::llround(value * scale));
}

double parse_bandwidth(const std::string& text, const std::string& what) {
  std::string t = text;
  STRATA_CHECK(t.size() > 2 && t.substr(t.size() - 2) == "/s", what, " = \"", text,
               "\" is not a bandwidth: write e.g. \"16GB/s\"");
  return double(parse_bytes(t.substr(0, t.size() - 2), what));
}

}  // namespace strata
