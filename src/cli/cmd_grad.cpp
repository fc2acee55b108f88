// `strata grad`: loss and d loss / d parameter for one batch, the numerics check users run when
// porting a model. HF causal-LM convention: cross-entropy of logits[:, :-1] against
// labels[:, 1:], mean over positions whose label is not -100. With --objective dpo|ipo|simpo|orpo
// the batch holds preference pairs and the loss is the preference objective's
// (offload/objective/preference_loss.h), printed with the pairs' log-prob sums. With --objective
// grpo the batch holds completions with advantages (src/train/grpo_batch.h) and the loss is
// TRL's GRPO loss of the chosen loss_type (offload/objective/grpo_loss.h).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include "offload/plan/plan_search.h"
#include "io/files.h"
#include "io/safetensors.h"
#include "offload/state/lora.h"
#include "offload/state/nf4_layout.h"
#include "offload/state/model_io.h"
#include "offload/objective/grpo_head.h"
#include "offload/objective/preference_head.h"
#include "offload/plan/run_engines.h"
#include "src/core/cli_args.h"
#include "src/cli/commands.h"
#include "src/core/error.h"
#include "src/recipe/recipe.h"
#include "src/recipe/recipe_modes.h"
#include "src/train/grpo_batch.h"

namespace strata {
namespace {

std::vector<std::vector<int32_t>> read_rows(const nlohmann::json& j, const char* key,
                                            const std::string& path) {
  STRATA_CHECK(j[key].is_array(), path, ": \"", key, "\" must be a list of rows of token ids");
  std::vector<std::vector<int32_t>> rows;
  for (size_t b = 0; b < j[key].size(); ++b) {
    const auto& row = j[key][b];
    STRATA_CHECK(row.is_array(), path, ": ", key, "[", b, "] must be a list of integers");
    std::vector<int32_t> r;
    for (size_t t = 0; t < row.size(); ++t) {
      STRATA_CHECK(row[t].is_number_integer(), path, ": ", key, "[", b, "][", t, "] is not an integer");
      r.push_back(row[t].get<int32_t>());
    }
    rows.push_back(std::move(r));
  }
  return rows;
}

std::vector<double> read_sums(const nlohmann::json& j, const char* key, size_t pairs, const std::string& path) {
  std::vector<double> v;
  if (!j.contains(key) || j[key].is_null()) return v;
  STRATA_CHECK(j[key].is_array() && j[key].size() == pairs, path, ": \"", key, "\" must be a list of ", pairs,
               " numbers (one per pair)");
  for (size_t i = 0; i < pairs; ++i) {
    STRATA_CHECK(j[key][i].is_number(), path, ": ", key, "[", i, "] is not a number");
    v.push_back(j[key][i].get<double>());
  }
  return v;
}

// The preference batch (issue 14's contract): pairs as rows, labels required.
struct PreferenceBatch {
  MicroBatch mb;
  PreferenceLayout layout;
};

PreferenceBatch read_preference_batch(const nlohmann::json& j, const std::string& path) {
  for (const char* key : {"chosen_input_ids", "chosen_labels", "rejected_input_ids", "rejected_labels"})
    STRATA_CHECK(j.contains(key), path, ": a preference batch needs \"", key,
                 "\" (chosen_input_ids, chosen_labels, rejected_input_ids, rejected_labels; ref_chosen_logps and "
                 "ref_rejected_logps optional)");
  PreferenceBatch b;
  b.mb = preference_micro_batch(read_rows(j, "chosen_input_ids", path), read_rows(j, "chosen_labels", path),
                                read_rows(j, "rejected_input_ids", path), read_rows(j, "rejected_labels", path),
                                &b.layout);
  const size_t P = b.layout.chosen.size();
  b.layout.ref_chosen = read_sums(j, "ref_chosen_logps", P, path);
  b.layout.ref_rejected = read_sums(j, "ref_rejected_logps", P, path);
  STRATA_CHECK(b.layout.ref_chosen.size() == b.layout.ref_rejected.size(), path,
               ": give both ref_chosen_logps and ref_rejected_logps, or neither");
  b.layout.totals = preference_layout_totals(b.mb, b.layout);
  return b;
}

nlohmann::json read_batch_json(const std::string& batch_path) {
  const std::string batch_text = file_read(batch_path, "batch file", "check --batch", ErrorKind::input);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(batch_text);
  } catch (const nlohmann::json::parse_error& e) {
    STRATA_CHECK(false, batch_path, " is not valid JSON: ", e.what());
  }
  STRATA_CHECK(j.is_object(), batch_path, " must be a JSON object");
  return j;
}

MicroBatch token_batch(const nlohmann::json& j, const std::string& batch_path) {
  STRATA_CHECK(j.contains("input_ids"), batch_path, " must be an object with \"input_ids\" (or pass --objective "
               "dpo|ipo|simpo|orpo for a preference batch)");
  auto ids = read_rows(j, "input_ids", batch_path);
  std::vector<std::vector<int32_t>> labels;
  if (j.contains("labels") && !j["labels"].is_null()) labels = read_rows(j, "labels", batch_path);
  MicroBatch mb = micro_batch_from_labels(ids, labels);
  STRATA_CHECK(mb.counted() > 0, batch_path, ": every label is -100, so there is no loss to differentiate");
  return mb;
}

// --lora CONFIG.toml and the --lora-* flags (the flags win). LoRA is on when any is given.
struct LoraArgs {
  std::string config, targets, adapter;
  int64_t r = 0;
  double alpha = 0, dropout = -1;  // dropout < 0: not given
  uint64_t seed = 0;
  bool given() const {
    return !config.empty() || r > 0 || alpha > 0 || dropout >= 0 || !targets.empty() || !adapter.empty();
  }
};

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find(',', start), text.size());
    if (end > start) out.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

