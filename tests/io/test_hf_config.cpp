// Tests for io/hf_config: the four families with the key sets of real checkpoints, transformers'
// class defaults, RoPE scaling, explicit head_dim, and bad configs whose errors name file and key.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <array>
#include <filesystem>
#include <fstream>

#include "io/hf_config.h"
#include "src/core/error.h"

namespace fs = std::filesystem;
using namespace strata;

namespace {

// Key sets as published in the checkpoints' config.json (values too).
const char* kLlama31_8B = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
  "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072,
  "mlp_bias": false, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
  "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0", "use_cache": true, "vocab_size": 128256})";

const char* kMistral7B = R"({
  "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
  "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32,
  "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
  "sliding_window": 4096, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.34.0.dev0", "use_cache": true, "vocab_size": 32000})";

const char* kQwen25_7B = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02,
  "intermediate_size": 18944, "max_position_embeddings": 131072, "max_window_layers": 28,
  "model_type": "qwen2", "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
  "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "transformers_version": "4.40.1", "use_cache": true, "use_mrope": false,
  "use_sliding_window": false, "vocab_size": 152064})";

const char* kQwen3_8B = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 12288,
  "max_position_embeddings": 40960, "max_window_layers": 36, "model_type": "qwen3",
  "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
  "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 151936})";

// Qwen3-0.6B: head_dim 128 while hidden_size / heads = 64, tied embeddings.
const char* kQwen3_06B = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 1024, "intermediate_size": 3072, "max_position_embeddings": 40960, "model_type": "qwen3",
  "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
  "rope_scaling": null, "rope_theta": 1000000, "tie_word_embeddings": true, "vocab_size": 151936})";

nlohmann::json parsed(const char* text) { return nlohmann::json::parse(text); }

ModelConfig parse_edit(const char* base, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = parsed(base);
  edit(j);
  return hf_config_parse(j.dump(), "/models/x/config.json");
}

// Expects an input error naming the origin and containing every phrase.
void require_config_error(const std::string& text, const std::vector<std::string>& phrases) {
  try {
    hf_config_parse(text, "/models/x/config.json");
    FAIL("bad config accepted: " << text);
  } catch (const Error& e) {
    INFO(e.what());
    CHECK(e.kind() == ErrorKind::input);
    CHECK_THAT(e.what(), Catch::Contains("/models/x/config.json"));
    for (const auto& p : phrases) CHECK_THAT(e.what(), Catch::Contains(p));
  }
}

void require_edit_error(const char* base, const std::function<void(nlohmann::json&)>& edit,
                        const std::vector<std::string>& phrases) {
  nlohmann::json j = parsed(base);
  edit(j);
  require_config_error(j.dump(), phrases);
}

// What a published checkpoint's dimensions must read as. sizes: hidden, intermediate, layers, heads,
// kv heads, head_dim, vocab, max positions.
struct Dims {
  const char* family;
  const char* architecture;
  std::array<int64_t, 8> sizes;
  double rms_norm_eps, rope_theta;
};

void check_dims(const ModelConfig& c, const Dims& d) {
  INFO(d.architecture);
  CHECK(c.family == d.family);
  CHECK(c.architecture == d.architecture);
  const std::array<int64_t, 8> sizes = {c.hidden_size,         c.intermediate_size, c.num_hidden_layers,
                                        c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                                        c.vocab_size,          c.max_position_embeddings};
  CHECK(sizes == d.sizes);
  CHECK(c.rms_norm_eps == d.rms_norm_eps);
  CHECK(c.rope_theta == d.rope_theta);
}

}  // namespace

