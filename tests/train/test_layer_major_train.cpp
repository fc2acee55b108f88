// offload.accumulation end to end (src/train/accumulation.h): a run whose steps accumulate 4
// micro-batches trains bit-identically under "layer_major", "micro_batch" and "auto" — full
// fine-tuning with and without clipping, LoRA with dropout, preference objectives — while metrics.jsonl's link_bytes shows the
// layer-major saving; "auto" takes micro_batch when the data leaves no room for layer-major; an
// explicit "layer_major" where it does not apply is refused.
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

// The quickstart model with its own lm_head (layer-major needs it untied outside LoRA).
std::string untied_config() {
  const std::string dir = testing::fresh_path("strata_layer_major_train", "config");
  fs::create_directories(dir);
  std::ifstream in(testing::source_path("recipes/quickstart/config.json"));
  nlohmann::json j = nlohmann::json::parse(in);
  j["tie_word_embeddings"] = false;
  std::ofstream(dir + "/config.json") << j.dump();
  return dir + "/config.json";
}

Recipe recipe(const std::string& out, const std::string& accumulation, std::vector<std::string> extra) {
  std::vector<std::string> o = {"train.max_steps=4", "data.sequence_len=64", "train.micro_batch_size=2",
                                "train.gradient_accumulation_steps=4", "optim.warmup_steps=1",
                                "checkpoint.output_dir=" + out, "train.log_steps=100", "checkpoint.save_dtype=f32",
                                "offload.checkpoints=host", "offload.accumulation=" + accumulation};
  o.insert(o.end(), extra.begin(), extra.end());
  return recipe_load(testing::source_path("recipes/quickstart.toml"), o);
}

// A run's metrics.jsonl values of `key`, one per step that has it.
std::vector<double> metric(const std::string& out, const std::string& key) {
  std::vector<double> v;
  for (const nlohmann::json& j : testing::metrics_records(out, key)) v.push_back(j[key].get<double>());
  return v;
}
std::vector<double> link_bytes(const std::string& out) { return metric(out, "link_bytes"); }

// dpo-tiny's pairs on the tiny model's shape with its own lm_head (random init from the seed, the
// tiny model's tokenizer), 3 micro-batches of 2 pairs a step.
Recipe untied_dpo_tiny(const std::string& out, std::vector<std::string> extra) {
  const std::string tiny = testing::source_path("recipes/sft-tiny/models/tiny");
  const std::string dir = testing::fresh_path("strata_layer_major_train", "pref_config");
  fs::create_directories(dir);
  std::ifstream in(tiny + "/config.json");
  nlohmann::json j = nlohmann::json::parse(in);
  j["tie_word_embeddings"] = false;
  std::ofstream(dir + "/config.json") << j.dump();
  std::vector<std::string> o = {"model.path=", "model.config=" + dir + "/config.json", "data.tokenizer=" + tiny,
                                "train.micro_batch_size=2", "train.gradient_accumulation_steps=3",
                                "train.log_steps=100", "checkpoint.save_dtype=f32", "checkpoint.output_dir=" + out};
  o.insert(o.end(), extra.begin(), extra.end());
  return recipe_load(testing::source_path("recipes/dpo-tiny/recipe.toml"), o);
}

}  // namespace

TEST_CASE("layer-major training equals micro-batch training bit for bit, with a fraction of the link bytes",
          "[train][layer_major]") {
  const std::string config = "model.config=" + untied_config();
  for (const char* clip : {"optim.max_grad_norm=1.0", "optim.max_grad_norm=0"}) {
    INFO(clip);
    const std::string a = testing::fresh_path("strata_layer_major_train", "micro"),
                      b = testing::fresh_path("strata_layer_major_train", "layer"),
                      c = testing::fresh_path("strata_layer_major_train", "auto");
    const TrainSummary mb = train_run(recipe(a, "micro_batch", {config, clip}));
    const TrainSummary lm = train_run(recipe(b, "layer_major", {config, clip}));
    const TrainSummary au = train_run(recipe(c, "auto", {config, clip}));
    REQUIRE(mb.losses.size() == 4);
    CHECK(lm.losses == mb.losses);
    CHECK(au.losses == mb.losses);
    CHECK(testing::read_file(a + "/final/model.safetensors") == testing::read_file(b + "/final/model.safetensors"));
    const std::vector<double> lm_link = link_bytes(b), mb_link = link_bytes(a), au_link = link_bytes(c);
    REQUIRE(lm_link.size() == 4);
    REQUIRE(mb_link.size() == 4);
    CHECK((au_link == lm_link || au_link == mb_link));  // auto: whichever the step model prices faster
    for (size_t s = 0; s < 4; ++s) {
      INFO("step " << s + 1 << ": layer_major " << lm_link[s] << " bytes, micro_batch " << mb_link[s]);
      CHECK(lm_link[s] < 0.5 * mb_link[s]);
    }
    std::printf("layer-major train (%s): link bytes per step %.0f (micro_batch %.0f)\n", clip, lm_link[1], mb_link[1]);
  }
}

