// Phi-3 (models/phi3_layer.h) against transformers' own Phi3ForCausalLM run in float64
// (tools/golden/make_phi3_goldens.py: tests/golden/phi3 with LongRoPE's short factors and a
// sliding window, phi3_long with the long factors, tied, bf16 files): config.json parsing as
// Phi3Config reads it (LongRoPE's factors, original_max_position_embeddings, the attention factor),
// the fused tensors' names and shapes, `strata grad`'s loss within 1e-5 relative and every
// gradient within 1e-4 relative L2 on the CPU backend (f32 weights), bf16 near them, greedy
// generation token for token (phi3_long's on the long table from the prefill on), and the LoRA
// targets of the fused projections.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>

#include "models/phi3_layer.h"
#include "offload/state/lora.h"
#include "tests/models/gemma_testing.h"
#include "tests/models/phi3_testing.h"
#include "tests/testing.h"

namespace strata {
namespace {

ModelConfig parse(const nlohmann::json& j) { return hf_config_parse(j.dump(), "test config.json"); }

nlohmann::json phi3_json() {
  return {{"architectures", {"Phi3ForCausalLM"}}, {"model_type", "phi3"}, {"hidden_size", 40},
          {"intermediate_size", 54}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
          {"num_key_value_heads", 2}, {"vocab_size", 73}, {"max_position_embeddings", 256},
          {"original_max_position_embeddings", 64}, {"rope_theta", 10000.0},
          {"rope_scaling", {{"type", "longrope"}, {"short_factor", {1.0, 1.1, 1.2, 1.3, 1.4}},
                            {"long_factor", {2.0, 3.0, 4.0, 5.0, 6.0}}}}};
}

}  // namespace

TEST_CASE("phi3 configs parse as transformers' Phi3Config reads them", "[phi3][hf_config]") {
  const ModelConfig c = parse(phi3_json());
  CHECK(c.family == "phi3");
  CHECK(c.head_dim == 10);
  CHECK(c.rms_norm_eps == 1e-5);  // Phi3Config's default
  CHECK_FALSE(c.tie_word_embeddings);
  CHECK_FALSE(c.qkv_bias);
  CHECK(c.rope_scaling.type == "longrope");
  CHECK(c.rope_scaling.original_max_position_embeddings == 64);
  CHECK(c.rope_scaling.factor == 4.0);  // max_position_embeddings / original
  // transformers: sqrt(1 + ln(4) / ln(64)) = sqrt(4 / 3)
  CHECK(std::abs(c.rope_scaling.attention_factor - std::sqrt(4.0 / 3.0)) < 1e-15);
  CHECK(model_attention_scale(c) == float(std::sqrt(4.0 / 3.0)) * float(std::sqrt(4.0 / 3.0)) / std::sqrt(10.0f));
  // the short table then the long one: 1 / (factor * base^(2j / D))
  const std::vector<float> inv = model_rope_inv_freq(c);
  REQUIRE(inv.size() == 10);
  CHECK(inv[0] == 1.0f);
  CHECK(inv[1] == 1.0f / (1.1f * std::pow(10000.0f, 2.0f / 10.0f)));
  CHECK(inv[5] == 0.5f);
  CHECK(inv[9] == 1.0f / (6.0f * std::pow(10000.0f, 8.0f / 10.0f)));
  CHECK(c.sliding_layers == std::vector<uint8_t>{0, 0});

  // the fused tensors as the checkpoint names them
  const ModelSpec spec = model_spec_build(c, DType::f32);
  CHECK(spec.params.find("model.layers.0.self_attn.qkv_proj.weight")->shape == Shape{40 + 2 * 20, 40});
  CHECK(spec.params.find("model.layers.1.mlp.gate_up_proj.weight")->shape == Shape{2 * 54, 40});
  CHECK(spec.params.find("model.layers.0.self_attn.q_proj.weight") == nullptr);
  CHECK(spec.layers[0].linear_row(kLayerQkv) != kAbsent);
  CHECK(spec.layers[0].linear_row(0) == kAbsent);  // no q_proj of its own
  CHECK(spec.parameter_count() == 73 * 40 * 2 + 40 + 2 * (2 * 40 + 80 * 40 + 40 * 40 + 108 * 40 + 40 * 54));

  // the top-level original_max_position_embeddings wins (Phi3Config's default 4096 when absent),
  // "su" reads as longrope, a given attention_factor stays, a sliding window slides every layer
  nlohmann::json j = phi3_json();
  j.erase("original_max_position_embeddings");
  j["max_position_embeddings"] = 8192;
  j["rope_scaling"]["type"] = "su";
  j["rope_scaling"]["attention_factor"] = 1.25;
  j["sliding_window"] = 7;
  const ModelConfig s = parse(j);
  CHECK(s.rope_scaling.type == "longrope");
  CHECK(s.rope_scaling.original_max_position_embeddings == 4096);
  CHECK(s.rope_scaling.factor == 2.0);
  CHECK(s.rope_scaling.attention_factor == 1.25);
  CHECK(s.sliding_layers == std::vector<uint8_t>{1, 1});
  CHECK(model_layer_kinds(s)[1] == &phi3_layer_kind(s, true));

  // partial_rotary_factor (Phi-4-mini's 0.75): int(head_dim * factor) rotated dims, the factor lists
  // that long / 2; an odd count, a factor out of (0, 1], or the key on another family is refused
  CHECK(parse(phi3_json()).rotary_dim == 10);
  nlohmann::json partial = phi3_json();
  partial["partial_rotary_factor"] = 0.4;  // head_dim 10 -> 4 dims
  partial["rope_scaling"]["short_factor"] = {1.0, 1.1};
  partial["rope_scaling"]["long_factor"] = {2.0, 3.0};
  // LongRoPE's attention_factor (here sqrt(1 + ln 4 / ln 64)) scales only the rotated dims in
  // transformers: not built for a partial rotary, refused naming it; with factor 1 it is read
  CHECK_THROWS_WITH(parse(partial), Catch::Contains("attention_factor"));
  partial["max_position_embeddings"] = 64;
  CHECK(parse(partial).rotary_dim == 4);
  CHECK(model_rope_inv_freq(parse(partial)).size() == 2 * 2);  // the short table, then the long
  partial["partial_rotary_factor"] = 0.5;                       // 5 dims: odd
  CHECK_THROWS_WITH(parse(partial), Catch::Contains("partial_rotary_factor"));
  partial["partial_rotary_factor"] = 1.5;
  CHECK_THROWS_WITH(parse(partial), Catch::Contains("(0, 1]"));
  nlohmann::json llama_partial = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"},
                                  {"hidden_size", 32}, {"intermediate_size", 40}, {"num_hidden_layers", 1},
                                  {"num_attention_heads", 4}, {"vocab_size", 50}, {"partial_rotary_factor", 0.5}};
  CHECK_THROWS_WITH(parse(llama_partial), Catch::Contains("only phi3"));
  // a malformed table is refused naming the key
  nlohmann::json short_list = phi3_json();
  short_list["rope_scaling"]["long_factor"] = {1.0, 2.0};
  CHECK_THROWS_WITH(parse(short_list), Catch::Contains("rotary_dim / 2 = 5"));
  nlohmann::json yarn = phi3_json();  // yarn is longrope only on phi3
  yarn["model_type"] = "llama", yarn["architectures"] = {"LlamaForCausalLM"};
  yarn["rope_scaling"] = {{"type", "longrope"}, {"factor", 2.0}};
  CHECK_THROWS_WITH(parse(yarn), Catch::Contains("longrope"));
}

