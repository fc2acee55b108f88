// The placement plan against the real process: `strata train` runs as a child on models big
// enough that the plan's states dominate (58M parameters: ~1 GiB of host state), streamed and
// resident, f32 and bf16, initialised and loaded from a model dir, each saving a checkpoint at
// its last step and exporting final/, and one resuming from its checkpoint. The child's peak resident set (wait4's ru_maxrss, which
// covers the export after the last metrics record too) must stay within the plan's host total
// (host + host_pinned, plan.json) + 5%, and the plan must not be more than 5% above it either.
// metrics.jsonl's host_rss_peak_bytes (VmHWM per step) is checked to be the same measure.
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/testing.h"
#include "tests/train/estimate_configs.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

struct ChildRun {
  int code = -1;
  size_t max_rss_bytes = 0;  // ru_maxrss of the child alone
  size_t nvme_peak_bytes = 0;  // the most disk space the files under `watch` held at once
  std::string log;
};

// The disk space the files under `dir` hold (allocated blocks, as fallocate reserves them).
size_t allocated_bytes(const fs::path& dir) {
  size_t bytes = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    struct stat st {};
    if (::lstat(it->path().c_str(), &st) == 0 && S_ISREG(st.st_mode)) bytes += size_t(st.st_blocks) * 512;
  }
  return bytes;
}

// `strata train ARGS...` as a child; its own rusage from wait4 (not RUSAGE_CHILDREN, which
// is the largest child this test process ever had). With `watch`, the space its files there
// take is sampled every 5 ms while it runs (the run's NVMe folder lives only as long as the run).
ChildRun run_train(const std::vector<std::string>& args, const std::string& log_path, const std::string& watch = "") {
  ChildRun r;
  const std::string bin = testing::strata_binary();
  std::vector<std::string> argv_s = {bin, "train"};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    FILE* f = std::fopen(log_path.c_str(), "w");
    if (f) dup2(fileno(f), 2);
    execv(bin.c_str(), argv.data());
    _exit(127);
  }
  int status = 0;
  struct rusage ru {};
  for (;;) {
    const pid_t done = wait4(pid, &status, watch.empty() ? 0 : WNOHANG, &ru);
    REQUIRE(done >= 0);
    if (done == pid) break;
    r.nvme_peak_bytes = std::max(r.nvme_peak_bytes, allocated_bytes(watch));
    usleep(5000);
  }
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.max_rss_bytes = size_t(ru.ru_maxrss) * 1024;  // KiB on Linux
  std::ifstream in(log_path);
  r.log.assign(std::istreambuf_iterator<char>(in), {});
  return r;
}

std::string tmp_dir(const std::string& name) {
  // one root per test process: test runs of other checkouts on the machine use the same names
  const fs::path d = fs::temp_directory_path() / ("strata_plan_rss-" + std::to_string(getpid())) / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

}  // namespace

