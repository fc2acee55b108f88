// LoRA on a mixture-of-experts layer's router and experts (PEFT's target_parameters) on the CPU
// backend: the engine's adapter gradients in PEFT's layout against PEFT's float64 ones (the CLI's
// `strata grad --lora` is tests/models/test_lora_grad.cpp), greedy generation with the adapters
// unmerged against PEFT's tokens, the PEFT export read back bit for bit, and the merge a
// `strata generate --adapter` runs (models/lora_adapter.h, reading PEFT's layout itself) equal to
// the trainer's lora_merge_into.
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>

#include "models/lora_adapter.h"
#include "tests/models/moe_lora_testing.h"

namespace strata {

TEST_CASE("LoRA on MoE routers and experts: the engine's gradients match PEFT's float64 ones", "[lora][moe][golden]") {
  // f32 against fp64: ~1e-6; an expert's adapter applied to another expert's rows, B read without
  // PEFT's interleave, or the router adapter missing from the routing is > 1e-2
  auto dev = device_create(DeviceOptions{});
  for (const char* name : {"qwen3_moe_experts", "mixtral_experts"}) {
    INFO(name);
    const moe_lora_testing::Case c = moe_lora_testing::Case::load(name);
    const moe_lora_testing::Step s = moe_lora_testing::step(*dev, c, DType::f32);
    const double want = c.expected["loss"].get<double>(), err = moe_lora_testing::golden_error(s, c);
    std::printf("moe lora %-18s loss %.9f (PEFT %.9f, base %.9f) worst adapter grad rel L2 %.2e\n", name, s.loss, want,
                c.expected["base_loss"].get<double>(), err);
    CHECK(std::abs(s.loss - want) <= 1e-5 * want);
    CHECK(err <= 1e-4);
  }
}

TEST_CASE("LoRA on MoE routers and experts: greedy generation with unmerged adapters equals PEFT's", "[lora][moe][generate]") {
  // PEFT's tokens differ from the base model's (the adapters move the routing and the logits)
  auto dev = device_create(DeviceOptions{});
  for (const char* name : {"qwen3_moe_experts", "mixtral_experts"}) {
    INFO(name);
    moe_lora_testing::generate_check(*dev, moe_lora_testing::Case::load(name));
  }
}

TEST_CASE("LoRA on MoE experts: the PEFT export reads back, and generate's merge equals the trainer's", "[lora][moe]") {
  auto dev = device_create(DeviceOptions{});
  testing::TempDir tmp("moe_lora_export");
  const moe_lora_testing::Case c = moe_lora_testing::Case::load("qwen3_moe_experts");
  const ModelSpec spec = model_spec_build(hf_config_load(c.model.dir), DType::f32);
  LoraStore lora(*dev, spec, c.options);
  lora.load_peft(c.dir + "/adapter");
  // save_peft writes PEFT's names, shapes and values: the golden adapter's tensors, bit for bit
  const std::string out = (tmp.path / "adapter").string();
  lora.save_peft(out, c.model.dir);
  SafetensorsFile got = SafetensorsFile::open(out + "/adapter_model.safetensors");
  SafetensorsFile want = SafetensorsFile::open(c.dir + "/adapter/adapter_model.safetensors");
  REQUIRE(got.entries().size() == want.entries().size());
  for (const SafetensorsEntry& w : want.entries()) {
    INFO(w.name);
    const SafetensorsEntry* e = got.find(w.name);
    REQUIRE(e);
    REQUIRE(e->shape == w.shape);
    CHECK(std::memcmp(got.data(*e), want.data(w), size_t(w.numel()) * 4) == 0);
  }
  const nlohmann::json cfg = nlohmann::json::parse(testing::read_file(out + "/adapter_config.json"));
  CHECK(cfg["target_modules"] == nlohmann::json({"q_proj", "o_proj"}));
  CHECK(cfg["target_parameters"] ==
        nlohmann::json({"mlp.gate.weight", "mlp.experts.gate_up_proj", "mlp.experts.down_proj"}));

  // the merge `strata generate --adapter` runs (lora_adapter_read + lora_adapter_merge_row per row)
  // against the trainer's (lora_merge_into): the same per-expert slices, the same bits
  HostStoreOptions so;
  so.weights_only = true;
  HostStore merged(*dev, spec, so);
  model_load_weights(merged, c.model.dir);
  std::vector<std::vector<float>> base(spec.params.size());
  for (size_t i = 0; i < spec.params.size(); ++i) {
    base[i].resize(size_t(spec.params[i].numel()));
    merged.get_param(i, base[i].data());
  }
  lora_merge_into(merged, lora);
  const LoraAdapter adapter = lora_adapter_read(c.dir + "/adapter", spec);
  size_t rows = 0, experts_changed = 0;
  std::vector<float> m;
  for (size_t i = 0; i < spec.params.size(); ++i) {
    INFO(spec.params[i].name);
    std::vector<float> w = base[i];
    const bool adapted = lora_adapter_merge_row(adapter, i, w.data());
    m.resize(w.size());
    merged.get_param(i, m.data());
    CHECK(std::memcmp(m.data(), w.data(), w.size() * 4) == 0);
    rows += adapted;
    if (adapted && spec.params[i].name.find(".experts.") != std::string::npos) experts_changed += m != base[i];
  }
  // q, o on 3 layers; on the 2 MoE layers the router and 17 experts' gate, up, down
  CHECK(rows == 3 * 2 + 2 * (1 + 17 * 3));
  CHECK(experts_changed == 2 * 17 * 3);
}

}  // namespace strata
