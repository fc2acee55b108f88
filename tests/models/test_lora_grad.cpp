// LoRA (offload/state/lora.h): `strata grad --lora` against fp64 torch goldens of PEFT's math written
// by hand (tools/golden/make_lora_grad_goldens.py) for all four families, against PEFT itself on
// Phi-3's fused projections (tools/golden/make_phi3_lora_goldens.py) and the MoE families' attention
// (tools/golden/make_moe_lora_goldens.py) and their router and experts through PEFT's target_parameters
// (tools/golden/make_moe_expert_lora_goldens.py), the merged export
// (lora_merge_into) against W + (alpha / r) B A computed here in fp64; with LoRA dropout too, the
// masks rebuilt by the golden script.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "models/dense_layer.h"
#include "offload/state/lora.h"
#include "tests/testing.h"

namespace strata {
namespace {

// ||got - want||_2 / ||want||_2
double relative_l2(const float* got, const float* want, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = double(got[i]) - double(want[i]);
    num += d * d;
    den += double(want[i]) * double(want[i]);
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

struct LoraGolden {
  std::string model, adapter, grads;
  nlohmann::json expected;
  static LoraGolden load(const std::string& name) {
    LoraGolden g;
    const std::string dir = testing::source_path("tests/golden/lora_grad/" + name);
    g.adapter = dir + "/adapter";
    g.grads = dir + "/grads.safetensors";
    g.expected = nlohmann::json::parse(testing::read_file(dir + "/expected.json"));
    g.model = testing::source_path("tests/golden/" + g.expected.value("model", name));  // the case's model
    return g;
  }
  // expected.json's targets, all (modules = -1), the module names (1) or the dotted parameter names (0)
  std::string targets(int modules = -1) const {
    std::string out;
    for (const auto& t : expected["targets"]) {
      const bool parameter = t.get<std::string>().find('.') != std::string::npos;
      if (modules < 0 || parameter != bool(modules)) out += (out.empty() ? "" : ",") + t.get<std::string>();
    }
    return out;
  }
};

// `strata grad --lora` on golden `name` (with dropout: its dropout case, the masks of step 1,
// micro-batch 0 of a run seeded dropout_seed) against the fp64 torch gradients: the loss to 2e-6
// relative, every adapter tensor to 1e-4 relative L2. The family `config_form` passes its
// settings in a [lora] table (adapter relative to it), the others as flags.
void check_lora_golden(testing::TempDir& tmp, const std::string& name, bool dropout, const std::string& config_form) {
  INFO(name << (dropout ? " with dropout" : ""));
  const LoraGolden g = LoraGolden::load(name);
  const double p = dropout ? g.expected["dropout"].get<double>() : 0.0;
  const std::string out = (tmp.path / (name + ".safetensors")).string();
  std::string lora_args;
  if (name == config_form) {
    const std::string cfg = tmp.file(name + ".toml", str_cat("[lora]\nr = ", g.expected["r"].get<int64_t>(), "\nalpha = ",
                                                             g.expected["alpha"].get<double>(), "\ndropout = ", p,
                                                             "\ntarget_modules = \"", g.targets(1),
                                                             "\"\ntarget_parameters = \"", g.targets(0), "\"\nadapter = \"",
                                                             g.adapter, "\"\n"));
    lora_args = "--lora " + cfg;
  } else {
    lora_args = str_cat("--lora-r ", g.expected["r"].get<int64_t>(), " --lora-alpha ", g.expected["alpha"].get<double>(),
                        " --lora-targets ", g.targets(), " --lora-adapter ", g.adapter,
                        dropout ? str_cat(" --lora-dropout ", p) : std::string());
  }
  if (dropout) lora_args += str_cat(" --lora-seed ", g.expected["dropout_seed"].get<int64_t>());
  const auto r = testing::run_strata(str_cat("grad --model ", g.model, " --batch ", g.model, "/batch.json --out ", out,
                                             " ", lora_args),
                                     true);
  INFO(r.out);
  REQUIRE(r.code == 0);
  const nlohmann::json result = nlohmann::json::parse(r.out);
  const double want_loss = g.expected[dropout ? "dropout_loss" : "loss"].get<double>();
  CHECK(std::abs(result["loss"].get<double>() - want_loss) <= 2e-6 * want_loss);
  SafetensorsFile got = SafetensorsFile::open(out);
  SafetensorsFile want = SafetensorsFile::open(dropout ? testing::source_path("tests/golden/lora_grad/" + name +
                                                                              "/grads_dropout.safetensors")
                                                       : g.grads);
  REQUIRE(got.entries().size() == want.entries().size());  // the adapters' gradients only
  double worst = 0;
  for (const SafetensorsEntry& w : want.entries()) {
    INFO(w.name);
    const SafetensorsEntry* e = got.find(w.name);
    REQUIRE(e);
    REQUIRE(e->shape == w.shape);
    const double err = relative_l2(static_cast<const float*>(got.data(*e)), static_cast<const float*>(want.data(w)),
                                   w.numel());
    CHECK(err <= 1e-4);
    worst = std::max(worst, err);
  }
  std::printf("lora golden %-8s dropout %.2f loss %.9f (want %.9f), worst adapter grad rel L2 %.2e over %zu tensors\n",
              name.c_str(), p, result["loss"].get<double>(), want_loss, worst, want.entries().size());
}

}  // namespace

TEST_CASE("strata grad --lora matches the fp64 torch LoRA goldens for every family", "[golden][lora]") {
  // Tolerance: f32 against fp64, the worst tensor is ~1.5e-6 relative L2; a wrong alpha / r
  // scale, a transposed adapter or a missing dx path is > 1e-2.
  testing::TempDir tmp("lora_grad_golden");
  for (const char* name : {"llama", "mistral", "qwen2", "qwen3"}) check_lora_golden(tmp, name, false, "mistral");
}

TEST_CASE("strata grad --lora on Phi-3's fused projections matches PEFT's own float64 gradients", "[golden][lora][phi3]") {
  // tools/golden/make_phi3_lora_goldens.py: peft.get_peft_model on Phi3ForCausalLM, one adapter per
  // fused qkv_proj / gate_up_proj; a B split at the wrong rows or a dA missing a part is > 1e-2
  testing::TempDir tmp("lora_grad_phi3");
  check_lora_golden(tmp, "phi3", false, "");
}

TEST_CASE("strata grad --lora with dropout matches the fp64 torch goldens, the masks rebuilt in python",
          "[golden][lora][dropout]") {
  // make_lora_grad_goldens.py draws strata's counter-based masks (kernels/common/dropout_mask.h) in
  // python, p from 0.05 to 0.5; the masks change the loss by 1e-2 to 0.4 (expected.json). A mask
  // differing in one element of one module moves that module's gradients by ~1e-2 relative;
  // dropout on the base path too, or without the 1 / (1 - p), by far more.
  testing::TempDir tmp("lora_grad_dropout");
  for (const char* name : {"llama", "mistral", "qwen2", "qwen3"}) {
    const LoraGolden g = LoraGolden::load(name);
    CHECK(std::abs(g.expected["dropout_loss"].get<double>() - g.expected["loss"].get<double>()) > 1e-3);
    check_lora_golden(tmp, name, true, "qwen2");
  }
}

TEST_CASE("strata grad --lora with PEFT's initialisation: B = 0 leaves the base loss, dA = 0", "[lora]") {
  testing::TempDir tmp("lora_grad_init");
  const std::string model = testing::source_path("tests/golden/qwen2");
  const std::string out = (tmp.path / "g.safetensors").string();
  const auto base = testing::run_strata(str_cat("grad --model ", model, " --batch ", model, "/batch.json --out ",
                                                (tmp.path / "full.safetensors").string()), true);
  const auto lora = testing::run_strata(str_cat("grad --model ", model, " --batch ", model, "/batch.json --out ", out,
                                                " --lora-r 3 --lora-seed 5"), true);
  REQUIRE(base.code == 0);
  REQUIRE(lora.code == 0);
  CHECK(nlohmann::json::parse(lora.out)["loss"] == nlohmann::json::parse(base.out)["loss"]);  // exactly
  SafetensorsFile got = SafetensorsFile::open(out);
  CHECK(got.entries().size() == 2 * 7 * 2);  // 2 layers x 7 modules x (A, B)
  for (const SafetensorsEntry& e : got.entries()) {
    const float* p = static_cast<const float*>(got.data(e));
    double sq = 0;
    for (int64_t i = 0; i < e.numel(); ++i) sq += double(p[i]) * p[i];
    INFO(e.name);
    if (e.name.find("lora_A") != std::string::npos) CHECK(sq == 0);  // dA = s (dy B)^T x with B = 0
    else CHECK(sq > 0);
  }
}

TEST_CASE("strata grad --lora rejects bad LoRA settings", "[lora][cli]") {
  const std::string model = testing::source_path("tests/golden/llama");
  const std::string common = str_cat("grad --model ", model, " --batch ", model, "/batch.json --out /dev/null ");
  testing::check_run(testing::run_strata(common + "--lora-targets q_proj,qproj"), 2, {"qproj", "PEFT's names"});
  testing::check_run(testing::run_strata(common + "--lora-r 3 --lora-adapter " +
                                         testing::source_path("tests/golden/lora_grad/llama/adapter")),
                     2, {"r is 4", "lora.r"});
}

TEST_CASE("the merged export is base + (alpha / r) B A to bf16 rounding", "[lora]") {
  // The llama golden's bf16 weights with its adapter merged in a frozen bf16 store, against the
  // same sum in fp64 rounded to bf16: equal, or one bf16 step apart where the f32 sum sits at a
  // rounding boundary (at most a few in a thousand).
  auto dev = device_create(DeviceOptions{});
  const LoraGolden g = LoraGolden::load("llama");
  const ModelSpec spec = model_spec_build(hf_config_load(g.model), DType::bf16);
  HostStoreOptions so;
  so.weights_only = true;
  HostStore store(*dev, spec, so);
  model_load_weights(store, g.model);
  LoraOptions lo;
  lo.r = g.expected["r"].get<int64_t>();
  lo.alpha = g.expected["alpha"].get<double>();
  LoraStore lora(*dev, spec, lo);
  lora.load_peft(g.adapter);
  std::vector<std::vector<float>> before(spec.params.size());
  for (size_t i = 0; i < spec.params.size(); ++i) {
    before[i].resize(size_t(spec.params[i].numel()));
    store.get_param(i, before[i].data());
  }
  lora_merge_into(store, lora);
  const LoraLayout& l = lora.layout();
  size_t off_by_one = 0, total = 0, changed = 0;
  for (size_t layer = 0; layer < spec.layers.size(); ++layer) {
    const LayerParamRows rows = dense_layer_rows(spec.layers[layer]);
    const int64_t base_rows[7] = {rows.q, rows.k, rows.v, rows.o, rows.gate, rows.up, rows.down};
    for (int t = 0; t < 7; ++t) {  // the dense layer's seven (Phi-3's fused two are absent)
      const size_t row = size_t(base_rows[t]), a_row = size_t(l.a_row[layer][size_t(t)]);
      const int64_t out = spec.params[row].shape[0], in = spec.params[row].shape[1];
      const float* A = lora.master() + l.table[a_row].offset / 4;
      const float* B = lora.master() + l.table[a_row + 1].offset / 4;
      std::vector<float> merged(size_t(out * in));
      store.get_param(row, merged.data());
      for (int64_t o = 0; o < out; ++o)
        for (int64_t i = 0; i < in; ++i) {
          double d = 0;
          for (int64_t k = 0; k < lo.r; ++k) d += double(B[o * lo.r + k]) * double(A[k * in + i]);
          const double want = double(before[row][size_t(o * in + i)]) + lo.alpha / double(lo.r) * d;
          const float want_bf16 = bf16_to_f32(f32_to_bf16(float(want)));
          const float got = merged[size_t(o * in + i)];
          ++total;
          changed += got != before[row][size_t(o * in + i)];
          if (got == want_bf16) continue;
          ++off_by_one;
          INFO(spec.params[row].name << "[" << o << "," << i << "] got " << got << " want " << want_bf16);
          CHECK(std::abs(got - want_bf16) <= std::ldexp(std::abs(want_bf16), -7));  // one bf16 step
        }
    }
  }
  std::printf("lora merge: %zu weights, %zu changed, %zu one bf16 step from the fp64 sum\n", total, changed, off_by_one);
  CHECK(changed > total / 2);
  CHECK(off_by_one * 100 <= total);
}

}  // namespace strata

namespace strata {

TEST_CASE("strata grad --lora on the MoE families' attention projections matches PEFT's own float64 gradients",
          "[golden][lora][moe]") {
  // tools/golden/make_moe_lora_goldens.py: peft.get_peft_model on Qwen3MoeForCausalLM (q, k, v, o;
  // layer 1 dense) and MixtralForCausalLM (q, v, o), the adapters' gradients through the routed
  // experts' backward into the attention half
  testing::TempDir tmp("lora_grad_moe");
  for (const char* name : {"qwen3_moe", "mixtral"}) check_lora_golden(tmp, name, false, "");
}

TEST_CASE("strata grad --lora on the MoE router and experts matches PEFT's target_parameters in float64",
          "[golden][lora][moe]") {
  // tools/golden/make_moe_expert_lora_goldens.py: PEFT's ParamWrapper on transformers 5's packed
  // experts (one A and B per expert, B's columns interleaved by expert) and bare router, qwen3_moe
  // with all three (the expert wrappers nested) plus q, o; mixtral with gate_up_proj and the router
  // plus v. The adapted router moves the routing (the script keeps draws with a clear top-k margin).
  // A B read without reordering, an expert's adapter applied to another's rows, or a router
  // gradient missing the adapter's path is > 1e-2.
  testing::TempDir tmp("lora_grad_moe_experts");
  for (const char* name : {"qwen3_moe_experts", "mixtral_experts"}) check_lora_golden(tmp, name, false, "mixtral_experts");
}

TEST_CASE("LoRA names a MoE layer's router and experts as PEFT's target_parameters: bad uses exit 2", "[lora][moe]") {
  testing::TempDir tmp("lora_moe_refused");
  const std::string model = testing::source_path("tests/golden/qwen3_moe");
  const std::string base = str_cat("grad --model ", model, " --batch ", model, "/batch.json --out ",
                                   (tmp.path / "g.safetensors").string(), " --lora-r 2");
  // module-style names of the parts transformers 5 keeps as parameters: named as PEFT's target_parameters
  for (const char* target : {"gate", "experts", "w1"}) {
    INFO(target);
    testing::check_run(testing::run_strata(str_cat(base, " --lora-targets q_proj,", target)), 2,
                       {"lora.target_modules names", target, "target_parameters", "mlp.experts.gate_up_proj"});
  }
  // PEFT's ParamWrapper refuses dropout
  testing::check_run(testing::run_strata(str_cat(base, " --lora-targets q_proj,mlp.experts.down_proj --lora-dropout 0.1")),
                     2, {"lora.dropout", "ParamWrapper"});
  // a dense model has no router or experts
  const std::string dense = testing::source_path("tests/golden/qwen3");
  testing::check_run(testing::run_strata(str_cat("grad --model ", dense, " --batch ", dense, "/batch.json --out ",
                                                 (tmp.path / "d.safetensors").string(),
                                                 " --lora-r 2 --lora-targets q_proj,experts.gate_up_proj")),
                     2, {"mlp.experts.gate_up_proj", "has none"});
  // an adapter whose target_parameters differ from the run's
  const std::string adapter = testing::source_path("tests/golden/lora_grad/qwen3_moe_experts/adapter");
  testing::check_run(testing::run_strata(str_cat(base, " --lora-alpha 5 --lora-targets q_proj,o_proj,mlp.gate.weight",
                                                 " --lora-adapter ", adapter)),
                     2, {"target_parameters", "differ", "mlp.experts.down_proj"});
}

}  // namespace strata
