// `strata grad --lora LORA.toml` with lora.base_dtype = "nf4" in the TOML's [lora] table: the
// adapters' gradients against the fp64 PEFT + bitsandbytes goldens
// (tools/golden/make_qlora_grad_goldens.py), through the command line; and the refusal of a bad base_dtype.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>

#include "tests/offload/qlora_testing.h"
#include "tests/testing.h"

namespace strata {

TEST_CASE("strata grad --lora with base_dtype nf4 in the TOML matches the QLoRA goldens", "[qlora][golden][cli]") {
  // f32 compute on the dequantized bf16 weights: the worst tensor ~1e-6 relative L2 (1e-4 allowed)
  testing::TempDir tmp("qlora_grad_cli");
  for (const char* name : {"llama", "mistral"}) {
    for (bool dq : {true, false}) {
      INFO(name << " double_quant " << dq);
      const std::string dir = testing::source_path("tests/golden/lora_grad/") + name;
      const nlohmann::json lora = nlohmann::json::parse(testing::read_file(dir + "/expected.json"));
      const nlohmann::json want =
          nlohmann::json::parse(testing::read_file(testing::source_path("tests/golden/qlora_grad/") + name + "/expected.json"));
      std::string targets;
      for (const auto& t : lora["targets"]) targets += (targets.empty() ? "" : ",") + t.get<std::string>();
      const std::string cfg = tmp.file(str_cat(name, dq, ".toml"),
                                       str_cat("[lora]\nr = ", lora["r"].get<int64_t>(), "\nalpha = ", lora["alpha"].get<double>(),
                                               "\ntarget_modules = \"", targets, "\"\nadapter = \"", dir,
                                               "/adapter\"\nbase_dtype = \"nf4\"\ndouble_quant = ", dq ? "true" : "false", "\n"));
      const std::string model = testing::source_path("tests/golden/") + name;
      const std::string out = (tmp.path / str_cat(name, dq, ".safetensors")).string();
      const auto r = testing::run_strata(str_cat("grad --model ", model, " --batch ", model, "/batch.json --out ", out,
                                                 " --dtype f32 --lora ", cfg), true);
      INFO(r.out);
      REQUIRE(r.code == 0);
      const double loss = nlohmann::json::parse(r.out)["loss"].get<double>();
      const double want_loss = want[dq ? "loss" : "loss_nodq"].get<double>();
      CHECK(std::abs(loss - want_loss) <= 2e-6 * want_loss);
      SafetensorsFile got = SafetensorsFile::open(out);
      SafetensorsFile ref = SafetensorsFile::open(testing::source_path("tests/golden/qlora_grad/") + name +
                                                  (dq ? "/grads.safetensors" : "/grads_nodq.safetensors"));
      REQUIRE(got.entries().size() == ref.entries().size());
      double worst = 0;
      for (const SafetensorsEntry& w : ref.entries()) {
        const SafetensorsEntry* e = got.find(w.name);
        REQUIRE(e);
        const float* g = static_cast<const float*>(got.data(*e));
        worst = std::max(worst, testing::qlora_rel_l2(std::vector<float>(g, g + w.numel()),
                                                      static_cast<const float*>(ref.data(w))));
      }
      CHECK(worst <= 1e-4);
      std::printf("strata grad qlora %-7s double_quant %d: loss %.9f (want %.9f), worst adapter grad rel L2 %.2e\n", name,
                  int(dq), loss, want_loss, worst);
    }
  }
}

TEST_CASE("strata grad --lora refuses a bad base_dtype by name", "[qlora][cli]") {
  // (a mixture of experts on an NF4 base is no longer refused: tests/models/test_qlora_families.cpp)
  testing::TempDir tmp("qlora_grad_refusals");
  const std::string llama = testing::source_path("tests/golden/llama");
  const std::string bad = tmp.file("bad.toml", "[lora]\nr = 2\nbase_dtype = \"fp4\"\n");
  testing::check_run(testing::run_strata(str_cat("grad --model ", llama, " --batch ", llama, "/batch.json --out /dev/null --lora ", bad)),
                     2, {"lora.base_dtype", "\"nf4\""});
}

}  // namespace strata
