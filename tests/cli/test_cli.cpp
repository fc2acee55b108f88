// The strata binary end to end, as users and batch scripts run it: output formats, exit codes
// and messages for bad input.
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/testing.h"

namespace strata {
namespace {

using RunResult = testing::ProcessResult;
using testing::run_strata;

std::string tmp(const std::string& name) {
  auto d = std::filesystem::temp_directory_path() / "strata_cli";
  std::filesystem::create_directories(d);
  return (d / name).string();
}

}  // namespace

TEST_CASE("strata grad prints loss and tokens as one JSON line and writes every gradient", "[cli]") {
  const std::string dir = testing::source_path("tests/golden/qwen3");
  const std::string out = tmp("grads.safetensors");
  RunResult r = run_strata("grad --model " + dir + " --batch " + dir + "/batch.json --out " + out, true);
  REQUIRE(r.code == 0);  // stdout holds exactly the JSON line; logs go to stderr
  auto j = nlohmann::json::parse(r.out);
  auto want = nlohmann::json::parse(std::ifstream(dir + "/expected.json"));
  CHECK(j["tokens"] == want["tokens"]);
  CHECK(j["loss"].get<double>() == Approx(want["loss"].get<double>()).epsilon(2e-6));
  CHECK(std::filesystem::file_size(out) > 1000);
}

TEST_CASE("bad input exits 2 with a message that names the problem", "[cli]") {
  const std::string dir = testing::source_path("tests/golden/llama");
  {
    std::ofstream(tmp("bad_batch.json")) << "{\"input_ids\": [[1, 2, 3], [4, 5]]}";
    std::ofstream(tmp("oov_batch.json")) << "{\"input_ids\": [[1, 2, 300000]]}";
    std::ofstream(tmp("typo.toml")) << "[train]\nmax_stesp = 3\n";
  }
  RunResult r = run_strata("grad --model " + dir + " --batch " + tmp("bad_batch.json") + " --out " + tmp("g.st"));
  CHECK(r.code == 2);
  CHECK(r.out.find("equal length") != std::string::npos);

  r = run_strata("grad --model " + dir + " --batch " + tmp("oov_batch.json") + " --out " + tmp("g.st"));
  CHECK(r.code == 2);
  CHECK(r.out.find("300000") != std::string::npos);
  CHECK(r.out.find("[0, 97)") != std::string::npos);

  r = run_strata("grad --model /nonexistent --batch " + tmp("oov_batch.json") + " --out " + tmp("g.st"));
  CHECK(r.code != 0);
  CHECK(r.out.find("/nonexistent") != std::string::npos);

  r = run_strata("train " + tmp("typo.toml"));
  CHECK(r.code == 2);
  CHECK(r.out.find("train.max_steps") != std::string::npos);

  r = run_strata("frobnicate");
  CHECK(r.code == 2);
  r = run_strata("--help");
  CHECK(r.code == 0);
  CHECK(r.out.find("train") != std::string::npos);
}

TEST_CASE("a device budget too small for the model exits 3 and names what did not fit", "[cli]") {
  const std::string dir = testing::source_path("tests/golden/mistral");
  RunResult r = run_strata("grad --model " + dir + " --batch " + dir + "/batch.json --out " +
                           tmp("g.st") + " --device-memory 64KiB");
  testing::check_run(r, 3, {"budget"});
}

TEST_CASE("a device budget below two layers plus one layer's activations fails before step 1, stating the minimum", "[cli]") {
  RunResult r = run_strata("train " + testing::source_path("recipes/quickstart.toml") +
                           " train.max_steps=1 device.memory=8MiB checkpoint.output_dir=" + tmp("small_budget"));
  testing::check_run(r, 3, {"need at least"}, {"step 1/"});  // nothing ran
}

TEST_CASE("a model dir missing a shard is an error naming the shard, before any step", "[cli]") {
  const std::string dir = tmp("model_missing_shard");
  std::filesystem::remove_all(dir);
  std::filesystem::copy(testing::source_path("tests/golden/mistral"), dir);
  std::filesystem::remove(dir + "/model-00002-of-00002.safetensors");
  RunResult r = run_strata("train " + testing::source_path("recipes/quickstart.toml") + " model.config= model.path=" +
                           dir + " data.path=" + dir + "/batch.json data.sequence_len=8 train.max_steps=1 "
                           "checkpoint.output_dir=" + tmp("missing_shard_out"));
  testing::check_run(r, 4, {"model-00002-of-00002.safetensors", "is missing"}, {"step 1/"});
}

TEST_CASE("a host memory budget too small for the model exits 3 before any work, naming the tiers", "[cli]") {
  RunResult r = run_strata("train " + testing::source_path("recipes/quickstart.toml") +
                           " train.max_steps=1 offload.host_memory=1MiB checkpoint.output_dir=" + tmp("host_budget"));
  testing::check_run(r, 3, {"offload.host_memory", "NVMe"}, {"step 1/"});
}

TEST_CASE("an output directory that cannot be created exits 4", "[cli]") {
  RunResult r = run_strata("train " + testing::source_path("recipes/quickstart.toml") +
                           " train.max_steps=1 checkpoint.output_dir=/proc/strata_cannot_write_here");
  testing::check_run(r, 4, {"/proc/strata_cannot_write_here"});
}

}  // namespace strata