// The [lora] table of CONFIG.toml (a recipe's, or a file holding just that table): r, alpha,
// dropout, target_modules, target_parameters (a MoE layer's router and experts, PEFT's names),
// adapter (relative to the file); merge is accepted and ignored here.
LoraOptions lora_options_resolve(const LoraArgs& a, std::string* adapter) {
  LoraOptions o;
  o.r = 16;
  o.alpha = 32;
  std::vector<std::string> targets = lora_target_names(kLoraAllTargets), parameters;
  if (!a.config.empty()) {
    toml::table t;
    try {
      t = toml::parse(file_read(a.config, "LoRA config", "check --lora", ErrorKind::input), a.config);
    } catch (const toml::parse_error& e) {
      STRATA_CHECK(false, a.config, ":", e.source().begin.line, ": invalid TOML: ", e.description());
    }
    const toml::table* lt = t["lora"].as_table();
    STRATA_CHECK(lt, a.config, " has no [lora] table; give r, alpha, target_modules (and adapter) under [lora]");
    for (auto&& [k, v] : *lt) {
      const std::string key(k.str());
      if (key == "r") {
        STRATA_CHECK(v.is_integer(), a.config, ": lora.r must be an integer");
        o.r = v.as_integer()->get();
      } else if (key == "alpha") {
        STRATA_CHECK(v.is_number(), a.config, ": lora.alpha must be a number");
        o.alpha = v.is_integer() ? double(v.as_integer()->get()) : v.as_floating_point()->get();
      } else if (key == "dropout") {
        STRATA_CHECK(v.is_number(), a.config, ": lora.dropout must be a number in [0, 1)");
        o.dropout = v.is_integer() ? double(v.as_integer()->get()) : v.as_floating_point()->get();
      } else if (key == "target_modules" || key == "target_parameters") {
        std::vector<std::string>& names = key == "target_modules" ? targets : parameters;
        names.clear();
        if (v.is_string()) names = split_commas(v.as_string()->get());
        else if (const toml::array* arr = v.as_array())
          for (const toml::node& e : *arr) {
            STRATA_CHECK(e.is_string(), a.config, ": lora.", key, " must be a list of strings");
            names.push_back(e.as_string()->get());
          }
      } else if (key == "adapter") {
        STRATA_CHECK(v.is_string(), a.config, ": lora.adapter must be a path");
        *adapter = (std::filesystem::path(a.config).parent_path() / v.as_string()->get()).string();
      } else if (key == "base_dtype") {
        const std::string d = v.is_string() ? v.as_string()->get() : "";
        STRATA_CHECK(d == "auto" || d == "nf4", a.config, ": lora.base_dtype must be \"auto\" (the base in --dtype) or \"nf4\"");
        o.base_nf4 = d == "nf4";
      } else if (key == "double_quant") {
        STRATA_CHECK(v.is_boolean(), a.config, ": lora.double_quant must be true or false");
        o.double_quant = v.as_boolean()->get();
      } else {
        STRATA_CHECK(key == "merge", a.config, ": unknown key lora.", key,
                     " (r, alpha, dropout, target_modules, target_parameters, merge, adapter, base_dtype, double_quant)");
      }
    }
  }
  if (a.r > 0) o.r = a.r;
  if (a.alpha > 0) o.alpha = a.alpha;
  if (a.dropout >= 0) o.dropout = a.dropout;
  o.seed = a.seed;
  if (!a.targets.empty()) targets = split_commas(a.targets);
  if (!a.adapter.empty()) *adapter = a.adapter;
  STRATA_CHECK(o.r >= 1 && o.alpha > 0, "LoRA needs r >= 1 and alpha > 0 (got r ", o.r, ", alpha ", o.alpha, ")");
  STRATA_CHECK(o.dropout >= 0 && o.dropout < 1, "LoRA dropout must be in [0, 1) (got ", o.dropout, ")");
  targets.insert(targets.end(), parameters.begin(), parameters.end());
  o.targets = lora_targets_parse(targets, "--lora-targets");
  return o;
}

