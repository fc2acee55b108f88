// A short training run on the bundled quickstart: the loss falls, metrics.jsonl has a record
// per step with the documented fields, the exported model reloads, and two runs are identical.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "src/core/error.h"
#include <cmath>
#include "src/recipe/recipe.h"
#include "src/train/trainer.h"
#include "tests/testing.h"

namespace strata {

static Recipe small_recipe(const std::string& out, std::vector<std::string> extra = {}) {
  std::vector<std::string> o = {"train.max_steps=25", "data.sequence_len=64", "train.micro_batch_size=4",
                                "train.gradient_accumulation_steps=2", "optim.warmup_steps=3",
                                "checkpoint.output_dir=" + out, "train.log_steps=100",
                                "checkpoint.save_dtype=f32"};
  o.insert(o.end(), extra.begin(), extra.end());
  return recipe_load(testing::source_path("recipes/quickstart.toml"), o);
}

// Every exported tensor of two runs, compared bit for bit.
static void require_same_weights(const std::string& a, const std::string& b) {
  SafetensorsDir x = SafetensorsDir::open(a), y = SafetensorsDir::open(b);
  REQUIRE(x.names() == y.names());
  for (const auto& name : x.names()) {
    const SafetensorsEntry* ex = x.find(name);
    REQUIRE(y.find(name) != nullptr);
    std::vector<float> vx(size_t(ex->end - ex->begin) / 4), vy(vx.size());
    x.read(name, DType::f32, vx.data());
    y.read(name, DType::f32, vy.data());
    INFO(name);
    REQUIRE(vx == vy);
  }
}

static std::string tmp_out(const char* name) {
  std::string out = (std::filesystem::temp_directory_path() / name).string();
  std::filesystem::remove_all(out);
  return out;
}

TEST_CASE("training the quickstart model lowers the loss and writes metrics and a model", "[train]") {
  const std::string out = (std::filesystem::temp_directory_path() / "strata_train_a").string();
  std::filesystem::remove_all(out);
  TrainSummary s = train_run(small_recipe(out));
  REQUIRE(s.losses.size() == 25);
  CHECK(s.losses.front() > 5.0);                   // ~log(256) = 5.55 at init
  double last = (s.losses[22] + s.losses[23] + s.losses[24]) / 3;
  CHECK(last < s.losses.front() - 1.0);            // a clear fall, not noise

  std::ifstream m(out + "/metrics.jsonl");
  std::string line;
  int n = 0;
  while (std::getline(m, line)) {
    auto j = nlohmann::json::parse(line);
    for (const char* k : {"step", "loss", "lr", "grad_norm", "tokens", "tokens_per_s", "mfu", "step_s",
                          "compute_s", "h2d_wait_s", "d2h_wait_s", "optimizer_s", "device_peak_bytes",
                          "host_bytes", "link_bytes"})
      REQUIRE(j.contains(k));
    ++n;
  }
  CHECK(n == 25);
  SafetensorsDir exported = SafetensorsDir::open(out + "/final");
  CHECK(exported.find("model.embed_tokens.weight") != nullptr);
  CHECK(exported.find("lm_head.weight") == nullptr);  // tied
  CHECK(std::filesystem::exists(out + "/final/config.json"));

  SECTION("a second run of the same recipe is bit-identical") {
    const std::string out2 = tmp_out("strata_train_b");
    TrainSummary s2 = train_run(small_recipe(out2));
    CHECK(s2.losses == s.losses);
    require_same_weights(out + "/final", out2 + "/final");
  }
}

TEST_CASE("streamed and resident runs give bit-identical losses and final weights", "[train][engine]") {
  const std::string a = tmp_out("strata_train_resident"), b = tmp_out("strata_train_streamed");
  TrainSummary resident = train_run(small_recipe(a, {"offload.weights=device", "offload.checkpoints=device"}));
  TrainSummary streamed = train_run(small_recipe(b, {"offload.weights=stream", "offload.checkpoints=host",
                                                     "device.link_bandwidth=2GB/s"}));
  CHECK(resident.losses == streamed.losses);
  require_same_weights(a + "/final", b + "/final");
  // offload.weights = WeightsMode::automatic (the default) keeps this small model resident: the resident run's
  // link bytes, fewer than the streamed run's (each layer's weights cross once per step, after
  // the update, instead of twice: forward and backward)
  const std::string c = tmp_out("strata_train_auto");
  TrainSummary automatic = train_run(small_recipe(c, {"offload.checkpoints=device"}));
  CHECK(automatic.losses == resident.losses);
  require_same_weights(a + "/final", c + "/final");
  const auto link = [](const std::string& out) {
    std::vector<double> v;
    for (const auto& j : testing::metrics_records(out, "link_bytes")) v.push_back(j["link_bytes"].get<double>());
    return v;
  };
  const std::vector<double> auto_link = link(c), resident_link = link(a), streamed_link = link(b);
  REQUIRE(auto_link.size() == resident.losses.size());
  CHECK(auto_link == resident_link);
  REQUIRE(streamed_link.size() == auto_link.size());
  for (size_t s = 1; s < auto_link.size(); ++s) CHECK(auto_link[s] < streamed_link[s]);
  // offload.resident_layers: the first of the 4 layers keeps its own slot, the other 3 take turns
  // in two shared slots. The same bits; per step (after the first) the link moves more than the
  // resident run (the 3 cross again each micro-batch) and less than the streamed one. (With 2
  // resident, 2 streamed layers would hold their 2 slots all step: the resident run's bytes.)
  const std::string d = tmp_out("strata_train_mixed");
  TrainSummary mixed = train_run(small_recipe(d, {"offload.weights=stream", "offload.resident_layers=1",
                                                  "offload.checkpoints=device"}));
  CHECK(mixed.losses == resident.losses);
  require_same_weights(a + "/final", d + "/final");
  const std::vector<double> mixed_link = link(d);
  REQUIRE(mixed_link.size() == auto_link.size());
  for (size_t s = 1; s < mixed_link.size(); ++s) {
    CHECK(mixed_link[s] > resident_link[s]);
    CHECK(mixed_link[s] < streamed_link[s]);
  }
  // more resident layers than the model has, or beside offload.weights = "device": refused by name
  CHECK_THROWS_WITH(train_run(small_recipe(tmp_out("strata_train_toomany"), {"offload.weights=stream",
                                                                             "offload.resident_layers=5"})),
                    Catch::Contains("offload.resident_layers (5) is more than the model's 4 layers"));
  CHECK_THROWS_WITH(small_recipe(tmp_out("strata_train_residentdevice"), {"offload.weights=device",
                                                                          "offload.resident_layers=2"}),
                    Catch::Contains("offload.resident_layers applies to streamed weights"));
  CHECK_THROWS_WITH(small_recipe(tmp_out("strata_train_residentneg"), {"offload.resident_layers=-2"}),
                    Catch::Contains("offload.resident_layers must be >= 0 (layers), or -1 for the planner's choice"));
  CHECK_THROWS_WITH(small_recipe(tmp_out("strata_train_residentzo"), {"optim.type=zo-sgd", "offload.resident_layers=2"}),
                    Catch::Contains("optim.type = \"zo-sgd\" always streams its weights"));
  CHECK_THROWS_WITH(small_recipe(tmp_out("strata_train_badnormpass"), {"offload.norm_pass=twice"}),
                    Catch::Contains("offload.norm_pass must be \"auto\", \"on\" or \"off\" (not \"twice\")"));
  // an unknown mode is refused when the recipe is read, naming the three
  CHECK_THROWS_WITH(small_recipe(tmp_out("strata_train_badweights"), {"offload.weights=resident"}),
                    Catch::Contains("offload.weights must be \"auto\", \"stream\" or \"device\""));
}

TEST_CASE("the thread count does not change results", "[train][engine]") {
  const std::string a = tmp_out("strata_train_1thread"), b = tmp_out("strata_train_2threads");
  TrainSummary one = train_run(small_recipe(a, {"train.max_steps=8", "device.cpu_threads=1"}));
  TrainSummary two = train_run(small_recipe(b, {"train.max_steps=8", "device.cpu_threads=2"}));
  CHECK(one.losses == two.losses);
  require_same_weights(a + "/final", b + "/final");
}

}  // namespace strata

