// The checks tests/models/test_phi3.cpp and tests/cuda/test_cuda_phi3.cpp run on a device against
// the transformers goldens of tools/golden/make_phi3_goldens.py (the loss and gradient check is
// gemma_testing's): greedy generation of each prompt alone, as the golden's transformers
// generate() ran them (LongRoPE picks its table by the forward's largest position, so a prompt
// batched with a longer one could see the other table). phi3_long's prompts are past
// original_max_position_embeddings (models/phi3_layer.h: the crossing is not matched).
#pragma once
#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "offload/engine/generator.h"
#include "offload/state/model_io.h"
#include "tests/testing.h"

namespace strata::phi3_testing {

inline void check_generation_each(Device& dev, const std::string& name) {
  const testing::Golden g = testing::Golden::load(name);
  std::ifstream in(g.dir + "/generate.json");
  REQUIRE(in);
  const nlohmann::json j = nlohmann::json::parse(in);
  const auto prompts = j["prompts"].get<std::vector<std::vector<int32_t>>>();
  const auto want = j["tokens"].get<std::vector<std::vector<int32_t>>>();
  SamplingOptions so;
  so.max_new_tokens = j["max_new_tokens"].get<int64_t>();
  HostStore store(dev, model_spec_build(hf_config_load(g.dir), DType::f32));
  model_load_weights(store, g.dir);
  REQUIRE(prompts.size() == want.size());
  for (size_t r = 0; r < prompts.size(); ++r) {
    INFO("prompt " << r);
    const int64_t len = int64_t(prompts[r].size());
    Generator gen(dev, store, GeneratorShape{1, len, len + so.max_new_tokens});
    const std::vector<GenerateResult> got = gen.generate({prompts[r]}, so, 0);
    REQUIRE(got.size() == 1);
    CHECK(got[0].tokens == want[r]);
  }
}

}  // namespace strata::phi3_testing