// The command line of `strata grad`.
struct GradArgs {
  std::string model_dir, batch_path, out_path, dtype_name = "f32", memory = "4GiB", objective_name = "sft";
  double beta = -1, gamma = 0.5;
  bool beta_given = false;
  LoraArgs lora;
  // --objective grpo
  double epsilon = 0.2, epsilon_high = -1, temperature = 1;
  std::string loss_type = "dapo";
  int64_t max_completion_length = 0;
  bool grpo() const { return objective_name == "grpo"; }
  bool preference() const { return objective_name != "sft" && !grpo(); }
};

// The options of the batch, the model and the preference objective; --beta's, to say if given.
CLI::Option* grad_add_options(CLI::App& app, GradArgs& a) {
  app.add_option("--model", a.model_dir, "Hugging Face model directory (config.json + safetensors)")->required();
  app.add_option("--batch", a.batch_path, "JSON {\"input_ids\": [[...]], \"labels\": [[...]]}; labels optional, -100 ignored; with --objective: {\"chosen_input_ids\", \"chosen_labels\", \"rejected_input_ids\", \"rejected_labels\", \"ref_chosen_logps\"?, \"ref_rejected_logps\"?}")->required();
  app.add_option("--out", a.out_path, "where to write the gradients (safetensors, F32, HF names)")->required();
  app.add_option("--dtype", a.dtype_name, "compute dtype of the weights: f32 or bf16")->check(CLI::IsMember({"f32", "bf16"}));
  app.add_option("--device-memory", a.memory, "device arena budget");
  app.add_option("--objective", a.objective_name,
                 "sft (cross-entropy), or a preference objective over a preference batch: dpo, ipo, simpo, orpo")
      ->check(CLI::IsMember({"sft", "dpo", "ipo", "simpo", "orpo", "grpo"}));
  CLI::Option* beta = app.add_option("--beta", a.beta, "preference beta (default: 0.1 for dpo, ipo, orpo; 2.0 for "
                                     "simpo); grpo: the KL coefficient (default 0: no reference)");
  app.add_option("--gamma", a.gamma, "simpo's target margin gamma (default 0.5)");
  app.add_option("--epsilon", a.epsilon, "grpo: lower clipping bound 1 - epsilon (default 0.2)");
  app.add_option("--epsilon-high", a.epsilon_high, "grpo: upper clipping bound 1 + epsilon_high (default: epsilon)");
  app.add_option("--loss-type", a.loss_type, "grpo: grpo, bnpo, dr_grpo or dapo (default dapo, as TRL)")
      ->check(CLI::IsMember({"grpo", "bnpo", "dr_grpo", "dapo"}));
  app.add_option("--temperature", a.temperature, "grpo: log-probabilities of logits / temperature (default 1)");
  app.add_option("--max-completion-length", a.max_completion_length,
                 "grpo: dr_grpo's denominator per row (required with --loss-type dr_grpo)");
  return beta;
}

