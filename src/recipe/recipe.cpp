#include "src/recipe/recipe.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string_view>
#include <toml++/toml.h>

#include "io/files.h"
#include "src/comm/comm.h"
#include "src/core/error.h"

namespace strata {

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

bool is_key(const RecipeKey& k, std::string_view name) { return name == k.name; }

const RecipeKey* find_key(const std::string& name) {
  for (auto& k : recipe_schema())
    if (is_key(k, name)) return &k;
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

void check_key(const std::string& name, const std::string& origin) {
  STRATA_CHECK(find_key(name), origin, ": unknown key '", name, "'; did you mean '", closest_key(name),
               "'? (recipes/README.md lists every key)");
}

// The keys' values as written, before they are read into a Recipe.
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
};

std::unique_ptr<toml::node> node_copy(const toml::node& n) {
  std::unique_ptr<toml::node> copy;
  n.visit([&](auto&& v) { copy = std::make_unique<std::decay_t<decltype(v)>>(v); });
  return copy;
}

// `text` as one TOML value ("3", "\"auto\"", "[\"q_proj\"]"); null when it is not one.
std::unique_ptr<toml::node> toml_value(const std::string& text) {
  try {
    toml::table one = toml::parse("v = " + text);
    return node_copy(*one["v"].node());
  } catch (const toml::parse_error&) {
    return nullptr;
  }
}

// " (it is \"abc\")": the offending value, for a type error.
std::string shown(const toml::node& n) {
  if (auto* str = n.as_string()) return " (it is \"" + str->get() + "\")";
  std::ostringstream os;
  n.visit([&](auto&& v) { os << v; });
  return " (it is " + os.str() + ")";
}

// value_store: TOML value `n` of key `k` into its Recipe member, or an error naming the key and
// `where` the value came from. One overload per member type of RecipeField.
void value_store(const RecipeKey& k, const toml::node& n, const std::string& where, std::string& out) {
  STRATA_CHECK(n.is_string(), where, ": ", k.name, " must be a string (in quotes)");
  out = n.as_string()->get();
}

void value_store(const RecipeKey& k, const toml::node& n, const std::string& where, int64_t& out) {
  STRATA_CHECK(n.is_integer(), where, ": ", k.name, " must be an integer", shown(n));
  out = n.as_integer()->get();
}

void value_store(const RecipeKey& k, const toml::node& n, const std::string& where, double& out) {
  STRATA_CHECK(n.is_number(), where, ": ", k.name, " must be a number", shown(n));
  out = n.is_integer() ? double(n.as_integer()->get()) : n.as_floating_point()->get();
  STRATA_CHECK(std::isfinite(out), where, ": ", k.name, " is ", out, ", not a number; write a finite "
               "number such as ", k.fallback);
}

void value_store(const RecipeKey& k, const toml::node& n, const std::string& where, bool& out) {
  STRATA_CHECK(n.is_boolean(), where, ": ", k.name, " must be true or false", shown(n));
  out = n.as_boolean()->get();
}

// A list of strings, or one string "a,b,c".
void value_store(const RecipeKey& k, const toml::node& n, const std::string& where, std::vector<std::string>& out) {
  std::vector<std::string> v;
  if (auto* str = n.as_string()) {
    std::string item;
    std::istringstream is(str->get());
    while (std::getline(is, item, ','))
      if (!item.empty()) v.push_back(item);
  } else {
    STRATA_CHECK(n.is_array(), where, ": ", k.name, " must be a list of strings, e.g. [\"q_proj\", \"v_proj\"]");
    for (const toml::node& e : *n.as_array()) {
      STRATA_CHECK(e.is_string(), where, ": ", k.name, " must be a list of strings", shown(e));
      v.push_back(e.as_string()->get());
    }
  }
  out = std::move(v);
}

// A list of numbers ("1.0, 0.5" as one string too): grpo.reward_weights.
void value_store(const RecipeKey& k, const toml::node& n, const std::string& where, std::vector<double>& out) {
  std::vector<double> v;
  auto number = [&](const std::string& text) {
    size_t used = 0;
    double x = 0;
    try {
      x = std::stod(text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    STRATA_CHECK(used > 0 && std::isfinite(x), where, ": ", k.name, " must be a list of finite numbers, e.g. [1.0, 0.5]"
                 " (it holds \"", text, "\")");
    v.push_back(x);
  };
  if (auto* str = n.as_string()) {
    std::string item;
    std::istringstream is(str->get());
    while (std::getline(is, item, ','))
      if (item.find_first_not_of(' ') != std::string::npos) number(item);
  } else {
    STRATA_CHECK(n.is_array(), where, ": ", k.name, " must be a list of numbers, e.g. [1.0, 0.5]");
    for (const toml::node& e : *n.as_array()) {
      STRATA_CHECK(e.is_number(), where, ": ", k.name, " must be a list of numbers", shown(e));
      const double x = e.is_integer() ? double(e.as_integer()->get()) : e.as_floating_point()->get();
      STRATA_CHECK(std::isfinite(x), where, ": ", k.name, " holds ", x, "; write finite numbers");
      v.push_back(x);
    }
  }
  out = std::move(v);
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
    r.values[name] = node_copy(v);
  }
}

// The recipe text's keys, then the "section.key=value" overrides over them.
Reader reader_from(const std::string& text, const std::string& origin, const std::vector<std::string>& overrides) {
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
    std::unique_ptr<toml::node> node = toml_value(value);
    if (!node) node = std::make_unique<toml::value<std::string>>(value);  // bare words are strings
    r.values[name] = std::move(node);
    r.from_command_line.insert(name);
  }
  // distributed.shared_host_store and train.router_aux_loss take true | false as TOML booleans too:
  // read as the strings
  for (const char* key : {"distributed.shared_host_store", "train.router_aux_loss"})
    if (auto* n = r.get(key); n && n->is_boolean())
      r.values[key] = std::make_unique<toml::value<std::string>>(n->as_boolean()->get() ? "true" : "false");
  return r;
}

// Every key from the recipe or the command line, else from its default.
void read_keys(Recipe& rc, const Reader& r) {
  for (const RecipeKey& k : recipe_schema()) {
    std::unique_ptr<toml::node> fallback;
    const toml::node* n = r.get(k.name);
    if (!n) n = (fallback = toml_value(k.fallback)).get();  // none for "" (unset) and preference.beta's
    if (n) std::visit([&](auto member) { value_store(k, *n, r.where(k.name), rc.*member); }, k.field);
  }
}

// What the rows cannot say: the objective decides preference.beta's default, a [lora] table or a
// lora.* override turns LoRA on, and whether optim.max_grad_norm was given at all.
void read_dependent(Recipe& rc, const Reader& r) {
  const char* objectives[] = {"sft", "dpo", "ipo", "simpo", "orpo", "grpo"};
  STRATA_CHECK(std::find(std::begin(objectives), std::end(objectives), rc.objective) != std::end(objectives),
               r.where("train.objective"), ": train.objective must be \"sft\", \"dpo\", \"ipo\", \"simpo\", \"orpo\" "
               "or \"grpo\"");
  if (!r.get("grpo.epsilon_high")) rc.grpo_epsilon_high = rc.grpo_epsilon;  // TRL: None is epsilon
  if (!r.get("preference.beta")) rc.preference_beta = rc.objective == "simpo" ? 2.0 : 0.1;  // TRL's defaults
  STRATA_CHECK(rc.preference_beta > 0, r.where("preference.beta"), ": preference.beta must be positive");
  rc.max_grad_norm_set = r.get("optim.max_grad_norm") != nullptr;
  rc.micro_batch_size_set = r.get("train.micro_batch_size") != nullptr;
  rc.gradient_accumulation_steps_set = r.get("train.gradient_accumulation_steps") != nullptr;
  rc.lora_enabled = r.lora_table;
  for (const auto& [name, node] : r.values)
    if (name.rfind("lora.", 0) == 0) rc.lora_enabled = true;  // a lora.* override turns it on too
}

std::string resolve(const std::string& base_dir, const std::string& p) {
  if (p.empty() || std::filesystem::path(p).is_absolute()) return p;
  return (std::filesystem::path(base_dir) / p).lexically_normal().string();
}

// Paths in the recipe file are relative to its folder; paths given on the command line to the
// current directory, as with every other tool. Both become absolute, so the effective recipe
// written to output_dir works from anywhere. offload.nvme_path is kept as written.
void make_paths_absolute(Recipe& rc, const Reader& r) {
  const std::string file_base = std::filesystem::path(r.origin).parent_path().string();
  auto absolute = [&](const char* key, std::string& p) {
    if (p.empty()) return;
    std::error_code ec;
    const std::string base = r.from_command_line.count(key) ? std::filesystem::current_path(ec).string() : file_base;
    p = std::filesystem::absolute(resolve(base, p), ec).lexically_normal().string();
  };
  for (const RecipeKey& k : recipe_schema())
    if (std::string_view(k.type) == "path" && !is_key(k, "offload.nvme_path"))
      absolute(k.name, rc.*std::get<std::string Recipe::*>(k.field));
  if (rc.data_tokenizer != "auto" && rc.data_tokenizer != "bytes") absolute("data.tokenizer", rc.data_tokenizer);
}

// The checks, run in the order below (the first that fails is the error): every message names
// the key and what to write instead.
void check_model_data_train(const Recipe& rc, const Reader& r) {
  STRATA_CHECK(rc.model_path.empty() != rc.model_config.empty(), r.origin,
               ": set exactly one of model.path (load weights) or model.config (random init)");
  STRATA_CHECK(!rc.data_path.empty(), r.where("data.path"), ": data.path is required");
  STRATA_CHECK(rc.model_dtype == "f32" || rc.model_dtype == "bf16", r.where("model.dtype"), ": model.dtype must be \"f32\" or \"bf16\"");
  STRATA_CHECK(rc.router_aux_loss == "auto" || rc.router_aux_loss == "true" || rc.router_aux_loss == "false",
               r.where("train.router_aux_loss"), ": train.router_aux_loss must be \"auto\", true or false (not \"",
               rc.router_aux_loss, "\")");
  STRATA_CHECK(rc.save_dtype == "f32" || rc.save_dtype == "bf16", r.where("checkpoint.save_dtype"), ": checkpoint.save_dtype must be \"f32\" or \"bf16\"");
  STRATA_CHECK(rc.sequence_len >= 2, r.where("data.sequence_len"), ": data.sequence_len must be at least 2");
  STRATA_CHECK(rc.max_steps >= 0, r.where("train.max_steps"), ": train.max_steps must be >= 0 (0 = from num_train_epochs)");
  STRATA_CHECK(rc.max_steps > 0 || rc.num_train_epochs > 0, r.origin,
               ": set train.max_steps or a positive train.num_train_epochs");
  STRATA_CHECK(rc.eval_steps >= 0, r.where("train.eval_steps"), ": train.eval_steps must be >= 0");
  const char* formats[] = {"auto", "text", "jsonl", "alpaca", "sharegpt", "messages", "preference", "tokens", "prompt"};
  STRATA_CHECK(std::find(std::begin(formats), std::end(formats), rc.data_format) != std::end(formats), r.where("data.format"),
               ": data.format must be one of \"auto\", \"text\", \"jsonl\", \"alpaca\", \"sharegpt\", "
               "\"messages\", \"preference\", \"tokens\", \"prompt\"");
  STRATA_CHECK(rc.train_on == "assistant" || rc.train_on == "last" || rc.train_on == "all", r.where("data.train_on"),
               ": data.train_on must be \"assistant\", \"last\" or \"all\"");
  STRATA_CHECK(rc.overlong == "truncate" || rc.overlong == "drop", r.where("data.overlong"),
               ": data.overlong must be \"truncate\" or \"drop\"");
  STRATA_CHECK(rc.eval_split >= 0 && rc.eval_split < 1, r.where("data.eval_split"), ": data.eval_split must be in [0, 1)");
  STRATA_CHECK(rc.keep_last >= 0, r.where("checkpoint.keep_last"), ": checkpoint.keep_last must be >= 0 (0 keeps all)");
}

// [lora] (only when LoRA is on). A pretrained base (model.path) is the trainer's to require
// (src/train/trainer.cpp): `strata estimate` prices LoRA on a model.config alone.
void check_lora(const Recipe& rc, const Reader& r) {
  if (!rc.lora_enabled) return;
  STRATA_CHECK(rc.lora_r >= 1, r.where("lora.r"), ": lora.r must be at least 1 (16 is PEFT's usual)");
  STRATA_CHECK(rc.lora_alpha > 0, r.where("lora.alpha"), ": lora.alpha must be positive");
  STRATA_CHECK(rc.lora_base_dtype == "auto" || rc.lora_base_dtype == "nf4", r.where("lora.base_dtype"),
               ": lora.base_dtype must be \"auto\" (the base in model.dtype) or \"nf4\" (fp4 and int8 are not built)");
  STRATA_CHECK(rc.lora_base_dtype != "nf4" || rc.model_dtype == "bf16" || rc.model_dtype == "bfloat16", r.where("lora.base_dtype"),
               ": lora.base_dtype = \"nf4\" computes in bf16: set model.dtype = \"bf16\"");
  const std::set<std::string> modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
                                         "qkv_proj", "gate_up_proj"};  // the last two: Phi-3's fused ones
  STRATA_CHECK(!rc.lora_target_modules.empty() || !rc.lora_target_parameters.empty(), r.where("lora.target_modules"),
               ": lora.target_modules is empty (and so is lora.target_parameters)");
  const std::set<std::string> parameters = {"mlp.gate.weight", "gate.weight", "mlp.experts.gate_up_proj",
                                            "experts.gate_up_proj", "mlp.experts.down_proj", "experts.down_proj"};
  for (const std::string& p : rc.lora_target_parameters)
    STRATA_CHECK(parameters.count(p), r.where("lora.target_parameters"), ": lora.target_parameters names \"", p,
                 "\"; PEFT's names of a mixture-of-experts layer's router and experts are mlp.gate.weight, "
                 "mlp.experts.gate_up_proj and mlp.experts.down_proj");
  STRATA_CHECK(rc.lora_dropout == 0.0 || rc.lora_target_parameters.empty(), r.where("lora.dropout"), ": lora.dropout = ",
               rc.lora_dropout, " with lora.target_parameters: PEFT's ParamWrapper (the router and experts' adapters) "
               "refuses dropout; set lora.dropout = 0");
  for (const std::string& m : rc.lora_target_modules)
    STRATA_CHECK(modules.count(m), r.where("lora.target_modules"), ": lora.target_modules names \"", m,
                 "\"; use PEFT's names: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj (Phi-3: qkv_proj, "
                 "o_proj, gate_up_proj, down_proj)");
  STRATA_CHECK(rc.lora_dropout >= 0.0 && rc.lora_dropout < 1.0, r.where("lora.dropout"), ": lora.dropout = ",
               rc.lora_dropout, " must be in [0, 1) (PEFT's usual: 0.05 or 0.1)");
  STRATA_CHECK(rc.modes.optimizer == OptimizerKind::adamw, r.where("optim.type"), ": LoRA trains with optim.type = \"adamw\"");
  STRATA_CHECK(rc.modes.optimizer_tier != StateTier::nvme, r.where("offload.optimizer"), ": with LoRA the base has no optimizer "
               "state (the adapters' is small and stays in RAM); set offload.optimizer = \"auto\"");
}

