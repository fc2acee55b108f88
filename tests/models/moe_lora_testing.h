// LoRA on a mixture-of-experts layer's router and experts (PEFT's target_parameters, offload/state/lora.h),
// the checks the CPU backend's test (tests/models/test_moe_lora.cpp) and the emulated CUDA one
// (tests/cuda/test_cuda_moe_lora.cpp) share, on tests/golden/lora_grad/{qwen3_moe,mixtral}_experts
// (tools/golden/make_moe_expert_lora_goldens.py: PEFT's own float64 gradients and greedy tokens):
//   - one forward_backward through an engine with streamed weights and host checkpoints, the
//     adapters loaded from the PEFT dir: the loss and the adapters' gradients in PEFT's names and
//     layout (a packed expert B reordered back to (out, E*r));
//   - greedy generation with the adapters unmerged in the generator (routed and whole-layer decode)
//     against PEFT's tokens.
#pragma once
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "offload/engine/engine.h"
#include "offload/engine/generator.h"
#include "offload/state/lora.h"
#include "offload/state/model_io.h"
#include "tests/testing.h"

namespace strata::moe_lora_testing {

struct Case {
  std::string dir;        // tests/golden/lora_grad/<name>
  nlohmann::json expected;
  testing::Golden model;  // tests/golden/<expected.model>
  LoraOptions options;
  static Case load(const std::string& name) {
    Case c;
    c.dir = testing::source_path("tests/golden/lora_grad/" + name);
    c.expected = nlohmann::json::parse(testing::read_file(c.dir + "/expected.json"));
    c.model = testing::Golden::load(c.expected["model"].get<std::string>());
    c.options.r = c.expected["r"].get<int64_t>();
    c.options.alpha = c.expected["alpha"].get<double>();
    c.options.targets = lora_targets_parse(c.expected["targets"].get<std::vector<std::string>>(), "expected.json");
    return c;
  }
};

struct Step {
  double loss = 0;
  std::vector<std::pair<std::string, std::vector<float>>> grads;  // PEFT's names and layout
};

inline Step step(Device& dev, const Case& c, DType dtype) {
  const ModelSpec spec = model_spec_build(hf_config_load(c.model.dir), dtype);
  HostStoreOptions so;
  so.weights_only = true;
  HostStore store(dev, spec, so);
  model_load_weights(store, c.model.dir);
  LoraStore lora(dev, spec, c.options);
  lora.load_peft(c.dir + "/adapter");
  EngineOptions eo;
  eo.weights = WeightsMode::stream;
  eo.checkpoints = CheckpointMode::host;
  eo.max_batch = c.model.batch.B;
  eo.max_tokens = c.model.batch.T;
  eo.lora = c.options;
  Engine engine(dev, store, eo, &lora);
  Step r;
  const int64_t counted = c.model.batch.counted();
  r.loss = engine.forward_backward(c.model.batch, float(1.0 / double(counted))) / double(counted);
  engine.synchronize();
  engine.lora_collect_grads();
  const LoraLayout& l = lora.layout();
  for (size_t i = 0; i < l.table.size(); ++i) {
    std::vector<float> g(size_t(l.table[i].numel()));
    lora_peft_tensor(l, i, lora.grad() + l.table[i].offset / 4, g.data());
    r.grads.emplace_back(l.table[i].name, std::move(g));
  }
  return r;
}

// ||got - want||_2 / ||want||_2
inline double rel_l2(const std::vector<float>& got, const float* want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i)
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]), den += double(want[i]) * want[i];
  return std::sqrt(num / std::max(den, 1e-300));
}

// The worst adapter tensor's relative L2 error against the case's grads.safetensors.
inline double golden_error(const Step& s, const Case& c) {
  SafetensorsFile want = SafetensorsFile::open(c.dir + "/grads.safetensors");
  REQUIRE(want.entries().size() == s.grads.size());
  double worst = 0;
  for (const auto& [name, grad] : s.grads) {
    INFO(name);
    const SafetensorsEntry* e = want.find(name);
    REQUIRE(e);
    REQUIRE(size_t(e->numel()) == grad.size());
    worst = std::max(worst, rel_l2(grad, static_cast<const float*>(want.data(*e))));
  }
  return worst;
}

// Greedy tokens with the adapters unmerged (Generator::set_adapters: B scaled in the image), weights
// streamed, routed and whole-layer decode, against PEFT's.
inline void generate_check(Device& dev, const Case& c) {
  const std::vector<int32_t> prompt = c.expected["generate"]["prompt"].get<std::vector<int32_t>>();
  const std::vector<int32_t> tokens = c.expected["generate"]["tokens"].get<std::vector<int32_t>>();
  const ModelSpec spec = model_spec_build(hf_config_load(c.model.dir), DType::f32);
  HostStore store(dev, spec);
  model_load_weights(store, c.model.dir);
  LoraStore lora(dev, spec, c.options);
  lora.load_peft(c.dir + "/adapter");
  for (bool routed : {true, false}) {
    INFO((routed ? "routed" : "whole-layer") << " decode");
    GeneratorPlacement p;
    p.weights_resident = false;
    p.kv_device_layers = spec.layers.size();
    const int64_t n = int64_t(prompt.size()), m = int64_t(tokens.size());
    Generator gen(dev, store, GeneratorShape{1, n, n + m}, p, GeneratorLora{lora.layout().r, lora.layout().bytes});
    gen.set_adapters(lora.layout(), lora.image());
    gen.set_routed_decode(routed);
    SamplingOptions so;
    so.max_new_tokens = m;
    const std::vector<GenerateResult> out = gen.generate({prompt}, so, 0);
    REQUIRE(out.size() == 1);
    CHECK(gen.routed_decode() == routed);
    CHECK(out[0].tokens == tokens);
  }
}

}  // namespace strata::moe_lora_testing
