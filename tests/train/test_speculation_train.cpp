// offload.speculative_update end to end (src/train/trainer.cpp, offload/engine/engine_speculation.cpp):
// a run with the clipped step's updates speculated trains bit for bit like one without, whether
// the norm clips (every speculated update redone) or not (every one committed); its metrics
// count them; it resumes bit-exactly; the plan lists the backup and the start line says it.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "src/recipe/recipe.h"
#include "src/train/trainer.h"
#include "tests/testing.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

Recipe recipe(const std::string& out, const std::string& speculate, double clip, std::vector<std::string> extra = {}) {
  const std::string src = testing::source_path("recipes");
  std::vector<std::string> o = {"train.max_steps=4", "data.sequence_len=64", "train.micro_batch_size=2", "checkpoint.output_dir=" + out, "checkpoint.save_dtype=f32",
                                "checkpoint.save_steps=2", "train.gradient_accumulation_steps=2",
                                "offload.speculative_update=" + speculate, "optim.max_grad_norm=" + std::to_string(clip)};
  o.insert(o.end(), extra.begin(), extra.end());
  return recipe_load(src + "/quickstart.toml", o);
}

std::vector<nlohmann::json> metrics(const std::string& dir) {
  std::vector<nlohmann::json> rows;
  std::istringstream in(testing::read_file(dir + "/metrics.jsonl"));
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

}  // namespace

TEST_CASE("offload.speculative_update = on trains bit for bit like off, committed or redone, and resumes", "[train][speculation]") {
  for (double clip : {1e-3, 1e6}) {  // every step clips / none does
    INFO("clip " << clip);
    const std::string on = testing::fresh_path("strata_speculation", "on"), off = testing::fresh_path("strata_speculation", "off");
    const TrainSummary a = train_run(recipe(on, "on", clip)), b = train_run(recipe(off, "off", clip));
    REQUIRE(a.losses.size() == 4);
    CHECK(a.losses == b.losses);
    CHECK(testing::read_file(on + "/checkpoint-4/optimizer_state.safetensors") ==
          testing::read_file(off + "/checkpoint-4/optimizer_state.safetensors"));
    const nlohmann::json plan = nlohmann::json::parse(testing::read_file(on + "/plan.json"));
    bool listed = false;
    for (const nlohmann::json& s : plan["states"]) listed |= s["kind"] == "speculative update backup" && s["bytes"] > 0;
    CHECK(listed);
    int64_t steps = 0;
    for (const nlohmann::json& row : metrics(on)) {
      if (!row.contains("speculated_groups")) continue;
      ++steps;
      CHECK(row["speculated_groups"].get<int64_t>() > 0);
      CHECK(row["speculation_redone"].get<int64_t>() == (clip < 1 ? row["speculated_groups"].get<int64_t>() : 0));
    }
    CHECK(steps == 4);
    for (const nlohmann::json& row : metrics(off)) CHECK_FALSE(row.contains("speculated_groups"));
  }
  // stopped at step 2 and resumed with speculation: the straight run's bits
  const std::string straight = testing::fresh_path("strata_speculation", "straight"),
                    resumed = testing::fresh_path("strata_speculation", "resumed");
  const TrainSummary s = train_run(recipe(straight, "on", 1e-3));
  TrainOptions stop;
  stop.stop_at_step = 2;
  train_run(recipe(resumed, "on", 1e-3), stop);
  TrainOptions resume;
  resume.resume_latest = true;
  const TrainSummary rest = train_run(recipe(resumed, "on", 1e-3), resume);
  REQUIRE(rest.losses.size() == 2);
  CHECK(rest.losses[0] == s.losses[2]);
  CHECK(rest.losses[1] == s.losses[3]);
  CHECK(testing::read_file(straight + "/checkpoint-4/optimizer_state.safetensors") ==
        testing::read_file(resumed + "/checkpoint-4/optimizer_state.safetensors"));
}

TEST_CASE("offload.speculative_update: auto speculates nothing on the cpu backend, a bad value is refused", "[train][speculation][recipe]") {
  const std::string out = testing::fresh_path("strata_speculation", "auto");
  train_run(recipe(out, "auto", 1.0, {"train.max_steps=1"}));
  for (const nlohmann::json& row : metrics(out)) CHECK_FALSE(row.contains("speculated_groups"));
  CHECK_THROWS_WITH(recipe(out, "always", 1.0), Catch::Contains("offload.speculative_update"));
}

}  // namespace strata
