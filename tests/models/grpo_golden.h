// The GRPO golden fixtures (tools/golden/make_grpo_goldens.py, tests/golden/grpo/<family>/
// cases.json and <case>_grads.safetensors: TRL 1.16's GRPOTrainer._compute_loss in float64) run
// through the streaming engine with the GRPO head on a given device; shared by the CPU test
// (tests/models/test_grpo_grad.cpp) and the emulated CUDA one (tests/cuda/test_cuda_grpo.cpp).
#pragma once
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "offload/engine/engine.h"
#include "offload/objective/grpo_head.h"
#include "offload/state/model_io.h"
#include "src/train/grpo_batch.h"
#include "tests/testing.h"

namespace strata::grpo_golden {

inline const char* const kFamilies[] = {"llama", "mistral", "qwen2", "qwen3"};
inline const char* const kCases[] = {"grpo", "grpo_kl", "bnpo", "bnpo_kl", "dr_grpo", "dr_grpo_kl", "dapo", "dapo_kl"};

inline nlohmann::json read_cases(const std::string& family) {
  const std::string path = testing::source_path("tests/golden/grpo/" + family + "/cases.json");
  std::ifstream in(path);
  if (!in) throw std::runtime_error("missing " + path);
  return nlohmann::json::parse(in);
}

// The contract's batch of one case: the shared ids, mask and advantages with the case's old and
// reference log-probs.
inline nlohmann::json case_batch(const nlohmann::json& all, const std::string& name) {
  const nlohmann::json& c = all["cases"][name];
  nlohmann::json b = {{"input_ids", all["input_ids"]}, {"completion_mask", all["completion_mask"]},
                      {"advantages", all["advantages"]}};
  if (c.contains("old_per_token_logps")) b["old_per_token_logps"] = c["old_per_token_logps"];
  if (c.contains("ref_per_token_logps")) b["ref_per_token_logps"] = c["ref_per_token_logps"];
  return b;
}

inline GrpoParams case_params(const nlohmann::json& c) {
  GrpoParams p;
  p.loss_type = grpo_loss_type_parse(c["loss_type"].get<std::string>());
  p.beta = c["beta"].get<double>();
  p.epsilon = c["epsilon"].get<double>();
  p.epsilon_high = c["epsilon_high"].get<double>();
  p.temperature = c["temperature"].get<double>();
  p.max_completion_length = c["max_completion_length"].get<int64_t>();
  return p;
}

struct CaseResult {
  double loss = 0;
  GrpoMetricSums metrics;
  std::vector<float> grads;  // the store's f32 gradient
  double worst_grad_rel_l2 = 0;
  std::string worst_name;
};

// One forward_backward of `name` on dev (weights streamed or resident), checked against the
// golden within 1e-5 relative loss and 1e-4 relative L2 per gradient tensor; returns what ran.
inline CaseResult run_case(Device& dev, const std::string& family, const std::string& name, WeightsMode weights) {
  const std::string model_dir = testing::source_path("tests/golden/" + family);
  const std::string dir = testing::source_path("tests/golden/grpo/" + family);
  const nlohmann::json all = read_cases(family);
  const nlohmann::json& c = all["cases"][name];
  const GrpoParams params = case_params(c);
  const GrpoBatch batch = grpo_batch_from_json(case_batch(all, name), name, params.beta > 0);
  HostStore store(dev, model_spec_build(hf_config_load(model_dir), DType::f32));
  model_load_weights(store, model_dir);
  EngineOptions eo;
  eo.weights = weights;
  eo.checkpoints = weights == WeightsMode::device ? CheckpointMode::device : CheckpointMode::host;
  eo.max_batch = batch.mb.B;
  eo.max_tokens = batch.mb.T;
  Engine engine(dev, store, eo);
  auto owned = std::make_unique<GrpoHead>(dev, params, batch.mb.B * batch.mb.T);
  GrpoHead* head = owned.get();
  head->set_layout(batch.layout, batch.mb);
  engine.set_loss_objective(std::move(owned));
  CaseResult r;
  {
    GrpoTemperature temperature(store, params.temperature);
    r.loss = engine.forward_backward(batch.mb, 1.f);
    engine.synchronize();
    temperature.finish();
  }
  r.metrics = head->result().metrics;
  const double want_loss = c["loss"].get<double>();
  INFO(family << " " << name << " loss " << r.loss << " want " << want_loss);
  CHECK(std::abs(r.loss - want_loss) <= 1e-5 * std::abs(want_loss));
  CHECK(r.metrics.tokens == c["tokens"].get<int64_t>());
  CHECK(std::abs(r.metrics.clip_region / double(r.metrics.tokens) - c["clip_ratio"].get<double>()) <= 1e-6);  // TRL logs it in float32
  if (c.contains("kl"))
    CHECK(std::abs(r.metrics.kl / double(r.metrics.tokens) - c["kl"].get<double>()) <= 1e-5 * c["kl"].get<double>());
  r.grads.assign(store.grad(), store.grad() + store.f32_floats());
  SafetensorsFile file = SafetensorsFile::open(dir + "/" + name + "_grads.safetensors");
  for (const auto& row : store.f32_table().rows()) {
    const SafetensorsEntry* e = file.find(row.name);
    REQUIRE(e);
    REQUIRE(e->shape == row.shape);
    const float* w = static_cast<const float*>(file.data(*e));
    const float* g = r.grads.data() + row.offset / 4;
    double num = 0, den = 0;
    for (int64_t i = 0; i < row.numel(); ++i) {
      num += (double(g[i]) - w[i]) * (double(g[i]) - w[i]);
      den += double(w[i]) * w[i];
    }
    const double err = std::sqrt(num / std::max(den, 1e-300));
    INFO(row.name << " rel L2 " << err);
    CHECK(err <= 1e-4);
    if (err >= r.worst_grad_rel_l2) r.worst_grad_rel_l2 = err, r.worst_name = row.name;
  }
  return r;
}

}  // namespace strata::grpo_golden
