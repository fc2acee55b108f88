// QLoRA on the newer families (issue 40, part 3): gemma3, olmo2, phi3 (its fused qkv_proj and
// gate_up_proj quantized too), qwen3_moe and mixtral (their experts and routers left in bf16, as
// transformers 5 + bitsandbytes leave them) against tools/golden/make_qlora_family_goldens.py:
// which rows are NF4, and `strata grad --lora` (base_dtype nf4 in the TOML, --dtype f32) against
// PEFT's own LoRA gradients on bitsandbytes' dequantized base in float64. Also DPO on an NF4 base
// against the fp64 golden of make_qlora_grad_goldens.py, and the engine's NF4 base against a bf16
// base of its dequantized weights, bit for bit.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

#include "offload/state/nf4_layout.h"
#include "tests/offload/qlora_testing.h"
#include "tests/testing.h"

namespace strata {
namespace {

const char* const kFamilies[] = {"gemma3", "olmo2", "phi3", "qwen3_moe", "mixtral"};

nlohmann::json qlora_expected(const std::string& name) {
  return nlohmann::json::parse(testing::read_file(testing::source_path("tests/golden/qlora_grad/") + name + "/expected.json"));
}

// The [lora] TOML of golden `name`'s adapter (tests/golden/qlora_grad/<name>/adapter) on an NF4 base.
std::string qlora_toml(testing::TempDir& tmp, const std::string& name, const nlohmann::json& e) {
  std::string targets;
  for (const auto& t : e["targets"]) targets += (targets.empty() ? "" : ",") + t.get<std::string>();
  return tmp.file(name + ".toml", str_cat("[lora]\nr = ", e["r"].get<int64_t>(), "\nalpha = ", e["alpha"].get<double>(),
                                          "\ntarget_modules = \"", targets, "\"\nadapter = \"",
                                          testing::source_path("tests/golden/qlora_grad/"), name,
                                          "/adapter\"\nbase_dtype = \"nf4\"\ndouble_quant = true\n"));
}

// The worst tensor's relative L2 error of gradient file `got` against `want` (the same names).
double worst_rel_l2(const std::string& got_path, const std::string& want_path) {
  SafetensorsFile got = SafetensorsFile::open(got_path), want = SafetensorsFile::open(want_path);
  REQUIRE(got.entries().size() == want.entries().size());
  double worst = 0;
  for (const SafetensorsEntry& w : want.entries()) {
    INFO(w.name);
    const SafetensorsEntry* e = got.find(w.name);
    REQUIRE(e);
    const float* g = static_cast<const float*>(got.data(*e));
    worst = std::max(worst, testing::qlora_rel_l2(std::vector<float>(g, g + w.numel()), static_cast<const float*>(want.data(w))));
  }
  return worst;
}

}  // namespace

TEST_CASE("NF4 quantizes the rows that transformers and bitsandbytes quantize in the fused and MoE families",
          "[qlora][nf4][phi3][moe]") {
  for (const char* name : kFamilies) {
    INFO(name);
    const nlohmann::json e = qlora_expected(name);
    ModelSpec spec = model_spec_build(hf_config_load(testing::source_path("tests/golden/") + name), DType::bf16);
    nf4_base_enable(spec, true);
    const std::vector<bool> packed = nf4_packed_rows(spec);
    std::set<std::string> ours, theirs;
    for (size_t r = 0; r < spec.params.size(); ++r)
      if (packed[r]) ours.insert(spec.params[r].name);
    for (const auto& n : e["quantized"]) theirs.insert(n.get<std::string>());
    CHECK(ours == theirs);
    CHECK(!ours.empty());
    const std::string family = name;
    if (family == "phi3") {  // the fused projections are NF4, not left in bf16
      CHECK(ours.count("model.layers.0.self_attn.qkv_proj.weight") == 1);
      CHECK(ours.count("model.layers.0.mlp.gate_up_proj.weight") == 1);
    }
    if (family == "qwen3_moe" || family == "mixtral") {  // bitsandbytes left the experts (and routers) alone
      bool experts = false;
      for (const auto& n : e["left_unquantized"]) experts = experts || testing::contains(n.get<std::string>(), ".experts.");
      CHECK(experts);
      for (size_t r = 0; r < spec.params.size(); ++r)
        if (testing::contains(spec.params[r].name, ".experts.") || testing::contains(spec.params[r].name, ".gate.weight"))
          CHECK_FALSE(packed[r]);
    }
  }
}

TEST_CASE("strata grad --lora on an NF4 base matches PEFT and bitsandbytes for gemma3 olmo2 phi3 qwen3_moe and mixtral",
          "[qlora][golden][cli][phi3][moe][gemma]") {
  // f32 compute on bitsandbytes' dequantized bf16 weights against PEFT's float64 gradients: 1e-4
  // relative L2 allowed per tensor, the loss within 2e-6 relative
  testing::TempDir tmp("qlora_families");
  for (const char* name : kFamilies) {
    INFO(name);
    const nlohmann::json e = qlora_expected(name);
    const std::string model = testing::source_path("tests/golden/") + name;
    const std::string out = (tmp.path / (std::string(name) + ".safetensors")).string();
    const auto r = testing::run_strata(str_cat("grad --model ", model, " --batch ", model, "/batch.json --out ", out,
                                               " --dtype f32 --lora ", qlora_toml(tmp, name, e)), true);
    INFO(r.out);
    REQUIRE(r.code == 0);
    const double loss = nlohmann::json::parse(r.out)["loss"].get<double>(), want = e["loss"].get<double>();
    const double worst = worst_rel_l2(out, testing::source_path("tests/golden/qlora_grad/") + name + "/grads.safetensors");
    std::printf("strata grad qlora %-9s loss %.9f (want %.9f, %.1e rel), worst adapter grad rel L2 %.2e\n", name, loss,
                want, std::abs(loss - want) / want, worst);
    CHECK(std::abs(loss - want) <= 2e-6 * want);
    CHECK(worst <= 1e-4);
  }
}

TEST_CASE("DPO on an NF4 base: strata grad --objective dpo --lora matches the fp64 PEFT and bitsandbytes golden",
          "[qlora][golden][cli][preference]") {
  // tests/golden/qlora_grad/llama/dpo*: llama's LoRA adapter (tests/golden/lora_grad/llama) on its
  // double-quantized NF4 base, the preference batch of tests/golden/preference/llama (beta 0.3)
  testing::TempDir tmp("qlora_dpo");
  const std::string lora_dir = testing::source_path("tests/golden/lora_grad/llama");
  const nlohmann::json lora = nlohmann::json::parse(testing::read_file(lora_dir + "/expected.json"));
  const nlohmann::json want = qlora_expected("llama");
  std::string targets;
  for (const auto& t : lora["targets"]) targets += (targets.empty() ? "" : ",") + t.get<std::string>();
  const std::string cfg = tmp.file("dpo.toml", str_cat("[lora]\nr = ", lora["r"].get<int64_t>(), "\nalpha = ",
                                                       lora["alpha"].get<double>(), "\ntarget_modules = \"", targets,
                                                       "\"\nadapter = \"", lora_dir, "/adapter\"\nbase_dtype = \"nf4\"\n"));
  const std::string model = testing::source_path("tests/golden/llama");
  const std::string batch = testing::source_path("tests/golden/preference/llama/batch.json");
  const std::string out = (tmp.path / "dpo.safetensors").string();
  const auto r = testing::run_strata(str_cat("grad --model ", model, " --batch ", batch, " --out ", out,
                                             " --dtype f32 --objective dpo --beta ", want["dpo_beta"].get<double>(),
                                             " --lora ", cfg), true);
  INFO(r.out);
  REQUIRE(r.code == 0);
  const double loss = nlohmann::json::parse(r.out)["loss"].get<double>(), want_loss = want["dpo_loss"].get<double>();
  const double worst = worst_rel_l2(out, testing::source_path("tests/golden/qlora_grad/llama/dpo_grads.safetensors"));
  std::printf("strata grad qlora dpo llama: loss %.9f (want %.9f), worst adapter grad rel L2 %.2e\n", loss, want_loss, worst);
  CHECK(std::abs(loss - want_loss) <= 2e-6 * std::abs(want_loss));
  CHECK(worst <= 1e-4);
}

TEST_CASE("the engine's NF4 base equals a bf16 base of its dequantized weights for phi3 and qwen3_moe",
          "[qlora][phi3][moe]") {
  // the same values, unpacked: bit-identical loss and adapter gradients on the CPU backend
  auto dev = device_create(DeviceOptions{});
  using testing::QloraBase;
  for (const char* name : {"phi3", "qwen3_moe"}) {
    INFO(name);
    const testing::QloraStep nf4 = testing::qlora_step(*dev, name, DType::bf16, QloraBase::nf4);
    const testing::QloraStep deq = testing::qlora_step(*dev, name, DType::bf16, QloraBase::dequantized);
    CHECK(nf4.loss == deq.loss);
    REQUIRE(nf4.grads.size() == deq.grads.size());
    for (size_t i = 0; i < nf4.grads.size(); ++i) CHECK(nf4.grads[i].second == deq.grads[i].second);
    // the packed layers are smaller on the host (MoE: only the attention projections shrink)
    CHECK(nf4.layer_host_bytes < deq.layer_host_bytes);
    std::printf("qlora engine %-9s bf16: NF4 == dequantized base (loss %.9f), decoder-layer host bytes %.3f of bf16\n",
                name, nf4.loss, double(nf4.layer_host_bytes) / double(deq.layer_host_bytes));
  }
}

}  // namespace strata
