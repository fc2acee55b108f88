// `strata estimate`'s command line: its options, the recipe it prices (a file with overrides, or
// --model's config with the defaults) and the plan's inputs and budgets with the options that
// replace the recipe's (estimate.h).
#include <algorithm>
#include <filesystem>

#include "src/cli/estimate.h"
#include "src/core/cli_args.h"
#include "src/core/error.h"
#include "src/core/process_memory.h"
#include "io/hf_config.h"
#include "src/recipe/recipe_modes.h"
#include "src/recipe/recipe_plan.h"

namespace strata {
namespace {

// --model's default shape: a realistic fine-tuning step, not the recipe defaults' 1 x 256 tokens.
constexpr int64_t kModelSequenceLen = 2048;
constexpr int64_t kModelTokensPerStep = 65536;

void estimate_add_device_options(CLI::App& app, EstimateArgs& a) {
  app.add_option("--gpu", a.gpu, "a GPU by name: RTX 3090, RTX 4090, L40S, A100 40GB, A100 80GB, H100 PCIe, "
                                 "H100 SXM, H200, GH200 (its memory, dense peak and link)");
  app.add_option("--gpu-memory", a.gpu_memory, "device memory (a size: 24GiB); with --gpu, instead of its own");
  app.add_option("--gpu-flops", a.gpu_flops, "the device's dense matmul FLOP/s, instead of the table's");
  app.add_option("--link-gbps", a.link_gbps, "host <-> device bandwidth per direction, GB/s");
  app.add_option("--host-memory", a.host_memory, "host RAM budget (a size); default offload.host_memory, else MemAvailable");
  app.add_option("--nvme-path", a.nvme_path, "an NVMe directory for master, moments and checkpoints (nothing is written but --measure's "
                                       "probe); default offload.nvme_path");
  app.add_option("--nvme-memory", a.nvme_memory, "NVMe space strata may use (a size)");
  app.add_option("--optimizer", a.optimizer, "where master and moments go: auto, host or nvme (needs --nvme-path); default offload.optimizer");
}

void estimate_add_rate_options(CLI::App& app, EstimateArgs& a) {
  app.add_option("--nvme-read-gbps", a.nvme_read_gbps, "NVMe sequential read GB/s (default 1.5)");
  app.add_option("--nvme-write-gbps", a.nvme_write_gbps, "NVMe sequential write GB/s (default 2)");
  app.add_option("--adamw-params-per-s", a.adamw_params_per_s, "CPU AdamW parameters per second (default: the host's memory bandwidth over the bytes one update touches)");
  app.add_option("--rates-from", a.rates_from, "on the CPU backend: its GEMM, attention, memory-bound and lm_head rates "
                                             "as a run of this recipe measured them (its output dir or metrics.jsonl: "
                                             "op_s, the median over the steps after the first)");
  app.add_flag("--json", a.json, "print one JSON object instead of the table");
  app.add_flag("--resume", a.resume, "the run resumes from a checkpoint (count what reading it back holds)");
  app.add_flag("--measure", a.measure, "measure this host's CPU AdamW rate, memory bandwidth, on the CPU backend its "
                                       "GEMM, attention, memory-bound and lm_head rates (a layer and an lm_head chunk "
                                       "run at the model's shapes) and, with --nvme-path, the NVMe read and write "
                                       "bandwidth (a 512 MiB file, removed after) instead of the assumed defaults");
}


// Whether one of the "section.key=value" overrides sets `key`.
bool overrides_set(const std::vector<std::string>& overrides, const std::string& key) {
  for (const std::string& o : overrides)
    if (o.compare(0, key.size() + 1, key + "=") == 0) return true;
  return false;
}

// A value as a TOML string, for an override: a path is not always a bare word ("2024", "true").
std::string toml_quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + '"';
}

// --nvme-path and --optimizer as overrides after the user's (they win), so that the recipe's own
// checks see them: offload.optimizer = "nvme" needs offload.nvme_path.
std::vector<std::string> with_command_line_placement(const EstimateArgs& a, std::vector<std::string> overrides) {
  if (!a.nvme_path.empty()) overrides.push_back("offload.nvme_path=" + toml_quoted(a.nvme_path));
  if (!a.optimizer.empty()) overrides.push_back("offload.optimizer=" + toml_quoted(a.optimizer));
  return overrides;
}

// config.json's torch_dtype as strata's compute dtype: bfloat16 and float16 weights train in bf16
// (strata computes in bf16 or f32, not f16), float32 in f32; "" when it says neither.
std::string config_compute_dtype(const ModelConfig& cfg) {
  if (cfg.torch_dtype == "bfloat16" || cfg.torch_dtype == "float16") return "bf16";
  if (cfg.torch_dtype == "float32") return "f32";
  return "";
}

// --model: the config (or the weights' dir) with the recipe defaults, and for what the user left
// unset a run worth pricing rather than the recipe defaults' 1 x 256 tokens: the config's own
// dtype, sequence_len 2048, and about 64k tokens per optimizer step (gradient accumulation over
// micro_batch_size x sequence_len). Each default chosen is listed, for the report's first line.
EstimateRecipe model_recipe(const EstimateArgs& a) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path m = fs::absolute(a.model);
  const bool dir = fs::is_directory(m, ec);
  STRATA_CHECK(dir || fs::is_regular_file(m, ec), "--model ", a.model, " is neither a model directory nor a config.json");
  const bool weights = dir && (fs::exists(m / "model.safetensors.index.json", ec) || fs::exists(m / "model.safetensors", ec));
  const fs::path config = dir ? m / "config.json" : m;
  const std::string model_key = weights ? str_cat("path = ", toml_quoted(m.string()))
                                        : str_cat("config = ", toml_quoted(config.string()));
  // data.path is not read by the estimate; the recipe needs one
  const std::string text = str_cat("[model]\n", model_key, "\n[data]\npath = \"(not read by strata estimate)\"\n");
  EstimateRecipe out{Recipe{}, nlohmann::json::object()};
  std::vector<std::string> defaults;  // before the user's overrides
  const std::string dtype = config_compute_dtype(hf_config_load(config.string()));
  if (!dtype.empty() && !overrides_set(a.overrides, "model.dtype")) {
    defaults.push_back("model.dtype=" + dtype);
    out.model_defaults["model.dtype"] = dtype;
  }
  if (!overrides_set(a.overrides, "data.sequence_len")) {
    defaults.push_back(str_cat("data.sequence_len=", kModelSequenceLen));
    out.model_defaults["data.sequence_len"] = kModelSequenceLen;
  }
  auto parse = [&] {
    std::vector<std::string> all = defaults;
    all.insert(all.end(), a.overrides.begin(), a.overrides.end());
    return recipe_parse(text, "strata estimate --model", with_command_line_placement(a, all));
  };
  out.recipe = parse();
  if (!overrides_set(a.overrides, "train.gradient_accumulation_steps") && !overrides_set(a.overrides, "train.global_batch_size")) {
    const int64_t k = std::max<int64_t>(1, kModelTokensPerStep / (out.recipe.micro_batch_size * out.recipe.sequence_len));
    defaults.push_back(str_cat("train.gradient_accumulation_steps=", k));
    out.model_defaults["train.gradient_accumulation_steps"] = k;
    out.recipe = parse();
  }
  return out;
}
}  // namespace

