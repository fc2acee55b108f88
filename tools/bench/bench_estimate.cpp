// strata-bench estimate: the step time `strata estimate` predicts against the step time `strata
// train` measures, on this host's CPU backend, for the configurations the validation tests
// (tests/train/test_plan_rss.cpp: bytes; tests/train/test_estimate_step.cpp: step time) check, at
// sizes where a step is compute, not overhead: streamed and resident weights, checkpoints on the
// device, pinned host and NVMe, the optimizer state on NVMe, gradient accumulation, a throttled
// link; a Llama (tied embeddings) and a Qwen3 (q/k norm) shape. Two estimates per run:
// independent (`--measure` right before the run: a layer and an lm_head chunk at the model's
// shapes, AdamW, memcpy, NVMe, each the median of its rounds) and calibrated (`--rates-from` the
// run: the device's rates from the run's median step by device time, the host's measured right
// after). Measured: the median step after the first (save time excluded), and the calibrating
// step itself. Wall time on a shared machine is noise, so this is a benchmark; the test asserts
// the calibrated figure.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "src/core/cli_args.h"
#include "src/core/error.h"
#include "tools/bench/bench_util.h"

namespace strata::bench {

namespace {

namespace fs = std::filesystem;

struct EstimateConfig {
  std::string name, model;  // model: "llama" | "qwen3"
  std::vector<std::string> overrides;
};

nlohmann::json bench_model(const std::string& family) {
  if (family == "llama")  // 8 layers of C 512, F 1408, V 32000 tied: 45M parameters
    return {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"hidden_size", 512},
            {"intermediate_size", 1408}, {"num_hidden_layers", 8}, {"num_attention_heads", 8},
            {"num_key_value_heads", 4}, {"vocab_size", 32000}, {"max_position_embeddings", 1024},
            {"tie_word_embeddings", true}, {"rms_norm_eps", 1e-5}};
  // 6 layers of C 448, F 1280, 4 heads of head_dim 128 / 2 kv, V 32000 untied: 45M parameters
  return {{"architectures", {"Qwen3ForCausalLM"}}, {"model_type", "qwen3"}, {"hidden_size", 448},
          {"intermediate_size", 1280}, {"num_hidden_layers", 6}, {"num_attention_heads", 4}, {"head_dim", 128},
          {"num_key_value_heads", 2}, {"vocab_size", 32000}, {"max_position_embeddings", 1024},
          {"tie_word_embeddings", false}, {"rms_norm_eps", 1e-6}};
}

std::vector<EstimateConfig> bench_configs(const std::string& nvme) {
  const std::string on_nvme = "offload.nvme_path=" + nvme;
  return {
      {"llama stream f32 ckpt=device", "llama", {"model.dtype=f32", "offload.checkpoints=device"}},
      {"llama resident bf16 ckpt=host accum 2", "llama",
       {"model.dtype=bf16", "offload.weights=device", "offload.checkpoints=host", "train.gradient_accumulation_steps=2"}},
      {"llama stream bf16 nvme ckpt+optim link 2GB/s", "llama",
       {"model.dtype=bf16", "offload.checkpoints=nvme", "offload.optimizer=nvme", on_nvme, "device.link_bandwidth=2GB/s"}},
      {"qwen3 stream bf16 ckpt=host accum 3 link 1GB/s", "qwen3",
       {"model.dtype=bf16", "offload.checkpoints=host", "train.gradient_accumulation_steps=3",
        "device.link_bandwidth=1GB/s"}},
      {"qwen3 stream f32 ckpt=nvme optim=nvme accum 2", "qwen3",
       {"model.dtype=f32", "offload.checkpoints=nvme", "offload.optimizer=nvme", on_nvme,
        "train.gradient_accumulation_steps=2"}},
      {"qwen3 resident bf16 optim=nvme", "qwen3",
       {"model.dtype=bf16", "offload.weights=device", "offload.optimizer=nvme", on_nvme}},
  };
}

}  // namespace