TEST_CASE("LoRA runs layer-major too, bit for bit the micro_batch schedule's, dropout masks included",
          "[train][layer_major][lora]") {
  // the frozen base crosses twice per step instead of twice per micro-batch; each micro-batch of
  // a layer-major pass draws the dropout masks the micro_batch schedule draws for it. The base:
  // the quickstart model after one step (4 layers, more than the 2 weight slots, so that
  // streaming shows), its lm_head tied (frozen under LoRA, so layer-major applies).
  const std::string base = testing::fresh_path("strata_layer_major_train", "lora_base");
  train_run(recipe_load(testing::source_path("recipes/quickstart.toml"),
                        {"train.max_steps=1", "data.sequence_len=64", "train.micro_batch_size=2", "train.log_steps=100",
                         "checkpoint.save_steps=0", "checkpoint.output_dir=" + base}));
  auto lora_recipe = [&](const std::string& out, const std::string& accumulation) {
    return recipe_load(testing::source_path("recipes/quickstart.toml"),
                       {"model.path=" + base + "/final", "model.config=", "model.dtype=bf16", "lora.r=4", "lora.alpha=8",
                        "lora.dropout=0.1", "data.sequence_len=64", "train.micro_batch_size=2",
                        "train.gradient_accumulation_steps=4", "train.max_steps=2", "train.log_steps=100",
                        "optim.warmup_steps=1", "checkpoint.save_steps=0", "checkpoint.output_dir=" + out,
                        "offload.weights=stream",  // the base streams ("auto" would keep it resident here)
                        "offload.accumulation=" + accumulation});
  };
  const std::string a = testing::fresh_path("strata_layer_major_train", "lora_micro"),
                    b = testing::fresh_path("strata_layer_major_train", "lora_auto");
  const TrainSummary mb = train_run(lora_recipe(a, "micro_batch"));
  const TrainSummary au = train_run(lora_recipe(b, "auto"));
  REQUIRE(mb.losses.size() == 2);
  CHECK(au.losses == mb.losses);
  CHECK(testing::read_file(a + "/final/adapter/adapter_model.safetensors") ==
        testing::read_file(b + "/final/adapter/adapter_model.safetensors"));
  const std::string c = testing::fresh_path("strata_layer_major_train", "lora_layer");
  const TrainSummary lm = train_run(lora_recipe(c, "layer_major"));
  CHECK(lm.losses == mb.losses);
  const std::vector<double> mb_link = link_bytes(a), au_link = link_bytes(b), lm_link = link_bytes(c);
  REQUIRE(lm_link.size() == 2);
  for (size_t s = 0; s < 2; ++s) {
    INFO("step " << s + 1 << ": layer_major " << lm_link[s] << " bytes, micro_batch " << mb_link[s]);
    CHECK(lm_link[s] < 0.5 * mb_link[s]);  // the frozen base crosses twice per step
  }
  CHECK((au_link == lm_link || au_link == mb_link));  // auto: whichever the step model prices faster
  std::printf("layer-major LoRA train: link bytes per step %.0f (micro_batch %.0f)\n", lm_link[1], mb_link[1]);
}