void grad_add_lora_options(CLI::App& app, LoraArgs& la) {
  app.add_option("--lora", la.config, "a TOML file with a [lora] table (r, alpha, target_modules, adapter): the base is "
                 "frozen and --out gets the LoRA adapters' gradients only, with PEFT's names");
  app.add_option("--lora-r", la.r, "LoRA rank (default 16; turns LoRA on)");
  app.add_option("--lora-alpha", la.alpha, "LoRA alpha (default 32; turns LoRA on)");
  app.add_option("--lora-targets", la.targets, "comma-separated PEFT module names (default all: q_proj,k_proj,v_proj,"
                 "o_proj,gate_proj,up_proj,down_proj; turns LoRA on)");
  app.add_option("--lora-adapter", la.adapter, "a PEFT adapter dir to take A and B from (default: PEFT's "
                 "initialisation from --lora-seed, where B = 0)");
  app.add_option("--lora-dropout", la.dropout, "LoRA dropout in [0, 1) (default 0; turns LoRA on): the masks of "
                 "step 1, micro-batch 0 of a run seeded with --lora-seed (offload/state/lora.h)");
  app.add_option("--lora-seed", la.seed, "seed of the adapters' initialisation without --lora-adapter, and of the "
                 "dropout masks");
}

// false when the command is not to run (*exit_code: 0 after --help, 2 on bad usage)
bool grad_args_parse(const std::vector<std::string>& args, GradArgs& a, int* exit_code) {
  CLI::App app{"Loss and gradients of one batch, for checking strata's numerics against another implementation",
               "strata grad"};
  CLI::Option* beta = grad_add_options(app, a);
  grad_add_lora_options(app, a.lora);
  if (!parse_args(app, args, exit_code)) return false;
  a.beta_given = beta->count() > 0;
  if (a.grpo()) {
    if (!a.beta_given) a.beta = 0;
    STRATA_CHECK(a.beta >= 0, "--beta must be >= 0 for grpo (got ", a.beta, ")");
    STRATA_CHECK(a.temperature > 0, "--temperature must be > 0 (got ", a.temperature, ")");
    STRATA_CHECK(a.epsilon >= 0 && a.epsilon < 1, "--epsilon must be in [0, 1) (got ", a.epsilon, ")");
    if (a.epsilon_high < 0) a.epsilon_high = a.epsilon;
    STRATA_CHECK(a.loss_type != "dr_grpo" || a.max_completion_length > 0,
                 "--loss-type dr_grpo needs --max-completion-length N (its per-row denominator)");
  } else {
    STRATA_CHECK(!a.beta_given || a.beta > 0, "--beta must be positive (got ", a.beta, ")");
  }
  return true;
}

// The batch: preference pairs with --objective, else token rows (the layout then unused).
PreferenceBatch grad_read_batch(const GradArgs& a) {
  const nlohmann::json j = read_batch_json(a.batch_path);
  PreferenceBatch b;
  if (a.preference()) b = read_preference_batch(j, a.batch_path);
  else b.mb = token_batch(j, a.batch_path);
  STRATA_CHECK(b.mb.counted() > 0, a.batch_path, ": every label is -100, so there is no loss to differentiate");
  return b;
}

