// strata-bench plan: does `auto` pick the fastest plan? On this host's CPU backend, for
// configurations where the choices matter (a host budget that forces spilling, a throttled link,
// an NVMe path, gradient accumulation), `strata train` runs with every "auto" left to the planner
// and with each combination of explicit offload.* overrides that fits, interleaved round by round
// so that the machine's drift hits them alike; the median step after the first of each is
// compared: auto against the fastest forced one whose plan differs from auto's. A forced
// combination whose runs took auto's own plan (the same states in the run's plan.json) is set
// apart: it and auto's second run of each round (auto runs first and last in a round) show the
// noise floor, what two runs of one plan differ by. Beside it, what
// `strata estimate --measure` predicted for auto's plan (run once a round: its probes are
// measurements too), and the plan's host total against the run's peak RSS. Wall time on a shared
// machine is noise, so this is a benchmark, never a test.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
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

struct Scenario {
  std::string name;
  std::vector<std::string> overrides;           // the scenario's own keys
  std::vector<std::vector<std::string>> forced;  // the alternatives, each a set of overrides
  double host_share = 0;  // > 0: offload.host_memory = this x auto's unlimited host total (+ 8 MiB: the RSS's jitter)
};

// Every combination of the values given per key.
std::vector<std::vector<std::string>> combinations(const std::vector<std::vector<std::string>>& keys) {
  std::vector<std::vector<std::string>> out = {{}};
  for (const std::vector<std::string>& values : keys) {
    std::vector<std::vector<std::string>> next;
    for (const std::vector<std::string>& o : out)
      for (const std::string& v : values) {
        next.push_back(o);
        next.back().push_back(v);
      }
    out = std::move(next);
  }
  return out;
}

std::vector<Scenario> scenarios(const std::string& nvme) {
  const std::string on_nvme = "offload.nvme_path=" + nvme;
  // every layer resident, every layer streamed, and the first half resident (offload.resident_layers)
  const std::vector<std::string> weights = {"offload.weights=device", "offload.weights=stream",
                                            "offload.resident_layers=4"};
  const std::vector<std::string> schedule = {"offload.accumulation=layer_major", "offload.accumulation=micro_batch"};
  return {
      // the host budget at exactly what auto needs with no budget (a small model's state is smaller
      // than the NVMe pipeline's own window, so on this machine a tighter budget fits nothing)
      {"host budget at the plan's total, NVMe path", {on_nvme, "model.dtype=bf16"},
       combinations({{"offload.optimizer=host", "offload.optimizer=nvme"},
                     {"offload.checkpoints=host", "offload.checkpoints=nvme"}}), 1.0},
      {"link throttled to 1 GB/s, accumulation 4", {"device.link_bandwidth=1GB/s", "train.gradient_accumulation_steps=4",
                                                   "model.dtype=bf16"},
       combinations({weights, schedule})},
      {"NVMe path, accumulation 4, link 2 GB/s", {on_nvme, "train.gradient_accumulation_steps=4",
                                                  "device.link_bandwidth=2GB/s", "model.dtype=f32"},
       combinations({weights, schedule, {"offload.checkpoints=auto", "offload.checkpoints=nvme"}})},
      {"accumulation 4, a device that holds few checkpoints", {"train.gradient_accumulation_steps=4", "device.memory=160MiB",
                                                              "model.dtype=bf16"},
       combinations({weights, schedule})},
  };
}

nlohmann::json bench_model() {  // 8 layers of C 512, F 1408, V 32000 untied (layer-major applies): 61M parameters
  return {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"hidden_size", 512},
          {"intermediate_size", 1408}, {"num_hidden_layers", 8}, {"num_attention_heads", 8},
          {"num_key_value_heads", 4}, {"vocab_size", 32000}, {"max_position_embeddings", 1024},
          {"tie_word_embeddings", false}, {"rms_norm_eps", 1e-5}};
}