// [grpo] and data.format = "prompt" (they go together): every bad value names its key.
void check_grpo(const Recipe& rc, const Reader& r) {
  const bool grpo = rc.objective == "grpo";
  STRATA_CHECK(grpo == (rc.data_format == "prompt") || (grpo && rc.data_format == "auto"), r.where("data.format"),
               grpo ? ": train.objective = \"grpo\" samples completions for prompts: set data.format = \"prompt\" "
                      "({\"prompt\"} or {\"messages\"} JSONL records)"
                    : ": data.format = \"prompt\" holds prompts without answers, for train.objective = \"grpo\"; "
                      "set train.objective = \"grpo\" or another data.format");
  if (!grpo) return;
  auto need = [&](bool ok, const char* key, const std::string& what) { STRATA_CHECK(ok, r.where(key), ": ", key, what); };
  need(rc.grpo_num_generations >= 2, "grpo.num_generations", str_cat(" = ", rc.grpo_num_generations,
       " must be at least 2: a group's mean is each completion's baseline"));
  const int64_t rows = rc.global_batch_size > 0 ? rc.global_batch_size : rc.micro_batch_size * rc.gradient_accumulation_steps;
  need(rows % rc.grpo_num_generations == 0, "grpo.num_generations",
       str_cat(" (", rc.grpo_num_generations, ") must divide the completions per step, ", rc.global_batch_size > 0
               ? std::string("train.global_batch_size") : str_cat("train.micro_batch_size x gradient_accumulation_steps = ",
               rc.micro_batch_size, " x ", rc.gradient_accumulation_steps), " = ", rows,
               " (as TRL requires; with several ranks each rank's, so that it keeps whole groups): change one of them"));
  need(rc.grpo_max_completion_length >= 1, "grpo.max_completion_length", " must be at least 1");
  need(rc.grpo_max_completion_length + 2 <= rc.sequence_len, "grpo.max_completion_length",
       str_cat(" (", rc.grpo_max_completion_length, ") leaves no room for a prompt in data.sequence_len (",
               rc.sequence_len, "): raise data.sequence_len to the longest prompt + max_completion_length"));
  need(rc.grpo_temperature > 0, "grpo.temperature", " must be positive (1.0 samples the model as it is)");
  need(rc.grpo_top_p > 0 && rc.grpo_top_p <= 1, "grpo.top_p", " must be in (0, 1] (1.0 = off)");
  need(rc.grpo_top_k >= 0, "grpo.top_k", " must be >= 0 (0 = off)");
  need(rc.grpo_beta >= 0, "grpo.beta", " must be >= 0 (0 = no KL term, TRL's default)");
  need(rc.grpo_epsilon >= 0 && rc.grpo_epsilon < 1, "grpo.epsilon", " must be in [0, 1) (TRL's default 0.2)");
  need(rc.grpo_epsilon_high >= 0, "grpo.epsilon_high", " must be >= 0 (unset: epsilon's value)");
  need(rc.grpo_num_iterations >= 1, "grpo.num_iterations", " must be at least 1");
  const char* losses[] = {"grpo", "bnpo", "dr_grpo", "dapo"};
  need(std::find(std::begin(losses), std::end(losses), rc.grpo_loss_type) != std::end(losses), "grpo.loss_type",
       str_cat(" must be \"grpo\", \"bnpo\", \"dr_grpo\" or \"dapo\" (not \"", rc.grpo_loss_type, "\")"));
  need(rc.grpo_scale_rewards == "group" || rc.grpo_scale_rewards == "batch" || rc.grpo_scale_rewards == "none",
       "grpo.scale_rewards", str_cat(" must be \"group\", \"batch\" or \"none\" (not \"", rc.grpo_scale_rewards, "\")"));
  for (const std::string& f : rc.grpo_reward_funcs)
    need(f == "accuracy" || f == "format" || f == "json" || f == "length" || f == "command", "grpo.reward_funcs",
         str_cat(" names \"", f, "\"; the built-in rewards are accuracy, format, json and length (an external "
                 "program: grpo.reward_command)"));
  need(!rc.grpo_reward_funcs.empty() || !rc.grpo_reward_command.empty(), "grpo.reward_funcs",
       " is empty and grpo.reward_command unset: GRPO needs a reward (e.g. reward_funcs = [\"accuracy\"])");
  const bool format = std::find(rc.grpo_reward_funcs.begin(), rc.grpo_reward_funcs.end(), "format") != rc.grpo_reward_funcs.end();
  need(!format || !rc.grpo_format_regex.empty(), "grpo.format_regex", " is needed by the reward function format");
  const size_t funcs = rc.grpo_reward_funcs.size() + (rc.grpo_reward_command.empty() ||
      std::find(rc.grpo_reward_funcs.begin(), rc.grpo_reward_funcs.end(), "command") != rc.grpo_reward_funcs.end() ? 0 : 1);
  need(rc.grpo_reward_weights.empty() || rc.grpo_reward_weights.size() == funcs, "grpo.reward_weights",
       str_cat(" has ", rc.grpo_reward_weights.size(), " entries for ", funcs, " reward functions (reward_funcs",
               rc.grpo_reward_command.empty() ? "" : ", then the command", ")"));
  need(rc.grpo_reward_timeout > 0, "grpo.reward_timeout", " must be positive (seconds per step's batch)");
  need(rc.grpo_length_buffer >= 0, "grpo.length_buffer", " must be >= 0 (0 = max_completion_length / 4)");
  need(rc.grpo_log_completions >= 0, "grpo.log_completions", " must be >= 0 (0 = none)");
  need(rc.eval_path.empty() && rc.eval_split == 0, rc.eval_path.empty() ? "data.eval_split" : "data.eval_path",
       ": GRPO runs no eval pass in this version (its reward is measured on each step's own samples); remove it");
  need(rc.prepared_dir.empty(), "data.prepared_dir", ": GRPO reads its prompts from data.path (they are small and not "
       "packed); remove data.prepared_dir");
  need(rc.modes.optimizer == OptimizerKind::adamw, "optim.type", " must be \"adamw\" with train.objective = \"grpo\"");
}