bool estimate_args_parse(const std::vector<std::string>& args, EstimateArgs& a, int* exit_code) {
  CLI::App app{"Will a run fit, where does every byte go, and how long will a step take (before running it)",
               "strata estimate"};
  app.add_option("recipe", a.recipe_path, "the recipe TOML file (or --model)");
  app.add_option("overrides", a.overrides, "section.key=value overrides, e.g. train.micro_batch_size=4");
  app.add_option("--model", a.model, "a Hugging Face model dir or config.json, priced with the recipe defaults");
  estimate_add_device_options(app, a);
  estimate_add_rate_options(app, a);
  if (!parse_args(app, args, exit_code)) return false;
  if (!a.model.empty() && a.recipe_path.find('=') != std::string::npos) {  // --model takes overrides only
    a.overrides.insert(a.overrides.begin(), a.recipe_path);
    a.recipe_path.clear();
  }
  STRATA_CHECK(a.recipe_path.empty() != a.model.empty(), "give a recipe or --model DIR|config.json (one of them)");
  return true;
}

EstimateRecipe estimate_recipe(const EstimateArgs& a) {
  if (!a.recipe_path.empty())
    return {recipe_load(a.recipe_path, with_command_line_placement(a, a.overrides)), nlohmann::json::object()};
  return model_recipe(a);
}

void estimate_plan_setup(const EstimateArgs& a, const Recipe& recipe, PlanInputs& in, PlanBudgets& budgets) {
  in = recipe_plan_inputs(recipe);
  in.resume = a.resume;
  in.baseline_bytes = process_rss_bytes();  // the same binary and libraries as `strata train`
  budgets = recipe_plan_budgets(recipe);
  if (!a.host_memory.empty()) {
    budgets.host_bytes = parse_bytes(a.host_memory, "--host-memory");
    budgets.host_origin = "--host-memory " + a.host_memory;
  }
  if (!a.nvme_memory.empty()) budgets.nvme_bytes = parse_bytes(a.nvme_memory, "--nvme-memory");
}

}  // namespace strata