std::string quoted(const std::vector<std::string>& overrides) {
  std::string s;
  for (const std::string& o : overrides) s += " '" + o + "'";
  return s;
}

struct Arm {
  Arm(std::string n, std::vector<std::string> o) : name(std::move(n)), overrides(std::move(o)) {}
  std::string name;
  std::vector<std::string> overrides;
  std::vector<double> steps;        // step_s after the first, every run
  std::vector<double> run_medians;  // each run's median step
  std::vector<std::string> plans;   // each run's plan (plan_identity)
  double peak_rss = 0;
};

// What identifies a plan: every state's kind, tier and bytes as the run's plan.json (or
// `strata estimate --json`) lists them, but the process baseline, which is measured, and the
// tokenized rows, which the estimate does not read.
std::string plan_identity(const nlohmann::json& j) {
  nlohmann::json id = nlohmann::json::array();
  for (const nlohmann::json& st : j.value("states", nlohmann::json::array())) {
    const std::string kind = st.value("kind", std::string());
    if (kind.rfind("process baseline", 0) != 0 && kind.rfind("tokenized data rows", 0) != 0) id.push_back(st);
  }
  return id.dump();
}

// The most frequent of `v` (the first of equals).
std::string most_frequent(const std::vector<std::string>& v) {
  std::map<std::string, int> n;
  for (const std::string& x : v) ++n[x];
  std::string best;
  for (const std::string& x : v)
    if (best.empty() || n[x] > n[best]) best = x;
  return best;
}

// One training run of `a`: its steps after the first (saves excluded), its plan and its peak
// resident set.
void run_arm(const std::string& strata, const std::string& recipe, const fs::path& out, const std::string& scenario,
             Arm& a) {
  std::error_code ec;
  int status = 0;
  fs::remove_all(out, ec);
  bench_run_capture(strata + " train" + recipe + quoted(a.overrides) + " 'checkpoint.output_dir=" + out.string() +
                        "' >/dev/null 2>&1", &status);
  STRATA_CHECK(status == 0, "strata train failed: ", a.name, " in ", scenario);
  std::ifstream m(out / "metrics.jsonl");
  std::vector<double> run;
  for (std::string line; std::getline(m, line);) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded()) continue;
    if (j.contains("host_rss_peak_bytes")) a.peak_rss = std::max(a.peak_rss, j["host_rss_peak_bytes"].get<double>());
    if (!j.contains("step_s") || j["step"].get<int64_t>() < 2) continue;
    run.push_back(j["step_s"].get<double>() - j.value("save_s", 0.0));
  }
  a.steps.insert(a.steps.end(), run.begin(), run.end());
  a.run_medians.push_back(bench_median(run));
  std::ifstream plan_file(out / "plan.json");
  const nlohmann::json plan = nlohmann::json::parse(plan_file, nullptr, false);
  STRATA_CHECK(plan.is_object(), "strata train wrote no readable plan.json: ", a.name, " in ", scenario);
  a.plans.push_back(plan_identity(plan));
}

}  // namespace