TEST_CASE("a layer-major DPO run stopped at step K and resumed equals the straight run bit for bit",
          "[train][layer_major][preference][checkpoint]") {
  const std::string a = testing::fresh_path("strata_layer_major_train", "pref_straight"),
                    b = testing::fresh_path("strata_layer_major_train", "pref_resumed");
  const std::vector<std::string> keys = {"train.max_steps=4", "checkpoint.save_steps=2", "train.eval_steps=2",
                                         "offload.accumulation=layer_major"};
  const TrainSummary straight = train_run(untied_dpo_tiny(a, keys));
  REQUIRE(straight.losses.size() == 4);
  TrainOptions stop;
  stop.stop_at_step = 2;
  const TrainSummary first = train_run(untied_dpo_tiny(b, keys), stop);
  TrainOptions resume;
  resume.resume_latest = true;
  const TrainSummary rest = train_run(untied_dpo_tiny(b, keys), resume);
  REQUIRE(first.losses.size() == 2);
  REQUIRE(rest.losses.size() == 2);
  CHECK(first.losses[1] == straight.losses[1]);
  CHECK(rest.losses[0] == straight.losses[2]);
  CHECK(rest.losses[1] == straight.losses[3]);
  CHECK(testing::read_file(a + "/checkpoint-4/optimizer_state.safetensors") ==
        testing::read_file(b + "/checkpoint-4/optimizer_state.safetensors"));
  // the eval at step 4 (a run stopping at step 2 skips that step's eval to stop at once)
  REQUIRE(!metric(b, "eval_rewards/margins").empty());
  CHECK(metric(a, "eval_rewards/margins").back() == metric(b, "eval_rewards/margins").back());
  CHECK(metric(a, "rewards/margins") == metric(b, "rewards/margins"));
}

TEST_CASE("preference objectives run layer-major: bit for bit the micro_batch schedule's, each pair weighted in its micro-batch",
          "[train][layer_major][preference]") {
  // dpo-tiny's pairs on the tiny model's shape with its own lm_head (random init from the seed,
  // its tokenizer): each micro-batch of a layer-major pass gets its own pair layout and token
  // weights (offload/objective/preference_head.h), so the pass trains what one micro-batch at a time does
  for (const char* objective : {"dpo", "ipo", "simpo", "orpo"})
    for (const char* clip : {"optim.max_grad_norm=1.0", "optim.max_grad_norm=0"}) {
      INFO(objective << ", " << clip);
      auto pref_recipe = [&](const std::string& out, const std::string& accumulation) {
        return untied_dpo_tiny(out, {std::string("train.objective=") + objective, clip, "train.max_steps=3",
                                     "train.eval_steps=0", "checkpoint.save_steps=0",
                                     "offload.accumulation=" + accumulation});
      };
      const std::string a = testing::fresh_path("strata_layer_major_train", "pref_micro"),
                        b = testing::fresh_path("strata_layer_major_train", "pref_layer"),
                        c = testing::fresh_path("strata_layer_major_train", "pref_auto");
      const TrainSummary mb = train_run(pref_recipe(a, "micro_batch"));
      const TrainSummary lm = train_run(pref_recipe(b, "layer_major"));
      const TrainSummary au = train_run(pref_recipe(c, "auto"));
      REQUIRE(mb.losses.size() == 3);
      CHECK(lm.losses == mb.losses);
      CHECK(au.losses == mb.losses);
      CHECK(testing::read_file(a + "/final/model.safetensors") == testing::read_file(b + "/final/model.safetensors"));
      for (const char* key : {"rewards/margins", "rewards/accuracies", "logps/chosen"})
        CHECK(metric(b, key) == metric(a, key));  // TRL's metrics, summed over the pass's micro-batches alike
      const std::vector<double> mb_link = link_bytes(a), lm_link = link_bytes(b);
      REQUIRE(lm_link.size() == 3);
      CHECK((link_bytes(c) == lm_link || link_bytes(c) == mb_link));  // auto: the faster by the step model
      for (size_t s = 0; s < 3; ++s) CHECK(lm_link[s] < mb_link[s]);  // gradients cross once per step
      std::printf("layer-major %s (%s): link bytes per step %.0f (micro_batch %.0f)\n", objective, clip, lm_link[1],
                  mb_link[1]);
    }
}

