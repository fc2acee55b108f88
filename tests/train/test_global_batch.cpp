// train.global_batch_size end to end: the plan chooses the split of the global batch (a run
// with that split given explicitly trains bit for bit the same), a part the recipe gives stays,
// the checkpoint records the split and a resumed run keeps it (bit-exact with the straight run),
// and a global batch the fixed parts cannot make is refused before anything runs.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "src/core/error.h"
#include "src/recipe/recipe.h"
#include "src/train/trainer.h"
#include "tests/testing.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

// The quickstart recipe without its micro_batch_size and gradient_accumulation_steps keys (so
// that train.global_batch_size may choose them), its paths made absolute.
std::string recipe_without_split() {
  const std::string dir = testing::fresh_path("strata_global_batch", "recipe");
  fs::create_directories(dir);
  const std::string src = testing::source_path("recipes");
  std::ofstream(dir + "/recipe.toml") << "[model]\nconfig = \"" << src << "/quickstart/config.json\"\ninit_seed = 7\n"
                                      << "dtype = \"f32\"\n[data]\npath = \"" << src << "/quickstart/corpus.txt\"\n"
                                      << "sequence_len = 64\n[train]\nseed = 7\nlog_steps = 100\n[optim]\n"
                                      << "learning_rate = 3e-3\nwarmup_steps = 1\n[device]\nbackend = \"cpu\"\n"
                                      << "memory = \"1GiB\"\n";
  return dir + "/recipe.toml";
}

Recipe recipe(const std::string& path, const std::string& out, std::vector<std::string> extra) {
  std::vector<std::string> o = {"train.max_steps=4", "checkpoint.output_dir=" + out, "checkpoint.save_dtype=f32",
                                "checkpoint.save_steps=2"};
  o.insert(o.end(), extra.begin(), extra.end());
  return recipe_load(path, o);
}

struct Split {
  int64_t micro = 0, accumulation = 0, global = 0;
};
Split checkpoint_split(const std::string& dir) {
  const nlohmann::json j = nlohmann::json::parse(testing::read_file(dir + "/trainer_state.json"));
  return {j["micro_batch_size"].get<int64_t>(), j["gradient_accumulation_steps"].get<int64_t>(),
          j["global_batch"].get<int64_t>()};
}

}  // namespace

TEST_CASE("train.global_batch_size: the plan's split trains as the same split given by hand, and resumes with it",
          "[train][search][checkpoint]") {
  const std::string path = recipe_without_split();
  const std::string a = testing::fresh_path("strata_global_batch", "chosen"),
                    b = testing::fresh_path("strata_global_batch", "by_hand"),
                    c = testing::fresh_path("strata_global_batch", "resumed");
  const TrainSummary chosen = train_run(recipe(path, a, {"train.global_batch_size=8"}));
  REQUIRE(chosen.losses.size() == 4);
  const Split s = checkpoint_split(a + "/checkpoint-2");
  INFO("chosen: " << s.micro << " x " << s.accumulation);
  CHECK(s.global == 8);
  CHECK(s.micro * s.accumulation == 8);
  const TrainSummary by_hand =
      train_run(recipe(path, b, {"train.micro_batch_size=" + std::to_string(s.micro),
                                 "train.gradient_accumulation_steps=" + std::to_string(s.accumulation)}));
  CHECK(by_hand.losses == chosen.losses);
  // stopped at step 2 and resumed: the split it started with, bit for bit the straight run
  TrainOptions stop;
  stop.stop_at_step = 2;
  train_run(recipe(path, c, {"train.global_batch_size=8"}), stop);
  TrainOptions resume;
  resume.resume_latest = true;
  const TrainSummary rest = train_run(recipe(path, c, {"train.global_batch_size=8"}), resume);
  REQUIRE(rest.losses.size() == 2);
  CHECK(rest.losses[0] == chosen.losses[2]);
  CHECK(rest.losses[1] == chosen.losses[3]);
  const Split r = checkpoint_split(c + "/checkpoint-4");
  CHECK(r.micro == s.micro);
  CHECK(r.accumulation == s.accumulation);
  CHECK(testing::read_file(a + "/checkpoint-4/optimizer_state.safetensors") ==
        testing::read_file(c + "/checkpoint-4/optimizer_state.safetensors"));
}

TEST_CASE("train.global_batch_size keeps a part the recipe gives, and refuses a batch those parts cannot make",
          "[train][search][recipe]") {
  const std::string path = recipe_without_split();
  const std::string a = testing::fresh_path("strata_global_batch", "fixed_micro");
  train_run(recipe(path, a, {"train.global_batch_size=8", "train.micro_batch_size=2", "train.max_steps=2"}));
  const Split s = checkpoint_split(a + "/checkpoint-2");
  CHECK(s.micro == 2);
  CHECK(s.accumulation == 4);
  // 8 is not 3 x anything: refused (exit 2) naming both keys
  const std::string msg = testing::error_of(
      [&] {
        train_run(recipe(path, testing::fresh_path("strata_global_batch", "bad"),
                         {"train.global_batch_size=8", "train.micro_batch_size=3"}));
      },
      ErrorKind::input);
  CHECK(msg.find("train.global_batch_size = 8") != std::string::npos);
  CHECK(msg.find("train.micro_batch_size = 3") != std::string::npos);
  // both parts given and not the global batch: the recipe refuses it
  CHECK_THROWS_WITH(recipe(path, a, {"train.global_batch_size=8", "train.micro_batch_size=2",
                                     "train.gradient_accumulation_steps=3"}),
                    Catch::Contains("leave one of them out"));
}

}  // namespace strata