void check_distributed(const Recipe& rc, const Reader& r) {
  STRATA_CHECK(rc.modes.distributed != CommBackend::single, r.where("distributed.backend"),
               ": distributed.backend must be \"auto\", \"nccl\" or \"mpi\"");
  STRATA_CHECK(rc.distributed_ranks_per_node >= 0, r.where("distributed.ranks_per_node"),
               ": distributed.ranks_per_node must be >= 0 (0 = the machines' nodes)");
  STRATA_CHECK(rc.distributed_timeout_s > 0, r.where("distributed.timeout"), ": distributed.timeout must be positive (seconds)");
  STRATA_CHECK(rc.distributed_diagnostics_steps >= 0, r.where("distributed.diagnostics_steps"),
               ": distributed.diagnostics_steps must be >= 0 (0 = never)");
}

void check_train_optim(const Recipe& rc, const Reader& r) {
  STRATA_CHECK(rc.micro_batch_size >= 1, r.where("train.micro_batch_size"), ": train.micro_batch_size must be at least 1");
  STRATA_CHECK(rc.gradient_accumulation_steps >= 1, r.where("train.gradient_accumulation_steps"), ": train.gradient_accumulation_steps must be at least 1");
  STRATA_CHECK(rc.global_batch_size >= 0, r.where("train.global_batch_size"),
               ": train.global_batch_size must be >= 0 (0: micro_batch_size x gradient_accumulation_steps x ranks)");
  STRATA_CHECK(rc.global_batch_size == 0 || !rc.micro_batch_size_set || !rc.gradient_accumulation_steps_set ||
                   rc.global_batch_size % (rc.micro_batch_size * rc.gradient_accumulation_steps) == 0,
               r.where("train.global_batch_size"), ": train.global_batch_size (", rc.global_batch_size,
               ") is not micro_batch_size x gradient_accumulation_steps (", rc.micro_batch_size, " x ",
               rc.gradient_accumulation_steps, ") x ranks: leave one of them out for the plan to choose");
  STRATA_CHECK(rc.log_steps >= 1, r.where("train.log_steps"), ": train.log_steps must be at least 1");
  STRATA_CHECK(rc.learning_rate >= 0, r.where("optim.learning_rate"), ": optim.learning_rate must not be negative");
  STRATA_CHECK(rc.adam_beta1 >= 0 && rc.adam_beta1 < 1 && rc.adam_beta2 >= 0 && rc.adam_beta2 < 1,
               r.where("optim.adam_beta1"), ": optim.adam_beta1 and adam_beta2 must be in [0, 1)");
  STRATA_CHECK(rc.adam_epsilon > 0, r.where("optim.adam_epsilon"), ": optim.adam_epsilon must be positive");
  STRATA_CHECK(rc.max_grad_norm >= 0, r.where("optim.max_grad_norm"), ": optim.max_grad_norm must be >= 0 (0 disables clipping)");
  STRATA_CHECK(rc.warmup_ratio >= 0 && rc.warmup_ratio <= 1, r.where("optim.warmup_ratio"), ": optim.warmup_ratio must be in [0, 1]");
  STRATA_CHECK(rc.warmup_steps >= 0, r.where("optim.warmup_steps"), ": optim.warmup_steps must be >= 0");
  STRATA_CHECK(rc.moments_dtype == "f32" || rc.moments_dtype == "bf16", r.where("optim.moments_dtype"),
               ": optim.moments_dtype must be \"f32\" or \"bf16\"");
  STRATA_CHECK(rc.moments_dtype == "f32" || rc.modes.optimizer == OptimizerKind::adamw, r.where("optim.moments_dtype"),
               ": optim.moments_dtype = \"bf16\" sets AdamW's moments, and optim.type = \"zo-sgd\" keeps none; remove "
               "optim.moments_dtype");
  STRATA_CHECK(rc.moments_dtype == "f32" || !rc.lora_enabled, r.where("optim.moments_dtype"),
               ": with LoRA only the adapters train and their AdamW moments stay f32 (they are small); remove "
               "optim.moments_dtype");
  STRATA_CHECK(rc.moments_dtype == "f32" || rc.modes.shared_host_store != Toggle::on, r.where("optim.moments_dtype"),
               ": distributed.shared_host_store = true keeps f32 moments in this version; set optim.moments_dtype = "
               "\"f32\" or distributed.shared_host_store = false");
  STRATA_CHECK(rc.zo_eps > 0, r.where("optim.zo_eps"), ": optim.zo_eps must be positive (1e-3 is MeZO's)");
  STRATA_CHECK(rc.zo_perturbations >= 1 && rc.zo_perturbations <= 64, r.where("optim.zo_perturbations"),
               ": optim.zo_perturbations must be in [1, 64]");
}

