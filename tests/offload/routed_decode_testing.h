// The routed decode's checks (offload/engine/routed_decode.h), shared by the CPU backend's test
// (tests/offload/test_routed_decode.cpp) and the emulated CUDA one (tests/cuda/test_cuda_routed_decode.cpp):
//   - greedy tokens on the MoE goldens (transformers' own, tests/golden/qwen3_moe, mixtral) with
//     streamed weights, routed and whole-layer decode alike;
//   - the bytes: on a 4-layer qwen3_moe with E = 64, k = 8 (four layers through two slots: every
//     layer is uploaded by every decode pass), whole-layer decode moves every layer's block per
//     pass, routed decode the shared part and expert_bytes per routed expert, counted by the
//     device's own link counter (Device::counters().h2d_bytes) as well as the generator's stats;
//     the same with an NF4 base (its experts bf16), routed and whole-layer giving the same tokens.
#pragma once
#include <fstream>
#include <nlohmann/json.hpp>

#include "offload/engine/generator.h"
#include "offload/state/model_io.h"
#include "offload/state/nf4_layout.h"
#include "tests/testing.h"

namespace strata::routed_testing {

// Weights through two slots, the KV cache on the device.
inline GeneratorPlacement streamed_weights(const HostStore& store) {
  GeneratorPlacement p;
  p.weights_resident = false;
  p.kv_device_layers = store.spec().layers.size();
  return p;
}

struct DecodeRun {
  std::vector<GenerateResult> results;
  GenerateStats stats;
  size_t h2d_bytes = 0;  // the device's link counter over generate()
  bool routed = false;   // the generator decoded with routed uploads
};

inline DecodeRun decode_run(Device& dev, HostStore& store, const std::vector<std::vector<int32_t>>& prompts,
                            int64_t max_new, bool routed) {
  int64_t longest = 0;
  for (const auto& p : prompts) longest = std::max<int64_t>(longest, int64_t(p.size()));
  Generator gen(dev, store, GeneratorShape{int64_t(prompts.size()), longest, longest + max_new},
                streamed_weights(store));
  gen.set_routed_decode(routed);
  SamplingOptions so;
  so.max_new_tokens = max_new;
  DecodeRun r;
  r.routed = gen.routed_decode();
  const size_t h2d0 = dev.counters().h2d_bytes;
  r.results = gen.generate(prompts, so, 0);
  r.h2d_bytes = dev.counters().h2d_bytes - h2d0;
  r.stats = gen.stats();
  return r;
}

// transformers' greedy tokens on golden `name` (f32 weights), routed and whole-layer decode.
inline void golden_tokens_check(Device& dev, const std::string& name) {
  INFO(name);
  const testing::Golden g = testing::Golden::load(name);
  std::ifstream in(g.dir + "/expected.json");
  const nlohmann::json want = nlohmann::json::parse(in)["generate"];
  const std::vector<int32_t> prompt = want["prompt"].get<std::vector<int32_t>>();
  const std::vector<int32_t> tokens = want["tokens"].get<std::vector<int32_t>>();
  HostStore store(dev, model_spec_build(hf_config_load(g.dir), DType::f32));
  model_load_weights(store, g.dir);
  for (bool routed : {true, false}) {
    INFO((routed ? "routed" : "whole-layer") << " decode");
    const DecodeRun r = decode_run(dev, store, {prompt}, int64_t(tokens.size()), routed);
    CHECK(r.routed == routed);
    REQUIRE(r.results.size() == 1);
    CHECK(r.results[0].tokens == tokens);
    if (routed) {  // only what a slot did not hold crossed: the shared parts and new experts
      CHECK(r.stats.decode_experts_uploaded <= r.stats.decode_experts_routed);
      CHECK(r.stats.decode_experts_routed > 0);
    }
  }
}

// A 4-layer qwen3_moe, every layer MoE, E = 64, k = 8, random weights. I x C x 4 bytes is a
// multiple of the tables' 256-byte alignment, so an expert's three tensors are 3 x I x C x 4
// contiguous bytes (no padding between them or after them).
inline ModelConfig routed_config() {
  const nlohmann::json j = {{"architectures", {"Qwen3MoeForCausalLM"}}, {"model_type", "qwen3_moe"},
                            {"hidden_size", 32}, {"intermediate_size", 40}, {"moe_intermediate_size", 8},
                            {"num_hidden_layers", 4}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
                            {"head_dim", 8}, {"num_experts", 64}, {"num_experts_per_tok", 8},
                            {"norm_topk_prob", true}, {"vocab_size", 97}};
  return hf_config_parse(j.dump(), "routed decode test config");
}

// The bytes of B rows' decode, routed against whole-layer, on routed_config(): f32, or (nf4) a
// QLoRA base in bf16 whose attention linears are NF4 and whose experts and router stay bf16, as
// bitsandbytes leaves them (the whole-layer decode uploads the packed blocks; the routed one the
// packed shared parts, decoded on the device, and the routed experts).
inline void routed_bytes_check(Device& dev, int64_t B, bool nf4 = false) {
  INFO("rows " << B << (nf4 ? " NF4 base" : ""));
  const ModelConfig cfg = routed_config();
  ModelSpec spec = model_spec_build(cfg, nf4 ? DType::bf16 : DType::f32);
  if (nf4) nf4_base_enable(spec, /*double_quant=*/true);
  HostStoreOptions so;
  so.weights_only = nf4;  // an NF4 base is frozen: weights only
  HostStore store(dev, spec, so);
  REQUIRE(store.packed() == nf4);
  model_init_weights(store, 7, 0.5);  // a wide spread: the routing differs token by token
  const int64_t L = 4, E = 64, k = 8, max_new = 6;
  // gate, up, down in f32 or bf16
  const size_t expert_bytes = size_t(3 * cfg.moe_intermediate_size * cfg.hidden_size) * (nf4 ? 2 : 4);
  size_t blocks = 0;
  for (int64_t l = 0; l < L; ++l) blocks += store.layer_group(size_t(l)).working_bytes;
  const size_t shared = blocks - size_t(L * E) * expert_bytes;
  std::vector<std::vector<int32_t>> prompts = {{5, 17, 3, 88, 40}, {61, 2, 9}, {33, 34}};
  prompts.resize(size_t(B));

  const DecodeRun whole = decode_run(dev, store, prompts, max_new, false);
  const DecodeRun routed = decode_run(dev, store, prompts, max_new, true);
  REQUIRE(routed.routed);
  for (int64_t b = 0; b < B; ++b) CHECK(routed.results[size_t(b)].tokens == whole.results[size_t(b)].tokens);
  const int64_t P = routed.stats.decode_passes;
  CHECK(P == max_new - 1);  // the first token comes from the prefill's logits
  CHECK(whole.stats.decode_passes == P);
  // whole-layer: four layers through two slots, each uploaded whole by every pass
  CHECK(whole.stats.decode_weight_bytes == size_t(P) * blocks);
  // routed: the shared parts, then each layer's union of its rows' k experts (all uploaded: the
  // slot held another layer's)
  const int64_t routed_experts = routed.stats.decode_experts_routed;
  CHECK(routed.stats.decode_experts_uploaded == routed_experts);
  CHECK(routed.stats.decode_weight_bytes == size_t(P) * shared + size_t(routed_experts) * expert_bytes);
  CHECK(routed_experts >= P * L * k);      // k distinct experts a row
  CHECK(routed_experts <= P * L * B * k);  // at most every row's own
  if (B == 1) CHECK(routed_experts == P * L * k);
  // the link counter sees the same difference: nothing else crossed differently
  CHECK(whole.h2d_bytes - routed.h2d_bytes == whole.stats.decode_weight_bytes - routed.stats.decode_weight_bytes);
  CHECK(routed.stats.decode_weight_bytes < whole.stats.decode_weight_bytes);
  std::printf("routed decode (%s%s, E=%lld k=%lld, %lld rows): %.0f vs %.0f weight bytes per decode pass (%.3f)\n",
              dev.name().c_str(), nf4 ? ", NF4 base" : "", (long long)E, (long long)k, (long long)B,
              double(routed.stats.decode_weight_bytes) / double(P), double(whole.stats.decode_weight_bytes) / double(P),
              double(routed.stats.decode_weight_bytes) / double(whole.stats.decode_weight_bytes));
}

}  // namespace strata::routed_testing
