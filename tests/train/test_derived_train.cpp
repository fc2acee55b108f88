// offload.working_weights = "auto" when the tokenized data decides it (src/train/trainer.cpp
// plan_with_data): a host budget that holds the stored working copy before the rows are counted
// and not after, so the trainer sets the model up again with the layers' working weights derived
// from the master — and trains bit for bit like the stored copy.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/testing.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

// The quickstart's shape made wider and deeper: 10 layers of ~0.74M parameters, so that deriving
// saves ~12 MB (8 layers' bf16 copies net of the two staging buffers), well above the jitter of a
// process's resident set that the plan counts.
std::string wide_config() {
  const std::string dir = testing::fresh_path("strata_derived_train", "config");
  fs::create_directories(dir);
  std::ifstream in(testing::source_path("recipes/quickstart/config.json"));
  nlohmann::json j = nlohmann::json::parse(in);
  j["hidden_size"] = 256;
  j["intermediate_size"] = 704;
  j["num_hidden_layers"] = 10;
  j["head_dim"] = 64;
  std::ofstream(dir + "/config.json") << j.dump();
  return dir + "/config.json";
}

double host_total(const nlohmann::json& plan) {
  return plan["tiers"]["host"].get<double>() + plan["tiers"]["host_pinned"].get<double>();
}

nlohmann::json read_plan(const std::string& out) {
  std::ifstream in(out + "/plan.json");
  return nlohmann::json::parse(in);
}

double state_bytes(const nlohmann::json& plan, const std::string& prefix) {
  double bytes = 0;
  for (const nlohmann::json& st : plan["states"])
    if (st["kind"].get<std::string>().rfind(prefix, 0) == 0) bytes += st["bytes"].get<double>();
  return bytes;
}

std::vector<double> losses(const std::string& out) {
  std::vector<double> v;
  for (const nlohmann::json& j : testing::metrics_records(out, "loss")) v.push_back(j["loss"].get<double>());
  return v;
}

}  // namespace

TEST_CASE("auto derives the working weights when the tokenized data leaves no room for the stored copy",
          "[train][derived]") {
  // Separate processes: the plan counts the process's resident set, which a fresh process measures
  // alike each time. Every other lever the search has is pinned (checkpoints kept on the host and
  // recomputed, the optimizer in RAM, streamed weights, no speculation), so deriving is the one
  // way to fit.
  const std::string args = testing::source_path("recipes/quickstart.toml") + " model.config=" + wide_config() +
                           " model.dtype=bf16 train.max_steps=2 train.micro_batch_size=4 data.sequence_len=256"
                           " optim.warmup_steps=1 train.log_steps=100 offload.checkpoints=host"
                           " offload.optimizer=host checkpoint.save_steps=0 offload.recompute=always"
                           " offload.weights=stream offload.speculative_update=off";
  const std::string a = testing::fresh_path("strata_derived_train", "stored"),
                    b = testing::fresh_path("strata_derived_train", "auto");
  const testing::ProcessResult stored =
      testing::run_strata("train " + args + " offload.working_weights=stored checkpoint.output_dir=" + a);
  testing::check_run(stored, 0, {"step 2/"});
  const nlohmann::json plan = read_plan(a);
  REQUIRE(state_bytes(plan, "derived working weights") == 0);  // no upload staging: nothing derived
  const double total = host_total(plan), data = state_bytes(plan, "tokenized data");
  const double layer_working = state_bytes(plan, "working weights") / 10;  // about one layer's bf16 copy
  const double saving = 8 * layer_working;  // 10 layers' copies less two staging buffers (upper bound: embedding in)
  REQUIRE(data > 4e6);
  REQUIRE(saving > 8e6);
  // a budget that the stored copy meets without the rows (total - data) and misses with them
  const double room = std::min(data, saving) / 2;
  const std::string budget = " offload.host_memory=" + std::to_string(int64_t(total - room)) + "B";

  const testing::ProcessResult au = testing::run_strata("train " + args + budget + " checkpoint.output_dir=" + b);
  testing::check_run(au, 0, {"the plan derives the layers' working weights; setting up again", "step 2/"});
  const nlohmann::json au_plan = read_plan(b);
  CHECK(state_bytes(au_plan, "derived working weights") > 0);  // the upload staging of a derived plan
  CHECK(state_bytes(au_plan, "working weights") < state_bytes(plan, "working weights"));
  CHECK(host_total(au_plan) <= total - room);
  REQUIRE(losses(a).size() == 2);
  CHECK(losses(b) == losses(a));  // derived from the master: the same bits on the device
  CHECK(testing::read_file(a + "/final/model.safetensors") == testing::read_file(b + "/final/model.safetensors"));
}

}  // namespace strata