// The offload and device keys, and the sizes parsed into bytes.
void check_offload_device(Recipe& rc, const Reader& r) {
  const bool optimizer_nvme = rc.modes.optimizer_tier == StateTier::nvme;
  if (optimizer_nvme || rc.modes.checkpoints == CheckpointMode::nvme)
    STRATA_CHECK(!rc.nvme_path.empty(), r.where(optimizer_nvme ? "offload.optimizer" : "offload.checkpoints"), ": ",
                 optimizer_nvme ? "offload.optimizer" : "offload.checkpoints",
                 " = \"nvme\" needs offload.nvme_path: set it to a directory on a fast local disk");
  if (!rc.nvme_memory.empty())
    rc.nvme_memory_bytes = parse_bytes(rc.nvme_memory, r.where("offload.nvme_memory") + ": offload.nvme_memory");
  STRATA_CHECK(rc.offload_resident_layers >= -1, r.where("offload.resident_layers"),
               ": offload.resident_layers must be >= 0 (layers), or -1 for the planner's choice");
  STRATA_CHECK(rc.offload_resident_layers < 0 || rc.modes.weights != WeightsMode::device, r.where("offload.resident_layers"),
               ": offload.weights = \"device\" keeps every layer resident; offload.resident_layers applies to streamed "
               "weights: set offload.weights = \"stream\" or \"auto\", or remove offload.resident_layers");
  STRATA_CHECK(rc.offload_resident_layers <= 0 || rc.modes.optimizer != OptimizerKind::zo_sgd, r.where("offload.resident_layers"),
               ": optim.type = \"zo-sgd\" always streams its weights (they change every step); remove offload.resident_layers");
  STRATA_CHECK(rc.device_cpu_threads >= 0, r.where("device.cpu_threads"), ": device.cpu_threads must be >= 0");
  STRATA_CHECK(rc.save_steps >= 0, r.where("checkpoint.save_steps"), ": checkpoint.save_steps must be >= 0");
  if (!rc.host_memory.empty())
    rc.host_memory_bytes = parse_bytes(rc.host_memory, r.where("offload.host_memory") + ": offload.host_memory");
  rc.device_memory_bytes = parse_bytes(rc.device_memory, r.where("device.memory") + ": device.memory");
  if (!rc.device_link_bandwidth.empty())
    rc.device_link_bytes_per_s =
        parse_bandwidth(rc.device_link_bandwidth, r.where("device.link_bandwidth") + ": device.link_bandwidth");
}

