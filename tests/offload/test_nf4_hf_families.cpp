// bitsandbytes' NF4 dirs of the newer families (offload/state/nf4_hf.h) against what transformers
// 5.24 + bitsandbytes 0.50 saved (tools/golden/make_bnb_nf4_dirs.py families:
// tests/golden/bnb_nf4/{phi3_q4, qwen3_moe_q4}): `strata quantize` of Phi-3 writes the same
// tensors byte for byte, its fused qkv_proj and gate_up_proj quantized; the MoE dir (experts and
// routers left bf16 by bitsandbytes) reads into an NF4 store as quantizing the model at load does
// (the same packed rows; the rest as transformers rounded it to bf16), and `strata quantize` of it writes the same tensors byte for byte too.
#include <catch2/catch.hpp>
#include <cstring>
#include <set>

#include "io/json.h"
#include "offload/state/model_io.h"
#include "offload/state/nf4_hf.h"
#include "offload/state/nf4_layout.h"
#include "tests/testing.h"

namespace strata {
namespace {

// Tensor `name` of dir as its bytes on disk.
std::vector<char> raw_tensor(const SafetensorsDir& dir, const std::string& name) {
  const SafetensorsEntry* e = dir.find(name);
  REQUIRE(e);
  std::vector<char> out(e->bytes());
  dir.read(name, e->dtype, out.data());
  return out;
}

}  // namespace

TEST_CASE("strata quantize of phi3 writes what transformers and bitsandbytes save with the fused projections quantized",
          "[qlora][nf4][cli][phi3]") {
  testing::TempDir tmp("nf4_quantize_phi3");
  const std::string want_dir = testing::source_path("tests/golden/bnb_nf4/phi3_q4");
  const std::string out = (tmp.path / "q4").string();
  const auto r = testing::run_strata(str_cat("quantize --model ", testing::source_path("tests/golden/phi3"), " --out ", out));
  INFO(r.out);
  REQUIRE(r.code == 0);
  const SafetensorsDir got = SafetensorsDir::open(out), want = SafetensorsDir::open(want_dir);
  CHECK(got.names() == want.names());
  size_t states = 0;
  for (const std::string& name : want.names()) {
    INFO(name);
    const SafetensorsEntry *e = got.find(name), *w = want.find(name);
    REQUIRE(e);
    CHECK(e->dtype == w->dtype);
    CHECK(e->shape == w->shape);
    CHECK(raw_tensor(got, name) == raw_tensor(want, name));
    states += testing::contains(name, "quant_state.bitsandbytes__nf4");
  }
  CHECK(want.find("model.layers.0.self_attn.qkv_proj.weight.quant_state.bitsandbytes__nf4"));
  CHECK(want.find("model.layers.0.mlp.gate_up_proj.weight.quant_state.bitsandbytes__nf4"));
  const ModelConfig cfg = hf_config_load(testing::source_path("tests/golden/phi3"));
  CHECK(states == size_t(4 * cfg.num_hidden_layers));  // qkv_proj, o_proj, gate_up_proj, down_proj
  const nlohmann::json qc = nlohmann::json::parse(testing::read_file(out + "/config.json"))["quantization_config"];
  CHECK(qc == nlohmann::json::parse(testing::read_file(want_dir + "/config.json"))["quantization_config"]);
}

TEST_CASE("a bitsandbytes NF4 mixture of experts reads as quantizing it at load does and strata quantize writes it",
          "[qlora][nf4][moe]") {
  auto dev = device_create(DeviceOptions{});
  const std::string q4 = testing::source_path("tests/golden/bnb_nf4/qwen3_moe_q4");
  const std::string base = testing::source_path("tests/golden/qwen3_moe");
  const ModelConfig cfg = hf_config_load(q4);
  const HfQuantization q = hf_quantization_of(cfg, q4);
  REQUIRE(q.nf4);
  REQUIRE(q.double_quant);
  ModelSpec spec = model_spec_build(cfg, DType::bf16);
  nf4_base_enable(spec, true);
  HostStoreOptions so;
  so.weights_only = true;
  HostStore from_dir(*dev, spec, so), at_load(*dev, spec, so);
  model_load_weights(from_dir, q4);
  model_load_weights(at_load, base);
  // The packed rows byte for byte; the others as values: transformers loaded the model in bf16, so
  // its dir holds the f32 checkpoint's norms rounded to bf16 (strata keeps vectors in f32)
  size_t packed_rows = 0;
  for (size_t r = 0; r < spec.params.size(); ++r) {
    const TensorSpec& t = from_dir.working_table()[r];
    INFO(t.name);
    if (t.dtype == DType::u8) {
      CHECK(std::memcmp(from_dir.working() + t.offset, at_load.working() + t.offset, t.bytes()) == 0);
      ++packed_rows;
      continue;
    }
    std::vector<float> a(size_t(spec.params[r].numel())), b(a.size());
    from_dir.get_param(r, a.data());
    at_load.get_param(r, b.data());
    for (float& x : b) x = bf16_to_f32(f32_to_bf16(x));
    CHECK(a == b);
  }
  CHECK(packed_rows == 15);
  // strata quantize of the bf16 model: every quantized weight's tensors as bitsandbytes wrote them
  testing::TempDir tmp("nf4_quantize_moe");
  const std::string out = (tmp.path / "q4").string();
  const auto r = testing::run_strata(str_cat("quantize --model ", base, " --out ", out));
  INFO(r.out);
  REQUIRE(r.code == 0);
  const SafetensorsDir got = SafetensorsDir::open(out), want = SafetensorsDir::open(q4);
  CHECK(got.names() == want.names());  // the experts under the Hub's per-expert names, as transformers saves them
  size_t quantized = 0;
  for (const std::string& name : want.names()) {
    INFO(name);
    REQUIRE(got.find(name));
    CHECK(got.find(name)->dtype == want.find(name)->dtype);
    CHECK(raw_tensor(got, name) == raw_tensor(want, name));
    quantized += testing::contains(name, "quant_state.bitsandbytes__nf4");
  }
  CHECK(quantized == 15);  // q, k, v, o of 3 layers, and the dense layer 1's gate, up, down
  CHECK_FALSE(want.find("model.layers.0.mlp.experts.0.gate_proj.weight.absmax"));
  // and the quantized dir strata wrote reads back into the store bitsandbytes' dir gives
  HostStore again(*dev, spec, so);
  model_load_weights(again, out);
  const size_t bytes = from_dir.working_table().tier_bytes(Tier::host_pinned);
  CHECK(std::memcmp(again.working(), from_dir.working(), bytes) == 0);
}

}  // namespace strata