TEST_CASE("a run's peak resident set is its plan's host total within 5%, saving and export included", "[plan-rss]") {
  const std::string root = tmp_dir("runs");
  // 8 layers of C 512, F 1408, V 32000, untied: 58.5M parameters
  const nlohmann::json cfg = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"},
                              {"hidden_size", 512}, {"intermediate_size", 1408}, {"num_hidden_layers", 8},
                              {"num_attention_heads", 8}, {"num_key_value_heads", 4}, {"vocab_size", 32000},
                              {"max_position_embeddings", 512}, {"tie_word_embeddings", false},
                              {"rms_norm_eps", 1e-5}};
  std::ofstream(root + "/config.json") << cfg.dump(1);
  const std::string corpus = testing::source_path("recipes/quickstart/corpus.txt");
  {
    std::ofstream r(root + "/recipe.toml");
    r << "[model]\nconfig = \"config.json\"\ninit_seed = 3\n[data]\npath = \"" << corpus
      << "\"\nsequence_len = 32\npacking = true\ntokenizer = \"bytes\"\n[train]\nmax_steps = 2\nmicro_batch_size = 2\n"
         "seed = 1\n[optim]\nlearning_rate = 1e-4\n[device]\nbackend = \"cpu\"\nmemory = \"512MiB\"\n"
         "[checkpoint]\nsave_steps = 2\n";
  }
  struct Config {
    std::string name;
    std::vector<std::string> overrides;
    bool resume = false;  // continue the run in output_dir (checkpoint_load's buffers)
  };
  const std::vector<Config> configs = {
      {"stream-f32", {"model.dtype=f32", "offload.weights=stream"}},
      {"device-bf16", {"model.dtype=bf16", "offload.weights=device", "offload.checkpoints=host"}},
      {"stream-bf16-f32export", {"model.dtype=bf16", "offload.weights=stream", "checkpoint.save_dtype=f32"}},
      // loads the first run's export (a model dir) instead of initialising
      {"load-device-f32", {"model.dtype=f32", "offload.weights=device", "model.path=" + root + "/stream-f32/final",
                           "model.config="}},
      // resumes the first run from its checkpoint-2 for a third step
      {"stream-f32", {"model.dtype=f32", "offload.weights=stream", "train.max_steps=3"}, true},
  };
  for (const Config& c : configs) {
    const std::string out = root + "/" + c.name;
    std::vector<std::string> args = {root + "/recipe.toml", "checkpoint.output_dir=" + out};
    args.insert(args.end(), c.overrides.begin(), c.overrides.end());
    std::vector<std::string> train_args = args;
    if (c.resume) train_args.insert(train_args.end(), {"--resume", "auto"});
    const ChildRun r = run_train(train_args, root + "/" + c.name + (c.resume ? "-resume" : "") + ".log");
    INFO(c.name << "\n" << r.log.substr(r.log.size() > 6000 ? r.log.size() - 6000 : 0));
    REQUIRE(r.code == 0);
    const nlohmann::json plan = nlohmann::json::parse(std::ifstream(out + "/plan.json"));
    const size_t planned = plan["tiers"]["host"].get<size_t>() + plan["tiers"]["host_pinned"].get<size_t>();
    size_t metrics_peak = 0;
    std::ifstream m(out + "/metrics.jsonl");
    for (std::string line; std::getline(m, line);) {
      const nlohmann::json j = nlohmann::json::parse(line);
      if (j.contains("host_rss_peak_bytes")) metrics_peak = std::max(metrics_peak, j["host_rss_peak_bytes"].get<size_t>());
    }
    const double ratio = double(r.max_rss_bytes) / double(planned);
    std::printf("plan-rss %-22s%s plan %8.1f MiB  peak RSS %8.1f MiB (metrics %8.1f MiB)  peak/plan %.4f\n",
                c.name.c_str(), c.resume ? " (resumed)" : "", double(planned) / 1048576, double(r.max_rss_bytes) / 1048576,
                double(metrics_peak) / 1048576, ratio);
    CHECK(planned > (size_t(900) << 20));      // the plan's states dominate the process
    CHECK(metrics_peak > 0);
    CHECK(metrics_peak <= r.max_rss_bytes);     // the same measure, read before the export
    CHECK(r.max_rss_bytes <= planned * 1.05);   // never above the plan by more than 5%
    CHECK(r.max_rss_bytes >= planned * 0.95);   // and the plan not more than 5% above the run

    // `strata estimate` on the same recipe: the same plan without running anything (issue 13)
    std::string cmd = "estimate";
    for (const std::string& a : args) cmd += " '" + a + "'";
    const testing::ProcessResult est = testing::run_strata(cmd + (c.resume ? " --resume" : "") + " --json", true);
    INFO(est.out);
    REQUIRE(est.code == 0);
    const nlohmann::json e = nlohmann::json::parse(est.out);
    size_t device_peak = 0;
    std::ifstream m2(out + "/metrics.jsonl");
    for (std::string line; std::getline(m2, line);) {
      const nlohmann::json j = nlohmann::json::parse(line);
      if (j.contains("device_peak_bytes")) device_peak = std::max(device_peak, j["device_peak_bytes"].get<size_t>());
    }
    const size_t est_host = e["tiers"]["host"].get<size_t>() + e["tiers"]["host_pinned"].get<size_t>();
    std::printf("plan-rss %-22s estimate: device %zu (run's peak %zu), host %8.1f MiB (peak/estimate %.4f)\n",
                c.name.c_str(), e["tiers"]["device"].get<size_t>(), device_peak, double(est_host) / 1048576,
                double(r.max_rss_bytes) / double(est_host));
    CHECK(e["fits"] == true);
    CHECK(e["tiers"]["device"].get<size_t>() == device_peak);
    CHECK(e["tiers"]["host_pinned"] == plan["tiers"]["host_pinned"]);
    CHECK(r.max_rss_bytes <= est_host * 1.05);
    CHECK(r.max_rss_bytes >= est_host * 0.95);
  }
  fs::remove_all(fs::path(root).parent_path());
}

}  // namespace strata

