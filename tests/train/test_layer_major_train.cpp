// offload.accumulation end to end (src/train/accumulation.h): a run whose steps accumulate 4
// micro-batches trains bit-identically under "layer_major", "micro_batch" and "auto" — full
// fine-tuning with and without clipping (LoRA: micro_batch only) — while metrics.jsonl's link_bytes shows the
// layer-major saving; an explicit "layer_major" where it does not apply is refused.
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

std::vector<double> link_bytes(const std::string& out) {
  std::ifstream m(out + "/metrics.jsonl");
  std::vector<double> v;
  for (std::string line; std::getline(m, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("link_bytes")) v.push_back(j["link_bytes"].get<double>());
  }
  return v;
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
    CHECK(au_link == lm_link);  // auto chose layer-major
    for (size_t s = 0; s < 4; ++s) {
      INFO("step " << s + 1 << ": layer_major " << lm_link[s] << " bytes, micro_batch " << mb_link[s]);
      CHECK(lm_link[s] < 0.5 * mb_link[s]);
    }
    std::printf("layer-major train (%s): link bytes per step %.0f (micro_batch %.0f)\n", clip, lm_link[1], mb_link[1]);
  }
}

TEST_CASE("LoRA runs the micro_batch schedule: auto takes it, an explicit layer_major is refused", "[train][layer_major][lora]") {
  // each micro-batch's adapter gradients land on their own (data parallel, dropout masks keyed
  // by the micro-batch: offload/engine.cpp lora_grads_land), so LoRA does not run layer-major
  auto lora_recipe = [](const std::string& out, const std::string& accumulation) {
    return recipe_load(testing::source_path("recipes/sft-tiny/recipe.toml"),
                       {"model.dtype=bf16", "lora.r=4", "lora.alpha=8", "data.sequence_len=64", "train.micro_batch_size=2",
                        "train.gradient_accumulation_steps=4", "train.max_steps=2", "train.log_steps=100",
                        "optim.warmup_steps=1", "optim.max_grad_norm=0", "checkpoint.save_steps=0",
                        "checkpoint.output_dir=" + out, "offload.accumulation=" + accumulation});
  };
  const std::string a = testing::fresh_path("strata_layer_major_train", "lora_micro"),
                    b = testing::fresh_path("strata_layer_major_train", "lora_auto"),
                    c = testing::fresh_path("strata_layer_major_train", "lora_layer");
  const TrainSummary mb = train_run(lora_recipe(a, "micro_batch"));
  const TrainSummary au = train_run(lora_recipe(b, "auto"));
  REQUIRE(mb.losses.size() == 2);
  CHECK(au.losses == mb.losses);
  CHECK(link_bytes(b) == link_bytes(a));
  try {
    train_run(lora_recipe(c, "layer_major"));
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::input);
    CHECK_THAT(e.what(), Catch::Contains("LoRA") && Catch::Contains("offload.accumulation = \"micro_batch\""));
  }
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
