// Gemma 3 (text), OLMo 2 and the sliding window of the dense families, against transformers'
// own modeling classes run in float64 (tools/golden/make_gemma_goldens.py: tests/golden/gemma3,
// olmo2, qwen2_window): config.json parsing (gemma3_text, a gemma3 checkpoint's text_config,
// olmo2, qwen2's layer rule and layer_types), the kinds each layer gets, `strata grad`'s loss
// within 1e-5 relative and every gradient within 1e-4 relative L2 on the CPU backend (f32
// weights, bf16 files for gemma3), bf16 matrices near them, and greedy generation token for token.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "io/safetensors.h"
#include "models/gemma_layer.h"
#include "offload/engine/generator.h"
#include "offload/state/model_io.h"
#include "src/recipe/recipe_modes.h"
#include "tests/models/gemma_testing.h"
#include "tests/testing.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

ModelConfig parse(const nlohmann::json& j) { return hf_config_parse(j.dump(), "test config.json"); }

nlohmann::json gemma_json() {
  return {{"architectures", {"Gemma3ForCausalLM"}}, {"model_type", "gemma3_text"}, {"hidden_size", 40},
          {"intermediate_size", 58}, {"num_hidden_layers", 7}, {"num_attention_heads", 4},
          {"num_key_value_heads", 2}, {"head_dim", 12}, {"vocab_size", 67}, {"sliding_window", 4},
          {"sliding_window_pattern", 3}, {"query_pre_attn_scalar", 24}, {"rope_local_base_freq", 100.0},
          {"rope_theta", 10000.0}, {"rope_scaling", {{"rope_type", "linear"}, {"factor", 2.0}}}};
}

}  // namespace

TEST_CASE("gemma3_text, gemma3 and olmo2 configs parse as transformers reads them", "[gemma][hf_config]") {
  const ModelConfig g = parse(gemma_json());
  CHECK(g.family == "gemma3_text");
  CHECK(g.tie_word_embeddings);  // Gemma3TextConfig's default
  CHECK(g.query_pre_attn_scalar == 24);
  CHECK(g.rope_theta == 10000.0);
  CHECK(g.rope_local_theta == 100.0);
  CHECK(g.rope_scaling.type == "linear");
  CHECK(g.sliding_window == 4);
  // sliding_window_pattern 3: layer i slides unless (i + 1) % 3 == 0
  CHECK(g.sliding_layers == std::vector<uint8_t>{1, 1, 0, 1, 1, 0, 1});
  const std::vector<const LayerKind*> kinds = model_layer_kinds(g);
  CHECK(kinds[0] == &gemma_layer_kind(true, true));
  CHECK(kinds[2] == &gemma_layer_kind(false, false));
  CHECK(kinds[3] == &gemma_layer_kind(true, false));
  // the global table then the local one; the scale from query_pre_attn_scalar
  const std::vector<float> inv = model_rope_inv_freq(g);
  REQUIRE(inv.size() == 12);
  CHECK(inv[0] == 0.5f);            // 1 / 10000^0, divided by the linear factor 2
  CHECK(inv[6] == 1.0f);            // the local table: 1 / 100^0, unscaled
  CHECK(inv[7] == 1.0f / std::pow(100.0f, 2.0f / 12.0f));
  CHECK(model_attention_scale(g) == float(1.0 / std::sqrt(24.0)));
  CHECK(gemma_embed_scale(40, DType::f32) == float(std::sqrt(40.0)));
  CHECK(gemma_embed_scale(40, DType::bf16) == 6.3125f);  // bf16(6.3245553)

  // layer_types, when given, decide; and newer configs' rope_parameters per attention type
  nlohmann::json lt = gemma_json();
  lt["num_hidden_layers"] = 3;
  lt["layer_types"] = {"full_attention", "sliding_attention", "full_attention"};
  lt.erase("rope_scaling");
  lt["rope_parameters"] = {{"full_attention", {{"rope_type", "default"}, {"rope_theta", 500.0}}},
                           {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 50.0}}}};
  const ModelConfig g2 = parse(lt);
  CHECK(g2.sliding_layers == std::vector<uint8_t>{0, 1, 0});
  CHECK(g2.rope_theta == 500.0);
  CHECK(g2.rope_local_theta == 50.0);

  // a gemma3 checkpoint: the text model from text_config, tensors under language_model
  const nlohmann::json mm = {{"architectures", {"Gemma3ForConditionalGeneration"}}, {"model_type", "gemma3"},
                             {"text_config", gemma_json()}, {"vision_config", {{"hidden_size", 1152}}}};
  const ModelConfig g3 = parse(mm);
  CHECK(g3.family == "gemma3_text");
  CHECK(g3.text_prefix == "language_model.model.");
  CHECK(model_spec_build(g3, DType::f32).params.rows()[0].name == "language_model.model.embed_tokens.weight");

  // what strata does not implement is refused, naming the key
  nlohmann::json cap = gemma_json();
  cap["final_logit_softcapping"] = 30.0;
  CHECK_THROWS_WITH(parse(cap), Catch::Contains("final_logit_softcapping"));
  nlohmann::json act = gemma_json();
  act["hidden_activation"] = "gelu";
  CHECK_THROWS_WITH(parse(act), Catch::Contains("hidden_activation"));

  const ModelConfig o = parse({{"architectures", {"Olmo2ForCausalLM"}}, {"model_type", "olmo2"}, {"hidden_size", 36},
                               {"intermediate_size", 50}, {"num_hidden_layers", 2}, {"num_attention_heads", 6},
                               {"vocab_size", 71}});
  CHECK(o.family == "olmo2");
  CHECK(o.num_key_value_heads == 6);  // Olmo2Config: None -> heads
  CHECK(o.rms_norm_eps == 1e-5);
  CHECK(model_layer_kinds(o)[1] == &olmo2_layer_kind());
  const ModelSpec os = model_spec_build(o, DType::f32);
  CHECK(os.params.find("model.layers.0.self_attn.q_norm.weight")->shape == Shape{36});  // over the projection
  CHECK(os.params.find("model.layers.0.self_attn.k_norm.weight")->shape == Shape{36});
  CHECK(os.params.find("model.layers.0.input_layernorm.weight") == nullptr);
}

