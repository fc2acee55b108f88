// The placement plan against the real process: `strata train` runs as a child on models big
// enough that the plan's states dominate (58M parameters: ~1 GiB of host state), streamed and
// resident, f32 and bf16, initialised and loaded from a model dir, each saving a checkpoint at
// its last step and exporting final/, and one resuming from its checkpoint. The child's peak resident set (wait4's ru_maxrss, which
// covers the export after the last metrics record too) must stay within the plan's host total
// (host + host_pinned, plan.json) + 5%, and the plan must not be more than 5% above it either.
// metrics.jsonl's host_rss_peak_bytes (VmHWM per step) is checked to be the same measure.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/testing.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

struct ChildRun {
  int code = -1;
  size_t max_rss_bytes = 0;  // ru_maxrss of the child alone
  std::string log;
};

// `strata train ARGS...` as a child; its own rusage from wait4 (not RUSAGE_CHILDREN, which
// is the largest child this test process ever had).
ChildRun run_train(const std::vector<std::string>& args, const std::string& log_path) {
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
  REQUIRE(wait4(pid, &status, 0, &ru) == pid);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.max_rss_bytes = size_t(ru.ru_maxrss) * 1024;  // KiB on Linux
  std::ifstream in(log_path);
  r.log.assign(std::istreambuf_iterator<char>(in), {});
  return r;
}

std::string tmp_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / "strata_plan_rss" / name;
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
  fs::remove_all(root);
}

}  // namespace strata
