// The example recipes in recipes/ parse under the strict schema, and the real model shapes they
// name build to the published parameter counts.
#include <catch2/catch.hpp>
#include <filesystem>

#include "io/hf_config.h"
#include "models/model_spec.h"
#include "src/recipe/recipe.h"
#include "tests/testing.h"

namespace strata {

TEST_CASE("every recipe in recipes/ parses", "[recipe]") {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(testing::source_path("recipes"))) {
    if (e.path().extension() != ".toml") continue;
    INFO(e.path().string());
    Recipe r = recipe_load(e.path().string(), {});
    CHECK(!r.data_path.empty());
    CHECK(r.to_toml().find("[checkpoint]") != std::string::npos);
    ++n;
  }
  CHECK(n >= 4);  // quickstart, sft-tiny, the Llama-3.1-8B and Qwen3-8B examples
}

TEST_CASE("the example shapes are Llama-3.1-8B and Qwen3-8B", "[recipe]") {
  ModelSpec llama = model_spec_build(hf_config_load(testing::source_path("recipes/configs/llama-3.1-8b")), DType::bf16);
  CHECK(llama.parameter_count() == 8030261248);  // as published
  CHECK(llama.layers.size() == 32);
  ModelSpec qwen = model_spec_build(hf_config_load(testing::source_path("recipes/configs/qwen3-8b")), DType::bf16);
  CHECK(qwen.parameter_count() == 8190735360);
  CHECK(qwen.layers.size() == 36);
}

}  // namespace strata