// Every mode key of a read recipe, typed (src/recipe/recipe_modes.h), once; bad text is
// Error(input) at the key's place: `key must be "a", "b" or "c" (not "x")`.
RecipeModes recipe_modes_parse(const Recipe& t, const Reader& r) {
  auto where = [&r](const char* key) { return r.where(key); };
  RecipeModes m;
  m.optimizer = mode_parse<OptimizerKind>(t.optim_type, where("optim.type"));
  if (t.objective != "sft" && t.objective != "grpo") m.preference = mode_parse<PreferenceObjective>(t.objective, where("train.objective"));
  m.weights = mode_parse<WeightsMode>(t.offload_weights, where("offload.weights"));
  m.checkpoints = mode_parse<CheckpointMode>(t.offload_checkpoints, where("offload.checkpoints"));
  m.recompute = mode_parse<RecomputeMode>(t.offload_recompute, where("offload.recompute"));
  m.optimizer_tier = mode_parse<StateTier>(t.offload_optimizer, where("offload.optimizer"));
  m.accumulation = mode_parse<AccumulationMode>(t.offload_accumulation, where("offload.accumulation"));
  m.speculate = mode_parse<SpeculateMode>(t.offload_speculative_update, where("offload.speculative_update"));
  m.working = mode_parse<WorkingMode>(t.offload_working_weights, where("offload.working_weights"));
  m.norm_pass = mode_parse<NormPassMode>(t.offload_norm_pass, where("offload.norm_pass"));
  m.device = mode_parse<DeviceBackend>(t.device_backend, where("device.backend"));
  m.distributed = mode_parse<CommBackend>(t.distributed_backend, where("distributed.backend"));
  m.shared_host_store = mode_parse<Toggle>(t.distributed_shared_host_store, where("distributed.shared_host_store"));
  m.zo = mode_parse<ZoParallelMode>(t.distributed_zo, where("distributed.zo"));
  m.lr_schedule = mode_parse<LrSchedule>(t.lr_scheduler_type, where("optim.lr_scheduler_type"));
  return m;
}

}  // namespace