int bench_estimate(const std::vector<std::string>& args) {
  CLI::App app{"strata estimate's step time against strata train's on this host (CPU backend)",
               "strata-bench estimate"};
  int steps = 5;
  int64_t sequence_len = 128, micro_batch = 2;
  std::string only, nvme = (fs::temp_directory_path() / "strata_bench_estimate_nvme").string(), keep;
  app.add_option("--steps", steps, "training steps per configuration (the first is not timed)")->check(CLI::Range(2, 1000));
  app.add_option("--sequence-len", sequence_len, "data.sequence_len");
  app.add_option("--micro-batch", micro_batch, "train.micro_batch_size");
  app.add_option("--config", only, "run only the configurations whose name contains this");
  app.add_option("--nvme-path", nvme, "a directory on the NVMe drive (its files are removed after each run)");
  app.add_option("--keep", keep, "keep the run folders under this directory");
  int rc = 0;
  if (!parse_args(app, args, &rc)) return rc;
  std::error_code ec;
  const fs::path strata = fs::read_symlink("/proc/self/exe", ec).parent_path() / "strata";
  STRATA_CHECK(fs::exists(strata, ec), strata.string(), " is missing: build the strata target first");
  const fs::path root = keep.empty() ? fs::temp_directory_path() / "strata_bench_estimate" : fs::path(keep);
  fs::remove_all(root, ec);
  fs::create_directories(root);
  fs::create_directories(nvme);
  for (const char* family : {"llama", "qwen3"}) std::ofstream(root / (std::string(family) + ".json")) << bench_model(family).dump(1);
  {
    std::ofstream r(root / "recipe.toml");
    r << "[model]\nconfig = \"llama.json\"\ninit_seed = 3\n[data]\npath = \""
      << (fs::path(STRATA_SOURCE_DIR) / "recipes/quickstart/corpus.txt").string() << "\"\nsequence_len = " << sequence_len
      << "\npacking = true\ntokenizer = \"bytes\"\n[train]\nmax_steps = " << steps << "\nmicro_batch_size = " << micro_batch
      << "\nseed = 1\nlog_steps = 1000\n[optim]\nlearning_rate = 1e-4\n[device]\nbackend = \"cpu\"\nmemory = \"2GiB\"\n"
         "[checkpoint]\nsave_steps = 100000\n";
  }
  std::printf("%-46s %9s %9s %9s %9s %9s %9s %9s  %-10s  %s\n", "configuration", "median s", "indep. s", "meas/ind",
              "calib. s", "its step", "step/cal", "meas/cal", "bottleneck",
              "calibrated estimate's components | the run's split (compute, optimizer, h2d wait, d2h wait, nvme wait)");
  nlohmann::json rows = nlohmann::json::array();
  std::vector<double> errors, independent_errors;
  for (const EstimateConfig& c : bench_configs(nvme)) {
    if (!only.empty() && c.name.find(only) == std::string::npos) continue;
    const fs::path out = root / ("run" + std::to_string(rows.size()));
    std::string common = " '" + (root / "recipe.toml").string() + "' 'checkpoint.output_dir=" + out.string() +
                         "' 'model.config=" + (root / (c.model + ".json")).string() + "'";
    for (const std::string& o : c.overrides) common += " '" + o + "'";
    auto estimate = [&](const std::string& extra) {
      int status = 0;
      const std::string text = bench_run_capture(strata.string() + " estimate" + common + extra + " --json", &status);
      STRATA_CHECK(status == 0, "strata estimate failed for ", c.name, ":\n", text);
      return nlohmann::json::parse(text);
    };
    const nlohmann::json ind = estimate(" --measure");
    const std::string log = (root / ("train" + std::to_string(rows.size()) + ".log")).string();
    int status = 0;
    bench_run_capture(strata.string() + " train" + common + " >/dev/null 2>'" + log + "'", &status);
    STRATA_CHECK(status == 0, "strata train failed for ", c.name, ": see ", log);
    const nlohmann::json cal = estimate(" --measure --rates-from '" + out.string() + "'");
    std::vector<double> step_s;
    double split[5] = {}, calibrating_step = NAN;
    const char* split_keys[5] = {"compute_s", "optimizer_s", "h2d_wait_s", "d2h_wait_s", "nvme_wait_s"};
    std::ifstream m(out / "metrics.jsonl");
    for (std::string line; std::getline(m, line);) {
      const nlohmann::json j = nlohmann::json::parse(line);
      if (!j.contains("step_s") || j["step"].get<int64_t>() < 2) continue;
      step_s.push_back(j["step_s"].get<double>() - j["save_s"].get<double>());
      if (j["step"] == cal["step"]["rates_from_step"]) calibrating_step = step_s.back();
      for (int k = 0; k < 5; ++k) split[k] += j[split_keys[k]].get<double>() / double(steps - 1);
    }
    const double measured = bench_median(step_s);
    const double independent = ind["step"]["seconds"].get<double>(), calibrated = cal["step"]["seconds"].get<double>();
    errors.push_back(calibrated / measured - 1);
    independent_errors.push_back(independent / measured - 1);
    std::string components;
    for (auto& [name, s] : cal["step"]["components"].items()) components += name + " " + str_cat(s.get<double>()) + " ";
    std::printf("%-46s %9.3f %9.3f %9.3f %9.3f %9.3f %9.3f %9.3f  %-10s  %s| %.3f %.3f %.3f %.3f %.3f\n", c.name.c_str(),
                measured, independent, measured / independent, calibrated, calibrating_step, calibrating_step / calibrated,
                measured / calibrated,
                cal["step"]["bottleneck"].get<std::string>().c_str(), components.c_str(), split[0], split[1], split[2],
                split[3], split[4]);
    std::fflush(stdout);
    rows.push_back({{"config", c.name}, {"measured_median_s", measured}, {"measured_fastest_s", *std::min_element(step_s.begin(), step_s.end())},
                    {"independent_s", independent}, {"calibrated_s", calibrated}, {"calibrating_step_s", calibrating_step},
                    {"measured_over_independent", measured / independent}, {"measured_over_calibrated", measured / calibrated},
                    {"calibrating_step_over_calibrated", calibrating_step / calibrated},
                    {"independent_rates", ind["step"]["rates"]}, {"calibrated_rates", cal["step"]["rates"]}});
    if (keep.empty()) fs::remove_all(out, ec);
  }
  fs::remove_all(nvme, ec);
  if (keep.empty()) fs::remove_all(root, ec);
  auto worst = [](const std::vector<double>& v) {
    double w = 0;
    for (double x : v) w = std::max(w, std::fabs(x));
    return w;
  };
  std::printf("worst |estimated / measured median - 1| over %zu configurations: calibrated %.1f%%, independent %.1f%%\n",
              errors.size(), 100 * worst(errors), 100 * worst(independent_errors));
  std::printf("%s\n", nlohmann::json{{"estimate", {{"configs", rows}, {"worst_error", worst(errors)},
                                                   {"worst_independent_error", worst(independent_errors)}}}}.dump().c_str());
  return 0;
}

}  // namespace strata::bench
