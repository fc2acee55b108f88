// model_init_weights generates tensors side by side on the kernel threads (values in flight
// bounded by the largest tensor): the weights must be the same bits on any thread count, and the
// same as one generator per tensor in order gives.
#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <nlohmann/json.hpp>

#include "io/hf_config.h"
#include "models/model_spec.h"
#include "offload/state/host_store.h"
#include "offload/state/model_io.h"
#include "src/core/threads.h"
#include "src/device/device.h"

namespace strata {
namespace {

// Odd sizes, and an embedding far larger than any layer matrix, so that several layer tensors
// are generated at once under the budget while the embedding and lm_head go alone.
ModelSpec init_test_spec() {
  nlohmann::json j = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"},
                      {"hidden_size", 48}, {"intermediate_size", 97}, {"num_hidden_layers", 5},
                      {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 12},
                      {"vocab_size", 1031}, {"max_position_embeddings", 64}, {"rms_norm_eps", 1e-5},
                      {"rope_theta", 10000.0}, {"tie_word_embeddings", false}};
  return model_spec_build(hf_config_parse(j.dump(), "init test config"), DType::bf16);
}

// Every parameter's f32 master values, in row order, after model_init_weights on `threads`.
std::vector<std::vector<float>> init_values(int threads) {
  const int keep = cpu_threads_count();
  cpu_threads_set(threads);
  auto dev = device_create(DeviceOptions{});
  HostStore store(*dev, init_test_spec());
  model_init_weights(store, 9, 0.05);
  cpu_threads_set(keep);
  std::vector<std::vector<float>> out;
  for (size_t i = 0; i < store.spec().params.size(); ++i) {
    out.emplace_back(size_t(store.spec().params[i].numel()));
    store.get_param(i, out.back().data());
  }
  return out;
}

TEST_CASE("random init gives the same bits on 1, 3 and 8 threads, one generator per tensor", "[model_io]") {
  const auto one = init_values(1);
  const ModelSpec spec = init_test_spec();
  REQUIRE(one.size() == spec.params.size());
  for (int threads : {3, 8}) {
    const auto many = init_values(threads);
    REQUIRE(many.size() == one.size());
    for (size_t i = 0; i < one.size(); ++i) {
      INFO("threads " << threads << ", tensor " << spec.params[i].name);
      REQUIRE(many[i].size() == one[i].size());
      CHECK(std::memcmp(many[i].data(), one[i].data(), one[i].size() * sizeof(float)) == 0);
    }
  }
  // The generator of tensor i: N(0, std) from mt19937_64 seeded by (seed, i); norms 1.
  for (size_t i = 0; i < spec.params.size(); ++i) {
    const TensorSpec& r = spec.params[i];
    INFO(r.name);
    if (r.shape.size() == 2) {
      std::mt19937_64 rng(9 * 0x9e3779b97f4a7c15ull + i);
      std::normal_distribution<double> dist(0.0, 0.05);
      for (size_t k = 0; k < 3; ++k) CHECK(one[i][k] == float(dist(rng)));
    } else if (r.name.find("norm") != std::string::npos) {
      CHECK(one[i][0] == 1.f);
    }
  }
}

}  // namespace
}  // namespace strata
