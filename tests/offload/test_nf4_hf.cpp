// bitsandbytes' NF4 in Hugging Face dirs (offload/state/nf4_hf.h) against what transformers 5.24 +
// bitsandbytes 0.50 saved for a tiny load_in_4bit Llama (tools/golden/make_bnb_nf4_dirs.py:
// tests/golden/bnb_nf4/{base, q4, q4_nodq}): `strata quantize` writes the same tensors byte for
// byte (names, dtypes, shapes, the quant_state JSON) and the same quantization_config; a
// pre-quantized dir loads as it is into an NF4 store and as bitsandbytes' dequantized weights into
// a plain one; other quantizations are refused by name.
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "io/json.h"
#include "offload/state/lora.h"
#include "offload/state/model_io.h"
#include "offload/state/nf4_hf.h"
#include "offload/state/nf4_layout.h"
#include "tests/testing.h"

namespace strata {

TEST_CASE("strata quantize writes what transformers and bitsandbytes save for load_in_4bit", "[qlora][nf4][cli]") {
  testing::TempDir tmp("nf4_quantize");
  const std::string golden = testing::source_path("tests/golden/bnb_nf4");
  for (bool dq : {true, false}) {
    INFO("double quantization " << dq);
    const std::string out = (tmp.path / (dq ? "q4" : "q4_nodq")).string();
    const auto r = testing::run_strata(str_cat("quantize --model ", golden, "/base --out ", out, dq ? "" : " --no-double-quant"));
    INFO(r.out);
    REQUIRE(r.code == 0);
    SafetensorsFile got = SafetensorsFile::open(out + "/model.safetensors");
    SafetensorsFile want = SafetensorsFile::open(golden + (dq ? "/q4" : "/q4_nodq") + "/model.safetensors");
    REQUIRE(got.entries().size() == want.entries().size());
    size_t u8 = 0;
    for (const SafetensorsEntry& w : want.entries()) {
      INFO(w.name);
      const SafetensorsEntry* e = got.find(w.name);
      REQUIRE(e);
      CHECK(e->dtype == w.dtype);
      CHECK(e->shape == w.shape);
      REQUIRE(e->bytes() == w.bytes());
      CHECK(std::memcmp(got.data(*e), want.data(w), w.bytes()) == 0);
      u8 += w.dtype == DType::u8;
    }
    CHECK(u8 == (dq ? 3 : 2) * 14);  // codes, (absmax,) quant_state of the 14 linears
    const nlohmann::json qc = nlohmann::json::parse(testing::read_file(out + "/config.json"))["quantization_config"];
    const nlohmann::json want_qc =
        nlohmann::json::parse(testing::read_file(golden + (dq ? "/q4" : "/q4_nodq") + "/config.json"))["quantization_config"];
    CHECK(qc == want_qc);
  }
  testing::check_run(testing::run_strata(str_cat("quantize --model ", golden, "/base --out ", (tmp.path / "x").string(),
                                                 " --base-dtype int8")), 2, {"--base-dtype int8", "\"nf4\""});
}

TEST_CASE("a pre-quantized bitsandbytes dir loads as it is, or as bitsandbytes' dequantized weights", "[qlora][nf4]") {
  auto dev = device_create(DeviceOptions{});
  const std::string golden = testing::source_path("tests/golden/bnb_nf4");
  HostStoreOptions so;
  so.weights_only = true;
  for (bool dq : {true, false}) {
    INFO("double quantization " << dq);
    const std::string q4 = golden + (dq ? "/q4" : "/q4_nodq");
    const ModelConfig cfg = hf_config_load(q4);
    const HfQuantization q = hf_quantization_of(cfg, q4);
    CHECK(q.nf4);
    CHECK(q.double_quant == dq);
    ModelSpec packed_spec = model_spec_build(cfg, DType::bf16);
    nf4_base_enable(packed_spec, dq);
    HostStore from_dir(*dev, packed_spec, so), at_load(*dev, packed_spec, so);
    model_load_weights(from_dir, q4);
    model_load_weights(at_load, golden + "/base");  // quantized here
    const size_t bytes = from_dir.working_table().tier_bytes(Tier::host_pinned);
    CHECK(std::memcmp(from_dir.working(), at_load.working(), bytes) == 0);  // interchangeable
    // a plain store: the dequantized weights, bitsandbytes' dequantize_4bit to the bit
    const ModelSpec plain = model_spec_build(cfg, DType::bf16);
    HostStore deq(*dev, plain, so);
    model_load_weights(deq, q4);
    SafetensorsFile want = SafetensorsFile::open(golden + (dq ? "/q4_dequantized.safetensors" : "/q4_nodq_dequantized.safetensors"));
    REQUIRE(want.entries().size() == 14);
    for (const SafetensorsEntry& w : want.entries()) {
      INFO(w.name);
      const size_t row = plain.params.index_of(w.name);
      std::vector<float> got(size_t(plain.params[row].numel())), ref(size_t(w.numel()));
      deq.get_param(row, got.data());
      want.read(w, DType::f32, ref.data());
      CHECK(got == ref);
    }
  }
}

TEST_CASE("strata generate --adapter on a pre-quantized base equals it on the dequantized bf16 base", "[qlora][nf4][cli]") {
  // The adapter merged into bitsandbytes' dequantized weights (a plain bf16 store), as PEFT applies
  // it to a 4-bit base: the same greedy tokens as the same adapter on a bf16 dir of those weights,
  // and other tokens than the base alone.
  testing::TempDir tmp("nf4_generate");
  const std::string q4 = testing::source_path("tests/golden/bnb_nf4/q4");
  auto dev = device_create(DeviceOptions{});
  const ModelSpec spec = model_spec_build(hf_config_load(q4), DType::bf16);
  HostStoreOptions so;
  so.weights_only = true;
  HostStore deq(*dev, spec, so);
  model_load_weights(deq, q4);
  const std::string deq_dir = (tmp.path / "dequantized").string();
  model_save_hf(deq, deq_dir, DType::bf16);
  LoraOptions lo;
  lo.r = 2;
  lo.alpha = 4;
  LoraStore lora(*dev, spec, lo);
  lora.init(3);
  for (size_t b : lora.layout().b_rows) {  // B = 0 would change nothing
    const TensorSpec& t = lora.layout().table[b];
    const std::vector<float> v = testing::random_floats(size_t(t.numel()), b + 1, -0.5f, 0.5f);
    std::memcpy(lora.master() + t.offset / 4, v.data(), v.size() * 4);
  }
  const std::string adapter = (tmp.path / "adapter").string();
  lora.save_peft(adapter, q4);
  const std::string input = tmp.file("in.jsonl", "{\"input_ids\": [5, 17, 290, 3, 44]}\n");
  auto ids = [&](const std::string& model, bool with_adapter) {
    const auto r = testing::run_strata(str_cat("generate --model ", model, with_adapter ? " --adapter " + adapter : "",
                                               " --max-new-tokens 12 --temperature 0 < ", input));
    INFO(r.out);
    REQUIRE(r.code == 0);
    const size_t at = r.out.find("{\"text\"");
    REQUIRE(at != std::string::npos);
    return nlohmann::json::parse(r.out.substr(at, r.out.find('\n', at) - at))["ids"].get<std::vector<int>>();
  };
  const std::vector<int> on_q4 = ids(q4, true);
  CHECK(on_q4.size() == 12);
  CHECK(on_q4 == ids(deq_dir, true));
  CHECK(on_q4 != ids(q4, false));
}

TEST_CASE("other quantizations in config.json are refused by name", "[qlora][nf4]") {
  testing::TempDir tmp("nf4_refusals");
  const std::string golden = testing::source_path("tests/golden/bnb_nf4/q4");
  nlohmann::json cfg = nlohmann::json::parse(testing::read_file(golden + "/config.json"));
  auto refusal = [&](const nlohmann::json& qc) {
    cfg["quantization_config"] = qc;
    const std::string dir = (tmp.path / "m").string();
    std::filesystem::create_directories(dir);
    std::ofstream(dir + "/config.json") << cfg.dump(2);
    try {
      hf_quantization_of(hf_config_load(dir), dir);
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::input);
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(testing::contains(refusal({{"quant_method", "gptq"}, {"bits", 4}}), "quant_method = \"gptq\""));
  CHECK(testing::contains(refusal({{"quant_method", "awq"}}), "\"awq\""));
  CHECK(testing::contains(refusal({{"quant_method", "bitsandbytes"}, {"load_in_8bit", true}}), "8-bit (int8)"));
  CHECK(testing::contains(refusal({{"quant_method", "bitsandbytes"}, {"load_in_4bit", true}, {"bnb_4bit_quant_type", "fp4"}}),
                          "4-bit fp4"));
}

}  // namespace strata