// The model with every layer resident, planned for this batch; with LoRA a frozen base and the
// adapters from a PEFT dir or the seed.
struct GradModel {
  CliModel model;
  std::unique_ptr<LoraStore> lora;
};

GradModel grad_load_model(const GradArgs& a, const MicroBatch& mb) {
  PlanInputs in;
  in.weights = WeightsMode::device;
  in.optimizer_kind = OptimizerKind::adamw;
  in.micro_batch = mb.B;
  in.sequence_len = mb.T;
  std::string adapter;
  if (a.lora.given()) in.lora = lora_options_resolve(a.lora, &adapter);
  GradModel m;
  m.model = cli_load_model(a.model_dir, a.dtype_name, a.memory, in);
  if (a.lora.given()) {
    m.lora = std::make_unique<LoraStore>(*m.model.dev, m.model.spec, m.model.plan.lora);
    if (adapter.empty()) m.lora->init(a.lora.seed);
    else m.lora->load_peft(adapter);
  }
  return m;
}

// --objective dpo|ipo|simpo|orpo: the preference head, the engine's loss objective from now on.
PreferenceHead* grad_preference_head(const GradArgs& a, Device& dev, Engine& engine, const PreferenceBatch& b) {
  PreferenceParams params;
  params.objective = preference_objective_parse(a.objective_name);
  params.beta = a.beta_given ? a.beta : preference_default_beta(params.objective);
  params.gamma = a.gamma;
  auto owned = std::make_unique<PreferenceHead>(dev, params, b.mb.B * b.mb.T);
  PreferenceHead* head = owned.get();
  head->set_layout(b.layout);
  engine.set_loss_objective(std::move(owned));
  return head;
}

// --objective grpo: the GRPO head over the batch's layout, the engine's loss objective from now on.
GrpoHead* grad_grpo_head(const GradArgs& a, Device& dev, Engine& engine, const GrpoBatch& b) {
  GrpoParams p;
  p.loss_type = grpo_loss_type_parse(a.loss_type);
  p.beta = a.beta;
  p.epsilon = a.epsilon;
  p.epsilon_high = a.epsilon_high;
  p.temperature = a.temperature;
  p.max_completion_length = a.max_completion_length;
  auto owned = std::make_unique<GrpoHead>(dev, p, b.mb.B * b.mb.T);
  GrpoHead* head = owned.get();
  head->set_layout(b.layout, b.mb);
  engine.set_loss_objective(std::move(owned));
  return head;
}

// --out: every parameter's gradient under its HF name, or with LoRA the adapters' alone.
void grad_write(const std::string& out_path, Engine& engine, HostStore& store, LoraStore* lora) {
  std::vector<TensorToWrite> out;
  std::vector<std::vector<float>> peft;  // the adapters' gradients in PEFT's layout (packed expert B reordered)
  if (lora) {
    engine.lora_collect_grads();
    const LoraLayout& l = lora->layout();
    peft.resize(l.table.size());
    for (size_t i = 0; i < l.table.size(); ++i) {
      const TensorSpec& r = l.table[i];
      peft[i].resize(size_t(r.numel()));
      lora_peft_tensor(l, i, lora->grad() + r.offset / 4, peft[i].data());
      out.push_back(TensorToWrite{r.name, DType::f32, lora_peft_shape(l, i), static_cast<const void*>(peft[i].data())});
    }
  }
  for (size_t i = 0; !lora && i < store.f32_table().size(); ++i) {
    const TensorSpec& r = store.f32_table()[i];
    out.push_back(TensorToWrite{r.name, DType::f32, r.shape, store.grad_of(i)});
  }
  safetensors_write_file(out_path, out);
}

// The printed line: the mean loss and the tokens, or the preference loss and the pairs' sums.
nlohmann::json grad_result(double loss_sum, int64_t counted, const PreferenceHead* head) {
  if (!head) return {{"loss", loss_sum / double(counted)}, {"tokens", counted}};
  std::vector<double> chosen, rejected;
  for (const PreferencePair& p : head->pairs()) chosen.push_back(p.chosen_logp), rejected.push_back(p.rejected_logp);
  return {{"loss", loss_sum}, {"pairs", head->pairs().size()}, {"chosen_logps", chosen}, {"rejected_logps", rejected}};
}