Recipe recipe_parse(const std::string& text, const std::string& origin,
                    const std::vector<std::string>& overrides) {
  const Reader r = reader_from(text, origin, overrides);
  Recipe rc;
  rc.source_path = origin;
  read_keys(rc, r);
  read_dependent(rc, r);
  rc.modes = recipe_modes_parse(rc, r);  // the mode keys, typed, once
  rc.modes.drop_overlong = rc.overlong == "drop";
  make_paths_absolute(rc, r);
  check_model_data_train(rc, r);
  check_lora(rc, r);
  check_grpo(rc, r);
  check_distributed(rc, r);
  check_train_optim(rc, r);
  check_offload_device(rc, r);
  return rc;
}

Recipe recipe_load(const std::string& path, const std::vector<std::string>& overrides) {
  return recipe_parse(file_read(path, "recipe", "check the path", ErrorKind::input), path, overrides);
}

namespace {

// Whether to_toml leaves key k out: an unset key whose default is unset, model.config's init keys
// without model.config, [preference] under sft and [lora] with LoRA off (a table left empty is
// left out whole).
bool toml_leaves_out(const Recipe& rc, const RecipeKey& k) {
  const std::string_view name = k.name;
  if (name.rfind("preference.", 0) == 0) return rc.objective == "sft" || rc.objective == "grpo";
  if (name.rfind("grpo.", 0) == 0) return rc.objective != "grpo";
  if (name.rfind("lora.", 0) == 0 && !rc.lora_enabled) return true;
  if (name.rfind("model.init_", 0) == 0) return rc.model_config.empty();
  auto* text = std::get_if<std::string Recipe::*>(&k.field);
  return *k.fallback == '\0' && text && (rc.**text).empty();
}

// toml_write: a member's value as TOML (floats as `ostream <<` writes them: 6 significant digits).
void toml_write(std::ostream& os, const RecipeKey& k, const std::string& v) {
  if ((is_key(k, "distributed.shared_host_store") || is_key(k, "train.router_aux_loss")) && v != "auto")
    os << v;  // true | false, unquoted
  else {
    os << '"';
    for (char ch : v) os << (ch == '"' || ch == '\\' ? "\\" : "") << ch;  // TOML basic string escapes
    os << '"';
  }
}
void toml_write(std::ostream& os, const RecipeKey&, int64_t v) { os << v; }
void toml_write(std::ostream& os, const RecipeKey&, double v) { os << v; }
void toml_write(std::ostream& os, const RecipeKey&, bool v) { os << (v ? "true" : "false"); }
void toml_write(std::ostream& os, const RecipeKey&, const std::vector<double>& v) {
  os << '[';
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << ']';
}
void toml_write(std::ostream& os, const RecipeKey&, const std::vector<std::string>& v) {
  os << '[';
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << '"' << v[i] << '"';
  os << ']';
}

}  // namespace

std::string Recipe::to_toml() const {
  std::ostringstream os;
  std::string_view section;
  for (const RecipeKey& k : recipe_schema()) {
    if (toml_leaves_out(*this, k)) continue;
    const std::string_view name = k.name, key_section = name.substr(0, name.find('.'));
    if (key_section != section) os << (section.empty() ? "" : "\n") << '[' << key_section << "]\n";
    section = key_section;
    os << name.substr(key_section.size() + 1) << " = ";
    std::visit([&](auto member) { toml_write(os, k, this->*member); }, k.field);
    os << '\n';
  }
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