TEST_CASE("LoRA on Phi-3 targets the fused projections by PEFT's names", "[phi3][lora]") {
  const ModelSpec spec = model_spec_build(parse(phi3_json()), DType::f32);
  LoraOptions o;
  o.r = 4;
  o.targets = lora_targets_parse({"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}, "test");
  const LoraLayout l = LoraLayout::of(spec, o);
  // one A and one B per fused projection
  CHECK(l.table.find("base_model.model.model.layers.0.self_attn.qkv_proj.lora_A.weight")->shape == Shape{4, 40});
  CHECK(l.table.find("base_model.model.model.layers.0.self_attn.qkv_proj.lora_B.weight")->shape == Shape{80, 4});
  CHECK(l.table.find("base_model.model.model.layers.1.mlp.gate_up_proj.lora_B.weight")->shape == Shape{108, 4});
  CHECK(l.table.size() == 2 * 2 * 4);
  // the dense names of the fused parts are refused with what to write instead
  o.targets = lora_targets_parse({"q_proj", "v_proj"}, "test");
  CHECK_THROWS_WITH(LoraLayout::of(spec, o), Catch::Contains("qkv_proj"));
  o.targets = lora_targets_parse({"qkv_proj", "up_proj"}, "test");
  CHECK_THROWS_WITH(LoraLayout::of(spec, o), Catch::Contains("gate_up_proj"));
  // a Llama-family model has no fused linears: naming only those adapts nothing, refused
  const ModelConfig llama = parse({{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"},
                                   {"hidden_size", 32}, {"intermediate_size", 40}, {"num_hidden_layers", 1},
                                   {"num_attention_heads", 4}, {"vocab_size", 50}});
  o.targets = lora_targets_parse({"qkv_proj"}, "test");
  CHECK_THROWS_WITH(LoraLayout::of(model_spec_build(llama, DType::f32), o), Catch::Contains("names none"));
  // the dropout masks: a fused projection takes its first part's number, the others keep theirs
  CHECK(lora_dropout_tensor(2, int(LoraTarget::qkv)) == lora_dropout_tensor(2, int(LoraTarget::q)));
  CHECK(lora_dropout_tensor(2, int(LoraTarget::gate_up)) == lora_dropout_tensor(2, int(LoraTarget::gate)));
  CHECK(lora_dropout_tensor(3, int(LoraTarget::down)) == 3 * 7 + 6);
}

TEST_CASE("strata grad matches transformers' float64 Phi-3 (LongRoPE short and long) on the CPU backend",
          "[phi3][golden][models]") {
  // phi3_partial: partial_rotary_factor 0.75, 12 of 16 dims turned (rotating all 16, or 8, moves the
  // loss by > 1e-4: tools/golden/make_phi3_goldens.py checks that it matters)
  auto dev = device_create(DeviceOptions{});
  for (const char* name : {"phi3", "phi3_long", "phi3_partial"}) {
    INFO(name);
    const gemma_testing::GoldenCheck r = gemma_testing::check_golden(*dev, name, DType::f32, 1e-5, 1e-4);
    std::printf("golden %-10s f32 cpu: loss rel err %.2e, worst gradient rel L2 err %.2e (%s)\n", name, r.loss_error,
                r.worst_grad_error, r.worst_name.c_str());
  }
}

TEST_CASE("Phi-3 in bf16 stays near transformers' float64 reference", "[phi3][golden][models]") {
  auto dev = device_create(DeviceOptions{});
  for (const char* name : {"phi3", "phi3_long", "phi3_partial"}) {  // test_gemma.cpp's bf16 tolerances
    INFO(name);
    gemma_testing::check_golden(*dev, name, DType::bf16, 1e-2, 0.1);
  }
}

TEST_CASE("greedy generation equals transformers' on Phi-3 with LongRoPE's short and long tables", "[phi3][generate]") {
  auto dev = device_create(DeviceOptions{});
  for (const char* name : {"phi3", "phi3_long", "phi3_partial"}) {
    INFO(name);
    phi3_testing::check_generation_each(*dev, name);
  }
}

}  // namespace strata