TEST_CASE("a gemma3 checkpoint in transformers 5's layout (model.language_model.) loads, its vision tower skipped",
          "[gemma][golden][models]") {
  // the gemma3 golden's text model re-saved as Gemma3ForConditionalGeneration does in transformers
  // 5 (tensors under model.language_model., a vision tower beside them): strata grad reads it and
  // gives the golden's loss, and names the gradients as the checkpoint does
  testing::TempDir tmp("gemma3_tf5_layout");
  const testing::Golden g = testing::Golden::load("gemma3");
  const SafetensorsDir golden = SafetensorsDir::open(g.dir);
  const std::vector<std::string> names = golden.names();
  std::vector<std::vector<float>> values;
  std::vector<TensorToWrite> out;
  values.reserve(names.size() + 1);
  for (const std::string& n : names) {
    const SafetensorsEntry* e = golden.find(n);
    values.emplace_back(size_t(e->numel()));
    golden.read(n, DType::f32, values.back().data());
    REQUIRE(n.rfind("model.", 0) == 0);
    out.push_back(TensorToWrite{"model.language_model." + n.substr(6), DType::f32, e->shape, values.back().data()});
  }
  values.emplace_back(12, 0.5f);
  out.push_back(TensorToWrite{"model.vision_tower.vision_model.embeddings.patch_embedding.weight", DType::f32, {4, 3},
                              values.back().data()});
  const fs::path model = tmp.path / "model";
  fs::create_directories(model);
  safetensors_write_file((model / "model.safetensors").string(), out);
  std::ifstream text_in(g.dir + "/config.json");
  const nlohmann::json mm = {{"architectures", {"Gemma3ForConditionalGeneration"}}, {"model_type", "gemma3"},
                             {"text_config", nlohmann::json::parse(text_in)}, {"vision_config", {{"hidden_size", 8}}}};
  std::ofstream(model / "config.json") << mm.dump(2);
  CHECK(hf_config_load(model.string()).text_prefix == "model.language_model.");
  const std::string grads = (tmp.path / "g.safetensors").string();
  const auto r = testing::run_strata(str_cat("grad --model ", model.string(), " --batch ", g.dir, "/batch.json --out ",
                                             grads), true);
  INFO(r.out);
  REQUIRE(r.code == 0);
  const double loss = nlohmann::json::parse(r.out)["loss"].get<double>();
  std::printf("gemma3 in transformers 5's layout: loss %.9f, golden %.9f\n", loss, g.loss);
  CHECK(std::abs(loss - g.loss) <= 1e-5 * std::abs(g.loss));
  CHECK(SafetensorsFile::open(grads).find("model.language_model.layers.3.mlp.down_proj.weight"));
}

