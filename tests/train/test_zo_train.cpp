// Zeroth-order training end to end (optim.type = "zo-sgd", recipes/zo-tiny.toml): the loss of
// the tiny chat model falls, metrics.jsonl carries the ZO fields, a run stopped and resumed
// equals the straight run bit for bit (losses, weights, checkpoint state), the CLI warns that
// clipping does not apply, and the run plots and exports; offload.accumulation = "layer_major"
// trains bit for bit like "micro_batch" with the weights crossing once per step.
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

// The tiny chat model with 4 layers, initialised from the seed: with its 2, both layers would
// still be in their slots at the next dual forward, and one at a time would move W per step too.
std::vector<std::string> deep_tiny(const std::string& dtype) {
  const std::string tiny = testing::source_path("recipes/sft-tiny/models/tiny");
  const std::string dir = testing::fresh_path("strata_zo", "deep_config");
  fs::create_directories(dir);
  std::ifstream in(tiny + "/config.json");
  nlohmann::json j = nlohmann::json::parse(in);
  j["num_hidden_layers"] = 4;
  std::ofstream(dir + "/config.json") << j.dump();
  return {"model.path=", "model.config=" + dir + "/config.json", "data.tokenizer=" + tiny, "model.dtype=" + dtype};
}

std::vector<double> metric(const std::string& out, const std::string& key) {
  std::vector<double> v;
  for (const nlohmann::json& j : testing::metrics_records(out, key)) v.push_back(j[key].get<double>());
  return v;
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

namespace strata {

TEST_CASE("zo-sgd: offload.accumulation = layer_major trains bit for bit like micro_batch, a step moving the weights once", "[zo][train][layer_major]") {
  // (dtype, k micro-batches, q perturbations): k = 2 and 3, q = 1 and 2, f32 and bf16
  struct Case {
    const char* dtype;
    int64_t k, q;
  };
  for (const Case& c : {Case{"f32", 2, 2}, Case{"f32", 3, 1}, Case{"bf16", 3, 2}, Case{"bf16", 2, 1}}) {
    INFO(c.dtype << ", k " << c.k << ", q " << c.q);
    std::vector<std::string> o = deep_tiny(c.dtype);
    o.insert(o.end(), {"train.max_steps=4", "checkpoint.save_steps=2", "train.eval_steps=0", "optim.weight_decay=0.1",
                       "optim.learning_rate=1e-3", str_cat("train.gradient_accumulation_steps=", c.k),
                       str_cat("optim.zo_perturbations=", c.q)});
    auto with = [&](const char* schedule) {
      std::vector<std::string> v = o;
      v.push_back(std::string("offload.accumulation=") + schedule);
      return v;
    };
    const std::string one = fresh("one_at_a_time"), major = fresh("layer_major"), au = fresh("auto");
    const TrainSummary s_one = train_run(zo_recipe(one, with("micro_batch")));
    const TrainSummary s_major = train_run(zo_recipe(major, with("layer_major")));
    const TrainSummary s_auto = train_run(zo_recipe(au, with("auto")));
    REQUIRE(s_one.losses.size() == 4);
    CHECK(s_major.losses == s_one.losses);
    CHECK(s_auto.losses == s_one.losses);
    CHECK(s_one.losses[0] != s_one.losses[3]);  // the weights moved: the checks can fail
    CHECK(metric(major, "zo_projected_grad") == metric(one, "zo_projected_grad"));
    require_same_tensors(one + "/final", major + "/final");
    for (const char* ckpt : {"/checkpoint-2", "/checkpoint-4"})
      CHECK(testing::read_file(one + ckpt + "/optimizer_state.safetensors") ==
            testing::read_file(major + ckpt + "/optimizer_state.safetensors"));
    // link bytes per step: W once (layer-major) against the layers once per dual forward (the
    // final norm and the one lm_head chunk, the tied embedding, stay on the device within a step);
    // both send each pass's embedding output and get the losses back, layer-major each
    // micro-batch's tokens (4 int32 arrays of the packed rows) once a step, one at a time once a
    // dual forward
    const ModelSpec spec = model_spec_build(
        hf_config_load(o[1].substr(std::string("model.config=").size())), dtype_parse(c.dtype));
    const HostStoreLayout l = HostStore::layout(spec);
    double layers = 0;
    for (size_t i = 0; i < spec.layers.size(); ++i) layers += double(l.groups[1 + i].working_bytes);
    const double head = double(l.working[size_t(spec.final_norm)].bytes() + l.working[size_t(spec.lm_head_row())].bytes());
    const double N = 4 * 128, pairs = double(c.k * c.q), tokens = 4 * 4 * N, x0 = N * 64 * 4, losses = 2 * 8;
    const double W = layers + head;
    for (double b : metric(major, "link_bytes")) CHECK(b == W + double(c.k) * tokens + pairs * (2 * x0 + losses));
    for (double b : metric(one, "link_bytes")) CHECK(b == pairs * layers + head + pairs * (tokens + 2 * x0 + losses));
    CHECK(metric(au, "link_bytes") == metric(major, "link_bytes"));  // "auto" took layer-major
    const double ratio = metric(one, "link_bytes").back() / metric(major, "link_bytes").back();
    std::printf("zo-sgd %s k %ld q %ld: link bytes per step one at a time / layer-major %.3f; weights %.3f W / 1 W\n",
                c.dtype, long(c.k), long(c.q), ratio, (pairs * layers + head) / W);
    CHECK(ratio > 1);
    // resumed across schedules: stopped one at a time at step 2, continued layer-major
    const std::string mixed = fresh("mixed");
    TrainOptions stop;
    stop.stop_at_step = 2;
    train_run(zo_recipe(mixed, with("micro_batch")), stop);
    TrainOptions resume;
    resume.resume_latest = true;
    const TrainSummary rest = train_run(zo_recipe(mixed, with("layer_major")), resume);
    REQUIRE(rest.losses.size() == 2);
    CHECK(rest.losses[0] == s_one.losses[2]);
    CHECK(rest.losses[1] == s_one.losses[3]);
    require_same_tensors(one + "/final", mixed + "/final");
  }
}

}  // namespace strata