TEST_CASE("hf_config: Llama-3.1-8B, Mistral-7B-v0.1, Qwen2.5-7B, Qwen3-8B parse as transformers reads them", "[io]") {
  ModelConfig l = hf_config_parse(kLlama31_8B, "llama.json");
  check_dims(l, {"llama", "LlamaForCausalLM", {4096, 14336, 32, 32, 8, 128, 128256, 131072}, 1e-5, 500000.0});
  CHECK(l.rope_scaling.type == "llama3");
  CHECK(l.rope_scaling.factor == 8.0);
  CHECK(l.rope_scaling.low_freq_factor == 1.0);
  CHECK(l.rope_scaling.high_freq_factor == 4.0);
  CHECK(l.rope_scaling.original_max_position_embeddings == 8192);
  CHECK(!l.tie_word_embeddings);
  CHECK((!l.qkv_bias && !l.o_bias && !l.qk_norm && !l.mlp_bias));
  CHECK(l.sliding_window == 0);
  CHECK(l.torch_dtype == "bfloat16");
  CHECK(l.raw["bos_token_id"] == 128000);

  ModelConfig m = hf_config_parse(kMistral7B, "mistral.json");
  check_dims(m, {"mistral", "MistralForCausalLM", {4096, 14336, 32, 32, 8, 128, 32000, 32768}, 1e-5, 10000.0});
  CHECK(m.rope_scaling.type.empty());
  CHECK(m.sliding_window == 4096);
  CHECK(m.max_window_layers == 0);
  CHECK((!m.qkv_bias && !m.o_bias && !m.qk_norm && !m.mlp_bias));

  ModelConfig q2 = hf_config_parse(kQwen25_7B, "qwen2.json");
  check_dims(q2, {"qwen2", "Qwen2ForCausalLM", {3584, 18944, 28, 28, 4, 128, 152064, 131072}, 1e-6, 1e6});
  CHECK(q2.qkv_bias);
  CHECK(!q2.o_bias);
  CHECK(!q2.qk_norm);
  CHECK(q2.sliding_window == 0);  // "sliding_window": 131072 but use_sliding_window is false
  CHECK(!q2.tie_word_embeddings);

  ModelConfig q3 = hf_config_parse(kQwen3_8B, "qwen3.json");
  // rope_theta is written as the integer 1000000
  check_dims(q3, {"qwen3", "Qwen3ForCausalLM", {4096, 12288, 36, 32, 8, 128, 151936, 40960}, 1e-6, 1e6});
  CHECK(q3.rope_scaling.type.empty());
  CHECK(q3.qk_norm);
  CHECK((!q3.qkv_bias && !q3.o_bias));
  CHECK(q3.sliding_window == 0);

  CHECK(hf_config_supported_architectures() ==
        std::vector<std::string>{"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                                 "Gemma3ForCausalLM", "Olmo2ForCausalLM", "Phi3ForCausalLM", "Qwen3MoeForCausalLM",
                                 "MixtralForCausalLM"});
}

TEST_CASE("hf_config: explicit head_dim different from hidden/heads, tied embeddings, biases", "[io]") {
  ModelConfig c = hf_config_parse(kQwen3_06B, "qwen3-0.6b.json");
  CHECK(c.head_dim == 128);
  CHECK(c.hidden_size / c.num_attention_heads == 64);
  CHECK(c.tie_word_embeddings);

  ModelConfig l = parse_edit(kLlama31_8B, [](auto& j) {
    j["head_dim"] = 96;
    j["attention_bias"] = true;
    j["mlp_bias"] = true;
  });
  CHECK(l.head_dim == 96);
  CHECK((l.qkv_bias && l.o_bias && l.mlp_bias));

  ModelConfig q3 = parse_edit(kQwen3_8B, [](auto& j) { j["attention_bias"] = true; });
  CHECK((q3.qkv_bias && q3.o_bias));
  // transformers' MistralAttention has no bias whatever the config says.
  ModelConfig m = parse_edit(kMistral7B, [](auto& j) { j["attention_bias"] = true; });
  CHECK((!m.qkv_bias && !m.o_bias));
  // Qwen2 biases are fixed by the architecture.
  ModelConfig q2 = parse_edit(kQwen25_7B, [](auto& j) { j["attention_bias"] = false; });
  CHECK((q2.qkv_bias && !q2.o_bias));
}

