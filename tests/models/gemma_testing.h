// The checks tests/models/test_gemma.cpp and tests/cuda/test_cuda_gemma.cpp run on a device
// against the transformers goldens of tools/golden/make_gemma_goldens.py: one engine step's loss
// and every gradient (relative L2 per tensor, as issue 39 states its tolerance), and greedy
// generation against generate.json's tokens.
#pragma once
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "offload/engine/generator.h"
#include "offload/state/model_io.h"
#include "tests/testing.h"

namespace strata::gemma_testing {

struct GoldenCheck {
  double loss_error = 0;        // |loss - want| / |want|
  double worst_grad_error = 0;  // max over tensors of ||got - want||_2 / ||want||_2
  std::string worst_name;
};

// One forward_backward with streamed weights and host-spilled checkpoints on golden `name`'s
// model in `dtype`; checks the counted tokens, the loss within loss_tol relative and every
// gradient tensor within l2_tol relative L2.
inline GoldenCheck check_golden(Device& dev, const std::string& name, DType dtype, double loss_tol, double l2_tol) {
  const testing::Golden g = testing::Golden::load(name);
  EngineOptions eo;
  eo.weights = WeightsMode::stream;
  eo.checkpoints = CheckpointMode::host;
  const testing::GoldenStep r = testing::golden_step(dev, g, dtype, eo);
  const std::vector<float> want = g.grads(r.table, r.grads.size());
  GoldenCheck out;
  CHECK(r.tokens == g.tokens);
  out.loss_error = std::abs(r.loss - g.loss) / std::abs(g.loss);
  CHECK(out.loss_error <= loss_tol);
  for (const auto& row : r.table.rows()) {
    double diff = 0, norm = 0;
    for (int64_t i = 0; i < row.numel(); ++i) {
      const double a = r.grads[size_t(row.offset / 4 + i)], b = want[size_t(row.offset / 4 + i)];
      diff += (a - b) * (a - b), norm += b * b;
    }
    const double e = std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
    INFO(row.name << ": gradient rel L2 err " << e);
    CHECK(e <= l2_tol);
    if (e >= out.worst_grad_error) out.worst_grad_error = e, out.worst_name = row.name;
  }
  return out;
}

// Greedy generation from generate.json's prompts on `dev` (f32 weights, every layer resident)
// equals transformers' tokens.
inline void check_generation(Device& dev, const std::string& name) {
  const testing::Golden g = testing::Golden::load(name);
  std::ifstream in(g.dir + "/generate.json");
  REQUIRE(in);
  const nlohmann::json j = nlohmann::json::parse(in);
  const auto prompts = j["prompts"].get<std::vector<std::vector<int32_t>>>();
  const auto want = j["tokens"].get<std::vector<std::vector<int32_t>>>();
  SamplingOptions so;
  so.max_new_tokens = j["max_new_tokens"].get<int64_t>();
  int64_t longest = 0;
  for (const auto& p : prompts) longest = std::max<int64_t>(longest, int64_t(p.size()));
  HostStore store(dev, model_spec_build(hf_config_load(g.dir), DType::f32));
  model_load_weights(store, g.dir);
  Generator gen(dev, store, GeneratorShape{int64_t(prompts.size()), longest, longest + so.max_new_tokens});
  const std::vector<GenerateResult> got = gen.generate(prompts, so, 0);
  REQUIRE(got.size() == want.size());
  for (size_t r = 0; r < want.size(); ++r) {
    INFO("prompt " << r);
    CHECK(got[r].tokens == want[r]);
  }
}

}  // namespace strata::gemma_testing