int bench_plan_choice(const std::vector<std::string>& args) {
  CLI::App app{"auto's plan against every forced alternative, measured interleaved (CPU backend)", "strata-bench plan"};
  int steps = 4, rounds = 2;
  std::string only, nvme = (fs::temp_directory_path() / "strata_bench_plan_nvme").string();
  app.add_option("--steps", steps, "training steps per run (the first is not timed)")->check(CLI::Range(2, 100));
  app.add_option("--rounds", rounds, "runs of each arm, interleaved")->check(CLI::Range(1, 20));
  app.add_option("--scenario", only, "run only the scenarios whose name contains this");
  app.add_option("--nvme-path", nvme, "a directory on the NVMe drive");
  int rc = 0;
  if (!parse_args(app, args, &rc)) return rc;
  std::error_code ec;
  const fs::path strata = fs::read_symlink("/proc/self/exe", ec).parent_path() / "strata";
  STRATA_CHECK(fs::exists(strata, ec), strata.string(), " is missing: build the strata target first");
  const fs::path root = fs::temp_directory_path() / "strata_bench_plan";
  fs::remove_all(root, ec);
  fs::create_directories(root);
  fs::create_directories(nvme);
  std::ofstream(root / "model.json") << bench_model().dump(1);
  std::ofstream(root / "recipe.toml")
      << "[model]\nconfig = \"model.json\"\ninit_seed = 3\n[data]\npath = \""
      << (fs::path(STRATA_SOURCE_DIR) / "recipes/quickstart/corpus.txt").string()
      << "\"\nsequence_len = 128\npacking = true\ntokenizer = \"bytes\"\n[train]\nmax_steps = " << steps
      << "\nmicro_batch_size = 2\nseed = 1\nlog_steps = 1000\n[optim]\nlearning_rate = 1e-4\n[device]\nbackend = \"cpu\"\n"
         "memory = \"2GiB\"\n[checkpoint]\nsave_steps = 100000\n";
  const std::string recipe = " '" + (root / "recipe.toml").string() + "'";
  nlohmann::json rows = nlohmann::json::array();
  std::printf("%-52s %9s %9s %9s %9s %9s %9s %9s %9s  %s\n", "scenario", "auto s", "best s", "auto/best", "same/auto",
              "noise", "est. s", "est/auto", "host/rss", "best forced (a plan other than auto's)");
  for (const Scenario& sc : scenarios(nvme)) {
    if (!only.empty() && sc.name.find(only) == std::string::npos) continue;
    std::vector<std::string> base = sc.overrides;
    auto estimate = [&](const std::vector<std::string>& o, int* status, bool measure) {
      const std::string text = bench_run_capture(
          strata.string() + " estimate" + recipe + quoted(o) + " --json" + (measure ? " --measure" : "") + " 2>/dev/null", status);
      return nlohmann::json::parse(text, nullptr, false);
    };
    int status = 0;
    if (sc.host_share > 0) {  // the budget: a share of what auto needs with no budget
      const nlohmann::json j = estimate(base, &status, false);
      const double host = j["tiers"]["host"].get<double>() + j["tiers"]["host_pinned"].get<double>();
      base.push_back("offload.host_memory=" + std::to_string((size_t(host * sc.host_share) >> 20) + 8) + "MiB");
    }
    const nlohmann::json planned = estimate(base, &status, false);
    STRATA_CHECK(status == 0 && planned.is_object(), "strata estimate failed for auto's plan in ", sc.name);
    std::vector<Arm> arms = {Arm("auto", base)};
    for (const std::vector<std::string>& f : sc.forced) {
      std::vector<std::string> o = base;
      o.insert(o.end(), f.begin(), f.end());
      estimate(o, &status, false);
      if (status != 0) continue;  // does not fit, or does not apply
      std::string name;
      for (const std::string& k : f) name += (name.empty() ? "" : ", ") + k.substr(k.find('.') + 1);
      arms.emplace_back(name, o);
    }
    // round by round: auto's prediction, auto, every forced arm, auto again
    std::vector<double> predicted;
    std::vector<std::string> predicted_plans;
    Arm again("auto, last in the round", base);
    for (int r = 0; r < rounds; ++r) {
      const nlohmann::json p = estimate(base, &status, true);
      STRATA_CHECK(status == 0, "strata estimate --measure failed in ", sc.name);
      predicted.push_back(p["step"]["seconds"].get<double>());
      predicted_plans.push_back(plan_identity(p));
      for (Arm& a : arms) run_arm(strata.string(), recipe, root / "run", sc.name, a);
      run_arm(strata.string(), recipe, root / "run", sc.name, again);
    }
    Arm& automatic = arms[0];
    const double auto_first = bench_median(automatic.steps), auto_last = bench_median(again.steps);
    automatic.steps.insert(automatic.steps.end(), again.steps.begin(), again.steps.end());
    automatic.plans.insert(automatic.plans.end(), again.plans.begin(), again.plans.end());
    const std::string auto_plan = most_frequent(automatic.plans);
    const double auto_s = bench_median(automatic.steps);
    // each forced arm's plan; one whose runs took auto's is set apart, the fastest of the others is "best"
    std::vector<std::string> arm_plan(arms.size());
    for (size_t i = 1; i < arms.size(); ++i) arm_plan[i] = most_frequent(arms[i].plans);
    const Arm *best = nullptr, *same = nullptr;
    for (size_t i = 1; i < arms.size(); ++i) {
      if (arm_plan[i] == auto_plan) {
        if (!same) same = &arms[i];
      } else if (!best || bench_median(arms[i].steps) < bench_median(best->steps)) best = &arms[i];
    }
    auto plan_name = [&](const std::string& id) {
      for (size_t i = 1; i < arms.size(); ++i)
        if (arm_plan[i] == id) return arms[i].name;
      return std::string("a plan no forced arm ran");
    };
    std::map<std::string, int> auto_ran;
    for (const std::string& id : automatic.plans) ++auto_ran[plan_name(id)];
    std::string ran;
    for (const auto& [name, n] : auto_ran) ran += (ran.empty() ? "" : "; ") + name + " x" + std::to_string(n);
    int estimate_matches = 0;
    for (const std::string& id : predicted_plans) estimate_matches += id == auto_plan;
    const double best_s = best ? bench_median(best->steps) : NAN;
    const double same_s = same ? bench_median(same->steps) : NAN;
    const double est = bench_median(predicted);
    const auto [est_lo, est_hi] = std::minmax_element(predicted.begin(), predicted.end());
    const double host = planned["tiers"]["host"].get<double>() + planned["tiers"]["host_pinned"].get<double>();
    const double noise = std::max(auto_first, auto_last) / std::min(auto_first, auto_last);
    std::printf("%-52s %9.3f %9.3f %9.3f %9.3f %9.3f %9.3f %9.3f %9.3f  %s\n", sc.name.c_str(), auto_s, best_s,
                auto_s / best_s, same_s / auto_s, noise, est, est / auto_s,
                automatic.peak_rss > 0 ? host / automatic.peak_rss : NAN, best ? best->name.c_str() : "(none fits)");
    std::printf("    auto ran: %s (%zu runs); the estimate's plan was auto's in %d of %d rounds; its step %.3f-%.3f s\n",
                ran.c_str(), automatic.plans.size(), estimate_matches, rounds, *est_lo, *est_hi);
    nlohmann::json forced = nlohmann::json::array();
    for (size_t i = 1; i < arms.size(); ++i)
      forced.push_back({{"arm", arms[i].name}, {"median_s", bench_median(arms[i].steps)},
                        {"auto_plan", arm_plan[i] == auto_plan}, {"run_medians_s", arms[i].run_medians}});
    rows.push_back({{"scenario", sc.name}, {"auto_ran", ran}, {"auto_s", auto_s}, {"auto_first_in_round_s", auto_first},
                    {"auto_last_in_round_s", auto_last}, {"auto_run_medians_s", automatic.run_medians},
                    {"best_forced_s", best_s}, {"auto_over_best", auto_s / best_s},
                    {"same_plan_forced_over_auto", same_s / auto_s}, {"noise_floor", noise}, {"estimated_s", est},
                    {"estimated_runs_s", predicted}, {"estimated_plan_was_autos", estimate_matches},
                    {"estimated_over_auto", est / auto_s}, {"forced", forced}, {"plan_host_bytes", host},
                    {"peak_rss_bytes", automatic.peak_rss}});
    std::fflush(stdout);
  }
  fs::remove_all(nvme, ec);
  fs::remove_all(root, ec);
  std::printf("%s\n", nlohmann::json{{"plan", rows}}.dump().c_str());
  return 0;
}

}  // namespace strata::bench