namespace strata {

TEST_CASE("training text goes through a tokenizer.json when the recipe names one", "[train]") {
  const std::string out = tmp_out("strata_train_tok");
  std::filesystem::create_directories(out);
  // a small Llama with the 32k SentencePiece-style vocabulary of the real tokenizer fixture
  std::ofstream(out + "/config.json") << R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
    "num_key_value_heads": 1, "vocab_size": 32000, "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": true})";
  Recipe r = recipe_load(testing::source_path("recipes/quickstart.toml"),
                         {"model.config=" + out + "/config.json",
                          "data.tokenizer=" + testing::tokenizer_fixture("sp-bpe-32k"),
                          "train.max_steps=3", "data.sequence_len=64", "train.micro_batch_size=2",
                          "checkpoint.output_dir=" + out + "/run", "optim.warmup_steps=0"});
  TrainSummary s = train_run(r);
  REQUIRE(s.losses.size() == 3);
  CHECK(s.losses[0] == Approx(std::log(32000.0)).epsilon(0.05));  // ~uniform over the real vocab
  CHECK(s.losses[2] < s.losses[0]);

  // a tokenizer with more ids than the model's vocabulary is refused
  std::ofstream(out + "/small.json") << R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
    "vocab_size": 300, "max_position_embeddings": 512, "tie_word_embeddings": true})";
  r.model_config = out + "/small.json";
  CHECK_THROWS_AS(train_run(r), Error);
}

}  // namespace strata