TEST_CASE("hf_config: transformers' class defaults fill absent keys", "[io]") {
  const char* minimal_llama =
      R"({"model_type": "llama", "hidden_size": 96, "intermediate_size": 200, "num_hidden_layers": 3,
          "num_attention_heads": 6, "vocab_size": 101})";
  ModelConfig l = hf_config_parse(minimal_llama, "min.json");
  CHECK(l.architecture == "LlamaForCausalLM");  // derived from model_type
  CHECK(l.num_key_value_heads == 6);
  CHECK(l.head_dim == 16);
  CHECK(l.max_position_embeddings == 2048);
  CHECK(l.rms_norm_eps == 1e-6);
  CHECK(l.rope_theta == 10000.0);
  CHECK(l.rope_scaling.type.empty());
  CHECK((!l.tie_word_embeddings && !l.qkv_bias && !l.o_bias && !l.mlp_bias && !l.qk_norm));
  CHECK(l.torch_dtype.empty());

  // Family from architectures alone; mistral's class defaults: 8 kv heads, 4096 sliding window.
  ModelConfig m = hf_config_parse(
      R"({"architectures": ["MistralForCausalLM"], "hidden_size": 64, "intermediate_size": 100,
          "num_hidden_layers": 2, "num_attention_heads": 8, "vocab_size": 50})",
      "m.json");
  CHECK(m.family == "mistral");
  CHECK(m.num_key_value_heads == 8);
  CHECK(m.sliding_window == 4096);
  CHECK(m.max_position_embeddings == 131072);
  CHECK(parse_edit(kMistral7B, [](auto& j) { j["sliding_window"] = nullptr; }).sliding_window == 0);

  // qwen3: head_dim defaults to 128 (not hidden/heads), kv heads to 32, rope_theta to 10000.
  ModelConfig q3 = hf_config_parse(
      R"({"model_type": "qwen3", "hidden_size": 64, "intermediate_size": 100, "num_hidden_layers": 2,
          "num_attention_heads": 32, "vocab_size": 50})",
      "q3.json");
  CHECK(q3.head_dim == 128);
  CHECK(q3.num_key_value_heads == 32);
  CHECK(q3.rope_theta == 10000.0);
  CHECK(q3.max_position_embeddings == 32768);
  CHECK(q3.qk_norm);
  // null means "fall back": head_dim -> hidden/heads, kv heads -> heads.
  ModelConfig q3n = parse_edit(kQwen3_8B, [](auto& j) {
    j["head_dim"] = nullptr;
    j["num_key_value_heads"] = nullptr;
  });
  CHECK(q3n.head_dim == 4096 / 32);
  CHECK(q3n.num_key_value_heads == 32);

  // qwen2 sliding window only when enabled; then layers >= max_window_layers use it.
  ModelConfig q2 = parse_edit(kQwen25_7B, [](auto& j) {
    j["use_sliding_window"] = true;
    j["sliding_window"] = 4096;
    j["max_window_layers"] = 21;
  });
  CHECK(q2.sliding_window == 4096);
  CHECK(q2.max_window_layers == 21);

  // Newer transformers: "rope_parameters" and "dtype".
  ModelConfig v5 = parse_edit(kQwen3_8B, [](auto& j) {
    j.erase("rope_theta");
    j.erase("rope_scaling");
    j.erase("torch_dtype");
    j["dtype"] = "bfloat16";
    j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 5e6}};
  });
  CHECK(v5.rope_theta == 5e6);
  CHECK(v5.rope_scaling.type == "default");
  CHECK(v5.torch_dtype == "bfloat16");
}

TEST_CASE("hf_config: rope_scaling types (llama3, linear, legacy 'type' key) and unsupported ones", "[io]") {
  ModelConfig lin = parse_edit(kLlama31_8B, [](auto& j) { j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.5}}; });
  CHECK(lin.rope_scaling.type == "linear");
  CHECK(lin.rope_scaling.factor == 2.5);
  ModelConfig none = parse_edit(kLlama31_8B, [](auto& j) { j["rope_scaling"] = nullptr; });
  CHECK(none.rope_scaling.type.empty());
  ModelConfig dflt = parse_edit(kLlama31_8B, [](auto& j) { j["rope_scaling"] = {{"rope_type", "default"}}; });
  CHECK(dflt.rope_scaling.type == "default");

  require_edit_error(kLlama31_8B, [](auto& j) { j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}}; },
                     {"'rope_scaling.rope_type'", "'yarn'", "supported: default, linear, llama3"});
  require_edit_error(kLlama31_8B, [](auto& j) { j["rope_scaling"].erase("low_freq_factor"); },
                     {"'rope_scaling.low_freq_factor'", "missing"});
  require_edit_error(kLlama31_8B, [](auto& j) { j["rope_scaling"]["high_freq_factor"] = 0.5; },
                     {"'rope_scaling.high_freq_factor'", "greater than low_freq_factor"});
  require_edit_error(kLlama31_8B, [](auto& j) { j["rope_scaling"] = {{"factor", 8.0}}; }, {"rope_type", "missing"});
  require_edit_error(kLlama31_8B, [](auto& j) { j["rope_scaling"] = "llama3"; }, {"'rope_scaling'", "object or null"});
}