// strata grad --objective grpo: {"loss", "tokens", "clip_ratio", "entropy"} (TRL's clip_ratio/
// region_mean, and the masked mean of the completion tokens' entropies of softmax(logits / T)).
int grad_run_grpo(const GradArgs& a) {
  const GrpoBatch batch = grpo_batch_from_json(read_batch_json(a.batch_path), a.batch_path, a.beta > 0);
  GradModel m = grad_load_model(a, batch.mb);
  Device& dev = *m.model.dev;
  HostStore& store = *m.model.store;
  const std::unique_ptr<Engine> engine = run_plan_engine(dev, store, m.model.plan, m.lora.get());
  const GrpoHead* head = grad_grpo_head(a, dev, *engine, batch);
  GrpoTemperature temperature(store, a.temperature);  // logits / T: the final norm's weight / T
  const double loss = engine->forward_backward(batch.mb, 1.f);  // the head normalises
  engine->synchronize();
  temperature.finish();
  grad_write(a.out_path, *engine, store, m.lora.get());
  const GrpoMetricSums& ms = head->result().metrics;
  nlohmann::json out = {{"loss", loss}, {"tokens", ms.tokens},
                        {"clip_ratio", ms.clip_region / double(std::max<int64_t>(1, ms.tokens))},
                        {"entropy", ms.entropy / double(std::max<int64_t>(1, ms.tokens))}};
  if (a.beta > 0) out["kl"] = ms.kl / double(std::max<int64_t>(1, ms.tokens));
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace

void cli_for_each_stdin_line(const std::function<void(const std::string& line, size_t line_no)>& f) {
  std::string line;
  size_t line_no = 0;
  while (std::getline(std::cin, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") != std::string::npos) f(line, line_no);
  }
}

MicroBatch cli_read_batch(const std::string& batch_path) {
  return token_batch(read_batch_json(batch_path), batch_path);
}

CliModel cli_load_model(const std::string& dir, const std::string& dtype_name, const std::string& memory,
                        const PlanInputs& in) {
  CliModel m;
  m.spec = model_spec_build(hf_config_load(dir), dtype_parse(dtype_name));
  if (in.lora.enabled() && in.lora.base_nf4) nf4_base_enable(m.spec, in.lora.double_quant);
  m.plan = placement_plan(m.spec, in, PlanBudgets{});
  DeviceOptions dopt;
  dopt.memory_bytes = parse_bytes(memory, "--device-memory");
  m.dev = device_create(dopt);
  m.store = run_plan_host_store(*m.dev, m.spec, m.plan);
  model_load_weights(*m.store, dir);
  return m;
}

int cmd_grad(const std::vector<std::string>& args) {
  GradArgs a;
  int rc = 0;
  if (!grad_args_parse(args, a, &rc)) return rc;
  if (a.grpo()) return grad_run_grpo(a);
  const PreferenceBatch batch = grad_read_batch(a);
  const MicroBatch& mb = batch.mb;
  const int64_t counted = mb.counted();
  GradModel m = grad_load_model(a, mb);
  Device& dev = *m.model.dev;
  HostStore& store = *m.model.store;
  const std::unique_ptr<Engine> engine = run_plan_engine(dev, store, m.model.plan, m.lora.get());
  const PreferenceHead* head = a.preference() ? grad_preference_head(a, dev, *engine, batch) : nullptr;
  // cross-entropy: the mean over counted tokens; preference: the head normalises by the pairs
  const double loss_sum = engine->forward_backward(mb, a.preference() ? 1.f : float(1.0 / double(counted)));
  engine->synchronize();
  grad_write(a.out_path, *engine, store, m.lora.get());
  std::printf("%s\n", grad_result(loss_sum, counted, head).dump().c_str());
  return 0;
}

}  // namespace strata