TEST_CASE("the dense families' sliding layers follow transformers' rules", "[gemma][hf_config][window]") {
  nlohmann::json q = {{"architectures", {"Qwen2ForCausalLM"}}, {"model_type", "qwen2"}, {"hidden_size", 32},
                      {"intermediate_size", 44}, {"num_hidden_layers", 4}, {"num_attention_heads", 4},
                      {"num_key_value_heads", 2}, {"vocab_size", 83}, {"use_sliding_window", true},
                      {"sliding_window", 5}, {"max_window_layers", 2}};
  const ModelConfig c = parse(q);
  CHECK(c.sliding_layers == std::vector<uint8_t>{0, 0, 1, 1});
  const auto kinds = model_layer_kinds(c);
  CHECK(kinds[1] == &dense_layer_kind());
  CHECK(kinds[2] == &dense_layer_kind(true));
  CHECK(kinds[2]->attention_window(LayerDims{.window = 5}) == 5);
  CHECK(kinds[1]->attention_window(LayerDims{.window = 5}) == 0);
  q["use_sliding_window"] = false;  // transformers: sliding_window None, every layer full
  CHECK(parse(q).sliding_layers == std::vector<uint8_t>{0, 0, 0, 0});
  q["use_sliding_window"] = true;
  q["layer_types"] = {"sliding_attention", "full_attention", "full_attention", "sliding_attention"};
  CHECK(parse(q).sliding_layers == std::vector<uint8_t>{1, 0, 0, 1});
  const ModelConfig m = parse({{"architectures", {"MistralForCausalLM"}}, {"model_type", "mistral"},
                               {"hidden_size", 32}, {"intermediate_size", 44}, {"num_hidden_layers", 2},
                               {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"vocab_size", 83},
                               {"sliding_window", 7}});
  CHECK(m.sliding_layers == std::vector<uint8_t>{1, 1});
}

TEST_CASE("strata grad matches transformers' float64 Gemma 3, OLMo 2 and windowed qwen2 on the CPU backend",
          "[gemma][golden][models]") {
  auto dev = device_create(DeviceOptions{});
  for (const char* name : {"gemma3", "olmo2", "qwen2_window"}) {
    INFO(name);
    const gemma_testing::GoldenCheck r = gemma_testing::check_golden(*dev, name, DType::f32, 1e-5, 1e-4);
    std::printf("golden %-12s f32 cpu: loss rel err %.2e, worst gradient rel L2 err %.2e (%s)\n", name, r.loss_error,
                r.worst_grad_error, r.worst_name.c_str());
  }
}

TEST_CASE("Gemma 3 and OLMo 2 in bf16 stay near transformers' float64 reference", "[gemma][golden][models]") {
  // bf16 matmul inputs (8 bits): the golden bf16 tolerances of test_golden_grad.cpp in L2 terms
  auto dev = device_create(DeviceOptions{});
  for (const char* name : {"gemma3", "olmo2"}) {
    INFO(name);
    gemma_testing::check_golden(*dev, name, DType::bf16, 1e-2, 0.1);
  }
}

TEST_CASE("greedy generation equals transformers' on Gemma 3, OLMo 2 and windowed qwen2", "[gemma][generate]") {
  auto dev = device_create(DeviceOptions{});
  for (const char* name : {"gemma3", "olmo2", "qwen2_window"}) {
    INFO(name);
    gemma_testing::check_generation(*dev, name);
  }
}

TEST_CASE("strata generate on the Gemma 3 golden prints transformers' greedy tokens", "[gemma][generate][cli]") {
  // the CLI end to end (model dir, JSON-lines requests, bf16 files read as f32): each request's ids
  // are generate.json's, which transformers' Gemma3ForCausalLM produced in float64
  testing::TempDir tmp("gemma3_generate_cli");
  const testing::Golden g = testing::Golden::load("gemma3");
  std::ifstream in(g.dir + "/generate.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  std::string requests;
  for (const auto& p : j["prompts"]) requests += nlohmann::json{{"input_ids", p}}.dump() + "\n";
  const std::string input = tmp.file("in.jsonl", requests);
  const auto r = testing::run_strata(str_cat("generate --model ", g.dir, " --dtype f32 --max-new-tokens ",
                                             j["max_new_tokens"].get<int64_t>(), " < ", input), true);
  INFO(r.out);
  REQUIRE(r.code == 0);
  std::vector<nlohmann::json> lines;
  std::istringstream out(r.out);
  for (std::string line; std::getline(out, line);)
    if (!line.empty()) lines.push_back(nlohmann::json::parse(line));
  REQUIRE(lines.size() == j["tokens"].size());
  for (size_t i = 0; i < lines.size(); ++i) {
    INFO("request " << i);
    CHECK(lines[i]["ids"] == j["tokens"][i]);
  }
}

}  // namespace strata