TEST_CASE("hf_config: bad configs name the file and the key and say what is wrong", "[io]") {
  require_config_error("{\"model_type\": \"llama\",", {"not valid JSON", "line 1"});
  require_config_error("[1, 2]", {"must be a JSON object"});
  require_config_error(R"({"hidden_size": 8})", {"neither 'model_type' nor 'architectures'", "LlamaForCausalLM"});
  require_edit_error(kLlama31_8B, [](auto& j) { j.erase("hidden_size"); }, {"'hidden_size'", "missing"});
  require_edit_error(kLlama31_8B, [](auto& j) { j["hidden_size"] = "4096"; },
                     {"'hidden_size'", "must be an integer, got string"});
  require_edit_error(kLlama31_8B, [](auto& j) { j["vocab_size"] = 128256.5; }, {"'vocab_size'", "must be an integer"});
  require_edit_error(kLlama31_8B, [](auto& j) { j["num_hidden_layers"] = 0; }, {"'num_hidden_layers'", "positive"});
  require_edit_error(kLlama31_8B, [](auto& j) { j["intermediate_size"] = -5; }, {"'intermediate_size'", "positive"});
  require_edit_error(kLlama31_8B, [](auto& j) { j["num_key_value_heads"] = 6; },
                     {"'num_key_value_heads'", "(6) must divide num_attention_heads (32)"});
  require_edit_error(kLlama31_8B, [](auto& j) { j["head_dim"] = 127; }, {"'head_dim'", "even"});
  require_edit_error(kLlama31_8B, [](auto& j) { j["hidden_size"] = 4000; j["num_attention_heads"] = 48; j["num_key_value_heads"] = 8; },
                     {"'hidden_size'", "not divisible", "head_dim"});
  require_edit_error(kLlama31_8B, [](auto& j) { j["rms_norm_eps"] = 0; }, {"'rms_norm_eps'", "positive"});
  require_edit_error(kLlama31_8B, [](auto& j) { j["rope_theta"] = "1e4"; }, {"'rope_theta'", "must be a number"});
  require_edit_error(kLlama31_8B, [](auto& j) { j["tie_word_embeddings"] = 0; },
                     {"'tie_word_embeddings'", "true or false"});
  require_edit_error(kLlama31_8B, [](auto& j) { j["hidden_act"] = "gelu"; }, {"'hidden_act'", "silu"});
  // Unsupported architecture / model_type list the supported ones.
  const std::vector<std::string> all = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                                        "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "MixtralForCausalLM"};
  auto with = [](std::vector<std::string> v, const std::string& s) { v.push_back(s); return v; };
  require_edit_error(kLlama31_8B, [](auto& j) { j["architectures"] = {"GPT2LMHeadModel"}; j.erase("model_type"); },
                     with(all, "'GPT2LMHeadModel'"));
  require_edit_error(kLlama31_8B, [](auto& j) { j["model_type"] = "gemma"; }, with(all, "'gemma'"));
  require_edit_error(kLlama31_8B, [](auto& j) { j["architectures"] = {"Qwen2ForCausalLM"}; },
                     {"'model_type'", "'llama'", "'Qwen2ForCausalLM'", "same family"});
  require_edit_error(kLlama31_8B, [](auto& j) { j["architectures"] = nlohmann::json::array(); }, {"'architectures'"});
  // qwen2's class default for absent kv heads is 32, which does not divide 28: say so.
  require_edit_error(kQwen25_7B, [](auto& j) { j.erase("num_key_value_heads"); },
                     {"'num_key_value_heads'", "(32)", "absent"});
}

TEST_CASE("hf_config: load from a file or a directory, save writes the raw JSON back", "[io]") {
  fs::path dir = fs::temp_directory_path() / ("strata_cfg_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  {
    std::ofstream(dir / "config.json") << kQwen3_8B;
  }
  ModelConfig a = hf_config_load(dir.string());
  ModelConfig b = hf_config_load((dir / "config.json").string());
  CHECK(a.raw == b.raw);
  CHECK(a.family == "qwen3");
  fs::path out = dir / "saved.json";
  hf_config_save(a, out.string());
  std::ifstream in(out);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  CHECK(text == a.raw.dump(2) + "\n");
  CHECK(text.find("\n  \"architectures\": [\n    \"Qwen3ForCausalLM\"\n  ],") != std::string::npos);
  ModelConfig c = hf_config_load(out.string());
  CHECK(c.raw == a.raw);
  CHECK(c.raw["rope_scaling"].is_null());
  CHECK(!fs::exists(dir / "saved.json.tmp"));
  fs::create_directories(dir / "out");
  hf_config_save(c, (dir / "out").string());  // a directory gets config.json
  CHECK(hf_config_load((dir / "out").string()).raw == a.raw);
  try {
    hf_config_load((dir / "nope").string());
    FAIL("loaded a missing config");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::io);
    CHECK_THAT(e.what(), Catch::Contains((dir / "nope").string()));
  }
  fs::remove_all(dir);
}
