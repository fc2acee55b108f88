// The example recipes in recipes/ parse under the strict schema, and the real model shapes they
// name build to the published parameter counts.
#include <catch2/catch.hpp>
#include <filesystem>
#include <set>

#include "io/hf_config.h"
#include "models/model_spec.h"
#include "src/recipe/recipe.h"
#include "tests/testing.h"

namespace strata {

TEST_CASE("every recipe in recipes/ and its sub-folders parses", "[recipe]") {
  std::set<std::string> seen;
  for (const auto& e : std::filesystem::recursive_directory_iterator(testing::source_path("recipes"))) {
    if (!e.is_regular_file() || e.path().extension() != ".toml") continue;
    INFO(e.path().string());
    Recipe r = recipe_load(e.path().string(), {});
    CHECK(!r.data_path.empty());
    CHECK(r.to_toml().find("[checkpoint]") != std::string::npos);
    seen.insert(std::filesystem::relative(e.path(), testing::source_path("recipes")).string());
  }
  // the ones the README names, in the top folder and in a sub-folder
  for (const char* name : {"quickstart.toml", "sft-tiny/recipe.toml", "llama-3.1-8b-sft.toml", "qwen3-8b-sft.toml",
                           "dpo-tiny/sft.toml", "dpo-tiny/recipe.toml", "qwen3-8b-dpo.toml"}) {
    INFO(name);
    CHECK(seen.count(name) == 1);
  }
}

TEST_CASE("the example shapes are Llama-3.1-8B and Qwen3-8B", "[recipe]") {
  ModelSpec llama = model_spec_build(hf_config_load(testing::source_path("recipes/configs/llama-3.1-8b")), DType::bf16);
  CHECK(llama.parameter_count() == 8030261248);  // as published
  CHECK(llama.layers.size() == 32);
  ModelSpec qwen = model_spec_build(hf_config_load(testing::source_path("recipes/configs/qwen3-8b")), DType::bf16);
  CHECK(qwen.parameter_count() == 8190735360);
  CHECK(qwen.layers.size() == 36);
}

TEST_CASE("the GPU scale check's model has the 3.02B parameters its docs state", "[recipe]") {
  ModelSpec scale = model_spec_build(hf_config_load(testing::source_path("recipes/gpu-scale")), DType::bf16);
  CHECK(scale.parameter_count() == 3015355392);  // docs/benchmarks.md, scripts/gpu_scale.py param_count
  CHECK(scale.layers.size() == 28);
}

}  // namespace strata