TEST_CASE("auto takes micro_batch when the tokenized data leaves no room for layer-major's checkpoints",
          "[train][layer_major]") {
  // The layer-major run's plan with a generous budget gives its host total and the data's bytes.
  // A budget half the data's bytes below that total holds layer-major before the data is
  // counted, not after: "auto" sets the model up again for one micro-batch at a time (which
  // holds 1 checkpoint per layer, not 4), an explicit "layer_major" exits 3. Separate processes:
  // the plan counts the process's resident set, which a fresh process measures alike each time.
  const std::string args = testing::source_path("recipes/quickstart.toml") + " model.config=" + untied_config() +
                           " train.max_steps=2 train.micro_batch_size=4 data.sequence_len=256"
                           " train.gradient_accumulation_steps=4 optim.warmup_steps=1 train.log_steps=100"
                           " offload.checkpoints=host offload.recompute=always checkpoint.save_steps=0"
                           " offload.norm_pass=off"  // every gradient held: a norm pass would make room too
                           // streamed weights over a slow link: layer-major saves more link time than its
                           // gradient adds cost, so "auto" takes it wherever it fits
                           " offload.weights=stream device.link_bandwidth=10MB/s";
  const std::string a = testing::fresh_path("strata_layer_major_train", "room_layer"),
                    b = testing::fresh_path("strata_layer_major_train", "room_auto"),
                    c = testing::fresh_path("strata_layer_major_train", "room_explicit"),
                    d = testing::fresh_path("strata_layer_major_train", "room_micro");
  const testing::ProcessResult lm =
      testing::run_strata("train " + args + " offload.accumulation=layer_major checkpoint.output_dir=" + a);
  testing::check_run(lm, 0, {"layer-major, each layer's weights cross twice per optimizer step"});
  std::ifstream plan_in(a + "/plan.json");
  const nlohmann::json plan = nlohmann::json::parse(plan_in);
  const double host_total = plan["tiers"]["host"].get<double>() + plan["tiers"]["host_pinned"].get<double>();
  double data = 0;
  for (const nlohmann::json& st : plan["states"])
    if (st["kind"].get<std::string>().rfind("tokenized data", 0) == 0) data = st["bytes"].get<double>();
  REQUIRE(data > 4e6);  // the quickstart corpus: 1377 rows of 256 tokens, well above the resident set's jitter
  const std::string budget = " offload.host_memory=" + std::to_string(int64_t(host_total - data / 2)) + "B";

  const testing::ProcessResult au =
      testing::run_strata("train " + args + budget + " offload.accumulation=auto checkpoint.output_dir=" + b);
  testing::check_run(au, 0, {"leaves no room for the layer-major schedule", "one micro-batch at a time"});
  CHECK(metric(b, "loss") == metric(a, "loss"));  // the two schedules train alike, bit for bit
  // the bytes over the link are micro_batch's (a run with room to spare), more than layer-major's
  testing::check_run(testing::run_strata("train " + args + " offload.accumulation=micro_batch checkpoint.output_dir=" + d),
                     0, {"one micro-batch at a time"});
  const std::vector<double> lm_link = metric(a, "link_bytes"), au_link = metric(b, "link_bytes");
  REQUIRE(lm_link.size() == 2);
  CHECK(au_link == metric(d, "link_bytes"));
  CHECK(au_link[1] > lm_link[1]);
  std::ifstream au_plan_in(b + "/plan.json");
  const nlohmann::json au_plan = nlohmann::json::parse(au_plan_in);
  CHECK(au_plan["tiers"]["host"].get<double>() + au_plan["tiers"]["host_pinned"].get<double>() <
        host_total - data / 2);

  const testing::ProcessResult ex =
      testing::run_strata("train " + args + budget + " offload.accumulation=layer_major checkpoint.output_dir=" + c);
  testing::check_run(ex, 3, {"offload.host_memory"}, {"step 1/"});
}

TEST_CASE("an explicit layer_major where it does not apply is refused with the reason", "[train][layer_major]") {
  const std::string out = testing::fresh_path("strata_layer_major_train", "tied");
  try {
    train_run(recipe(out, "layer_major", {}));  // the quickstart's tied lm_head
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::input);
    CHECK_THAT(e.what(), Catch::Contains("tied lm_head") && Catch::Contains("offload.accumulation = \"micro_batch\""));
  }
  CHECK_THROWS_WITH(recipe(out, "layered", {}), Catch::Contains("offload.accumulation must be"));
}

}  // namespace strata