namespace strata {
namespace {

// A figure the estimate predicts beside what the run measured, printed as a row of the
// validation table (README, "strata estimate").
void print_figure(const std::string& figure, const std::string& config, double estimated, double measured) {
  const double error = measured != 0 ? (estimated - measured) / measured : (estimated == 0 ? 0 : 1);
  std::printf("estimate-validation | %-22s | %-28s | %14.0f | %14.0f | %+8.4f%% |\n", figure.c_str(), config.c_str(),
              estimated, measured, 100 * error);
}

}  // namespace

// The estimator against real runs (issue 13): `strata train` on the CPU backend for configurations
// that cover streamed and resident weights, checkpoints on the device, pinned host and NVMe, the
// optimizer state on NVMe, gradient accumulation and a throttled link, on two shape families
// (Llama with tied embeddings; Qwen3 with q/k norm and head_dim != hidden / heads). Then `strata
// estimate --json` on the same recipe. Device peak and pinned host bytes must be equal, peak RSS
// and the NVMe space the run's files took within 5%, and the bytes every step moved over the link
// and to and from NVMe (metrics.jsonl) equal to the estimate's per-step bytes. Step time:
// tests/train/test_estimate_step.cpp.
TEST_CASE("strata estimate against real runs: device, host, NVMe and the bytes each step moves", "[plan-rss][estimate-validation]") {
  const std::string root = tmp_dir("validation");
  constexpr int kSteps = 2;
  const std::string nvme = (fs::temp_directory_path() / ("strata_estimate_nvme-" + std::to_string(getpid()))).string();
  fs::remove_all(nvme);
  fs::create_directories(nvme);
  // llama: 8 layers of C 512, F 1408, 8 heads / 4 kv, V 32000 tied (40M parameters); the states
  // (~0.7 GiB of host memory) dominate the process, as in a real run
  std::ofstream(root + "/llama.json") << nlohmann::json{
      {"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"hidden_size", 512},
      {"intermediate_size", 1408}, {"num_hidden_layers", 8}, {"num_attention_heads", 8},
      {"num_key_value_heads", 4}, {"vocab_size", 32000}, {"max_position_embeddings", 256},
      {"tie_word_embeddings", true}, {"rms_norm_eps", 1e-5}}.dump(1);
  // qwen3: 6 layers of C 448, F 1280, 4 heads / 2 kv of head_dim 128, V 32000 untied (43M; q/k norms)
  std::ofstream(root + "/qwen3.json") << nlohmann::json{
      {"architectures", {"Qwen3ForCausalLM"}}, {"model_type", "qwen3"}, {"hidden_size", 448},
      {"intermediate_size", 1280}, {"num_hidden_layers", 6}, {"num_attention_heads", 4}, {"head_dim", 128},
      {"num_key_value_heads", 2}, {"vocab_size", 32000}, {"max_position_embeddings", 256},
      {"tie_word_embeddings", false}, {"rms_norm_eps", 1e-6}}.dump(1);
  {
    std::ofstream r(root + "/recipe.toml");
    r << "[model]\nconfig = \"llama.json\"\ninit_seed = 3\n[data]\npath = \""
      << testing::source_path("recipes/quickstart/corpus.txt")
      << "\"\nsequence_len = 32\npacking = true\ntokenizer = \"bytes\"\n[train]\nmax_steps = " << kSteps
      << "\nmicro_batch_size = 2\nseed = 1\n[optim]\nlearning_rate = 1e-4\n[device]\nbackend = \"cpu\"\n"
         "memory = \"512MiB\"\n[checkpoint]\nsave_steps = 100\n";
  }
  const std::string on_nvme = "offload.nvme_path=" + nvme;
  using Config = testing::EstimateConfig;
  std::vector<Config> configs = testing::estimate_validation_configs(root + "/qwen3.json", nvme);
  configs.insert(configs.end(), {
      // a device budget that holds 3 of the 6 layer inputs: "auto" spills the other 3 to pinned host
      {"qwen3 resident bf16 ckpt=auto optim=nvme",
       {"model.config=" + root + "/qwen3.json", "model.dtype=bf16", "offload.weights=device", "offload.optimizer=nvme", on_nvme,
        "device.memory=\"97729104\""}},
      // the first 3 of 6 layers resident, the rest streamed (offload.resident_layers), layer-major over 2
      {"qwen3 stream bf16 resident=3 accum 2",
       {"model.config=" + root + "/qwen3.json", "model.dtype=bf16", "offload.weights=stream", "offload.resident_layers=3",
        "train.gradient_accumulation_steps=2", "offload.accumulation=layer_major"}},
      // bf16 AdamW moments (optim.moments_dtype): in RAM, and on NVMe with the master
      {"llama stream bf16 moments=bf16", {"model.dtype=bf16", "offload.weights=stream", "offload.checkpoints=host", "optim.moments_dtype=bf16"}},
      {"qwen3 stream bf16 moments=bf16 optim=nvme",
       {"model.config=" + root + "/qwen3.json", "model.dtype=bf16", "offload.weights=stream", "offload.optimizer=nvme",
        on_nvme, "optim.moments_dtype=bf16"}},
  });
  std::printf("estimate-validation | figure | configuration | estimated | measured | error |\n");
  for (const Config& c : configs) {
    const std::string out = root + "/run";
    fs::remove_all(out);
    std::vector<std::string> args = {root + "/recipe.toml", "checkpoint.output_dir=" + out};
    args.insert(args.end(), c.overrides.begin(), c.overrides.end());
    const ChildRun r = run_train(args, root + "/train.log", nvme);
    INFO(c.name << "\n" << r.log.substr(r.log.size() > 6000 ? r.log.size() - 6000 : 0));
    REQUIRE(r.code == 0);
    CHECK(fs::is_empty(nvme));  // the run's NVMe folder went with it

    std::string cmd = "estimate";
    for (const std::string& a : args) cmd += " '" + a + "'";
    const testing::ProcessResult est = testing::run_strata(cmd + " --json", true);
    INFO(est.out);
    REQUIRE(est.code == 0);
    const nlohmann::json e = nlohmann::json::parse(est.out);
    const nlohmann::json& bytes = e["step"]["bytes"];

    size_t device_peak = 0, pinned = 0;
    int steps = 0;
    double nvme_read = 0, nvme_write = 0;
    std::ifstream m(out + "/metrics.jsonl");
    for (std::string line; std::getline(m, line);) {
      const nlohmann::json j = nlohmann::json::parse(line);
      if (!j.contains("link_bytes")) continue;
      ++steps;
      INFO("step " << j["step"]);
      device_peak = std::max(device_peak, j["device_peak_bytes"].get<size_t>());
      pinned = std::max(pinned, j["host_pinned_bytes"].get<size_t>());
      CHECK(j["link_bytes"].get<double>() == bytes["link"].get<double>());
      if (steps == 2) print_figure("link bytes / step", c.name, bytes["link"], j["link_bytes"]);
      nvme_read += j["nvme_read_bytes"].get<double>();
      nvme_write += j["nvme_write_bytes"].get<double>();
    }
    CHECK(steps == kSteps);
    // a step's optimizer pass over NVMe overlaps the next step's forward, so its bytes land in
    // the next step's record (the last step's in its own, the run draining): the run's sum is exact
    CHECK(nvme_read == kSteps * bytes["nvme_read"].get<double>());
    CHECK(nvme_write == kSteps * bytes["nvme_write"].get<double>());
    print_figure("NVMe read bytes / step", c.name, bytes["nvme_read"], nvme_read / kSteps);
    print_figure("NVMe write bytes / step", c.name, bytes["nvme_write"], nvme_write / kSteps);
    const double est_host = e["tiers"]["host"].get<double>() + e["tiers"]["host_pinned"].get<double>();
    const double est_nvme = e["tiers"]["nvme"].get<double>();
    print_figure("device peak", c.name, e["tiers"]["device"], double(device_peak));
    print_figure("pinned host", c.name, e["tiers"]["host_pinned"], double(pinned));
    print_figure("host peak RSS", c.name, est_host, double(r.max_rss_bytes));
    print_figure("NVMe allocated", c.name, est_nvme, double(r.nvme_peak_bytes));
    CHECK(e["fits"] == true);
    if (c.name.find("ckpt=auto") != std::string::npos) {  // split between the device and pinned host
      size_t on_device = 0, on_host = 0;
      for (const auto& st : e["states"]) {
        if (st["kind"] == "layer checkpoints (device)") on_device = st["bytes"].get<size_t>();
        if (st["kind"] == "layer checkpoints (pinned host)") on_host = st["bytes"].get<size_t>();
      }
      CHECK(on_device > 0);
      CHECK(on_host > 0);
    }
    CHECK(e["tiers"]["device"].get<size_t>() == device_peak);
    CHECK(e["tiers"]["host_pinned"].get<size_t>() == pinned);
    CHECK(double(r.max_rss_bytes) <= est_host * 1.05);
    CHECK(double(r.max_rss_bytes) >= est_host * 0.95);
    CHECK(double(r.nvme_peak_bytes) <= est_nvme * 1.05);
    CHECK(double(r.nvme_peak_bytes) >= est_nvme * 0.95);
  }
  fs::remove_all(nvme);
  fs::remove_all(fs::path(root).parent_path());
}

}  // namespace strata
