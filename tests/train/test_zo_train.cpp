// Zeroth-order training end to end (optim.type = "zo-sgd", recipes/zo-tiny.toml): the loss of
// the tiny chat model falls, metrics.jsonl carries the ZO fields, a run stopped and resumed
// equals the straight run bit for bit (losses, weights, checkpoint state), the CLI warns that
// clipping does not apply, and the run plots and exports.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/hf_config.h"
#include "io/safetensors.h"
#include "models/model_spec.h"
#include "offload/state/host_store.h"
#include "src/recipe/recipe.h"
#include "src/train/trainer.h"
#include "tests/testing.h"

namespace strata {
namespace {

using testing::require_same_tensors;

namespace fs = std::filesystem;

std::string fresh(const char* name) { return testing::fresh_path("strata_zo", name); }

Recipe zo_recipe(const std::string& out, std::vector<std::string> extra) {
  std::vector<std::string> o = {"checkpoint.output_dir=" + out, "train.log_steps=1000", "checkpoint.save_dtype=f32",
                                "device.cpu_threads=2"};
  o.insert(o.end(), extra.begin(), extra.end());
  return recipe_load(testing::source_path("recipes/zo-tiny.toml"), o);
}


}  // namespace

TEST_CASE("a zo-sgd run lowers the loss of the tiny chat model", "[zo][train]") {
  const std::string out = fresh("lowers");
  const TrainSummary s = train_run(zo_recipe(out, {"train.eval_steps=0"}));
  REQUIRE(s.losses.size() == 300);
  double first = 0, last = 0;
  for (size_t i = 0; i < 30; ++i) first += s.losses[i] / 30, last += s.losses[270 + i] / 30;
  std::printf("zo-tiny: mean loss of steps 1-30 %.4f, of steps 271-300 %.4f\n", first, last);
  CHECK(last < first - 0.1);
  // metrics.jsonl: the ZO fields, and the link traffic of one dual forward per step
  const auto rows = testing::metrics_records(out);
  size_t steps = 0;
  for (const auto& j : rows) {
    if (!j.contains("loss")) continue;
    ++steps;
    REQUIRE(j.contains("zo_projected_grad"));
    REQUIRE(j.contains("loss_plus"));
    REQUIRE(j.contains("loss_minus"));
    CHECK(j["loss"].get<double>() == Approx(0.5 * (j["loss_plus"].get<double>() + j["loss_minus"].get<double>())));
    CHECK(j["link_bytes"].get<size_t>() > 0);
    CHECK(j["device_peak_bytes"].get<size_t>() > 0);
  }
  CHECK(steps == 300);
  CHECK(fs::exists(out + "/final/model.safetensors"));
}

TEST_CASE("a zo-sgd run's host store is its working weights and master, nothing more", "[zo][train]") {
  // metrics.jsonl's host_bytes is what the store allocated (the trainer has checked it against the
  // plan): f32, the working copy is the master (4 B/param); bf16, 2 (matrices) + 4 (master) B/param
  for (const char* dtype : {"f32", "bf16"}) {
    INFO(dtype);
    const std::string out = fresh(dtype);
    train_run(zo_recipe(out, {"train.max_steps=2", "train.eval_steps=0", std::string("model.dtype=") + dtype}));
    const ModelSpec spec = model_spec_build(hf_config_load(testing::source_path("recipes/sft-tiny/models/tiny")),
                                            dtype_parse(dtype));
    const HostStoreLayout l = HostStore::layout(spec);
    const size_t working = l.working.tier_bytes(Tier::host_pinned), master = l.f32.tier_bytes(Tier::host);
    const size_t want = std::string(dtype) == "f32" ? working : working + master;
    const auto rows = testing::metrics_records(out);
    REQUIRE(!rows.empty());
    CHECK(rows.back()["host_bytes"].get<size_t>() == want);
    CHECK(rows.back()["host_pinned_bytes"].get<size_t>() == working);
    const nlohmann::json plan = nlohmann::json::parse(testing::read_file(out + "/plan.json"));
    for (const auto& st : plan["states"]) CHECK(st["kind"].get<std::string>().find("AdamW") == std::string::npos);
  }
}

TEST_CASE("a zo-sgd run stopped at step K and resumed equals the straight run bit for bit", "[zo][train][checkpoint]") {
  const std::string a = fresh("straight"), b = fresh("resumed");
  const std::vector<std::string> o = {"train.max_steps=6", "checkpoint.save_steps=3", "train.eval_steps=0",
                                      "optim.zo_perturbations=2", "train.gradient_accumulation_steps=2",
                                      "optim.weight_decay=0.1", "optim.lr_scheduler_type=cosine",
                                      "optim.warmup_steps=2", "optim.learning_rate=1e-3"};
  const TrainSummary straight = train_run(zo_recipe(a, o));
  REQUIRE(straight.losses.size() == 6);
  TrainOptions stop;
  stop.stop_at_step = 2;
  const TrainSummary first = train_run(zo_recipe(b, o), stop);
  CHECK(first.interrupted);
  REQUIRE(first.losses.size() == 2);
  TrainOptions resume;
  resume.resume_latest = true;
  const TrainSummary rest = train_run(zo_recipe(b, o), resume);
  REQUIRE(rest.losses.size() == 4);
  CHECK(first.losses[0] == straight.losses[0]);
  CHECK(first.losses[1] == straight.losses[1]);
  for (size_t i = 0; i < 4; ++i) CHECK(rest.losses[i] == straight.losses[2 + i]);
  require_same_tensors(a + "/final", b + "/final");
  CHECK(testing::read_file(a + "/checkpoint-6/optimizer_state.safetensors") ==
        testing::read_file(b + "/checkpoint-6/optimizer_state.safetensors"));
  // the projected gradients of the resumed steps too (same z: seeds from train.seed and the step)
  const auto ma = testing::metrics_records(a), mb = testing::metrics_records(b);
  std::vector<double> ga, gb;
  for (const auto& j : ma)
    if (j.contains("zo_projected_grad")) ga.push_back(j["zo_projected_grad"].get<double>());
  for (const auto& j : mb)
    if (j.contains("zo_projected_grad")) gb.push_back(j["zo_projected_grad"].get<double>());
  CHECK(ga == gb);
  // and the weights moved: the run is not a no-op
  CHECK(testing::read_file(a + "/checkpoint-3/optimizer_state.safetensors") !=
        testing::read_file(a + "/checkpoint-6/optimizer_state.safetensors"));
  // the checkpoint holds what zo-sgd keeps: the fp32 master of every parameter and nothing else
  const SafetensorsFile st = SafetensorsFile::open(a + "/checkpoint-6/optimizer_state.safetensors");
  CHECK(!st.entries().empty());
  for (const SafetensorsEntry& e : st.entries()) CHECK(e.name.rfind("master/", 0) == 0);
  // an AdamW run cannot continue from it (no moments), and says what to do instead
  TrainOptions resume_adamw;
  resume_adamw.resume = a + "/checkpoint-3";
  std::vector<std::string> adamw = o;
  adamw.push_back("optim.type=adamw");
  CHECK_THROWS_WITH(train_run(zo_recipe(fresh("adamw_from_zo"), adamw), resume_adamw),
                    Catch::Contains("holds no AdamW moments"));
  // the other way works: a zo-sgd run continues from an AdamW checkpoint (its master; the moments
  // are not read), exactly where the AdamW run's weights were
  const std::string c = fresh("zo_from_adamw");
  std::vector<std::string> three = adamw;
  three.push_back("train.max_steps=3");
  train_run(zo_recipe(c, three));
  const TrainSummary zo_rest = train_run(zo_recipe(c, o), resume);
  REQUIRE(zo_rest.losses.size() == 3);
  CHECK(zo_rest.losses[0] != straight.losses[3]);  // it starts from the AdamW weights, not the ZO run's
  const SafetensorsFile cz = SafetensorsFile::open(c + "/checkpoint-6/optimizer_state.safetensors");
  for (const SafetensorsEntry& e : cz.entries()) CHECK(e.name.rfind("master/", 0) == 0);
}

TEST_CASE("strata train with zo-sgd warns that clipping does not apply, and the run plots", "[zo][train][cli]") {
  const std::string out = fresh("cli");
  const auto r = testing::run_strata("train " + testing::source_path("recipes/zo-tiny.toml") +
                                     " train.max_steps=3 train.eval_steps=0 optim.max_grad_norm=1.0 checkpoint.output_dir=" + out);
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("optim.max_grad_norm = 1 does not apply to zo-sgd") != std::string::npos);
  CHECK(r.out.find("zeroth-order training (zo-sgd)") != std::string::npos);
  const auto p = testing::run_strata("plot " + out + " --out " + out + "/loss.svg");
  INFO(p.out);
  CHECK(p.code == 0);
  CHECK(fs::exists(out + "/loss.svg"));
  // a bad optimizer name is a recipe error naming the key
  const auto bad = testing::run_strata("train " + testing::source_path("recipes/zo-tiny.toml") +
                                       " optim.type=zo-adam checkpoint.output_dir=" + out + "_bad");
  CHECK(bad.code == 2);
  CHECK(bad.out.find("optim.type must be \"adamw\" or \"zo-sgd\"") != std::string::npos);
}

}  // namespace strata
