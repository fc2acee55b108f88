// PEFT LoRA adapters (models/lora_adapter.h) and the weights-only host store generation uses:
//   - lora_merge_weight against an fp64 loop on awkward sizes;
//   - the golden adapter (tools/golden/make_lora_goldens.py: torch, PEFT's math by hand) merged
//     at load into a bf16 weights-only store equals torch's merged model, tensor by tensor;
//   - a broken adapter is refused (exit 2) naming what is wrong;
//   - a weights-only store holds the working weights and nothing else.
#include <catch2/catch.hpp>
#include <filesystem>
#include <functional>

#include "models/lora_adapter.h"
#include "offload/state/host_store.h"
#include "offload/state/model_io.h"
#include "tests/testing.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

const std::string kBase = "tests/golden/llama", kAdapter = "tests/golden/lora/adapter",
                  kMerged = "tests/golden/lora/merged";

ModelSpec golden_spec(DType dtype) { return model_spec_build(hf_config_load(testing::source_path(kBase)), dtype); }

TEST_CASE("lora_merge_weight matches an fp64 loop", "[lora_adapter]") {
  const int64_t out = 17, in = 33, r = 5;
  const float scale = 1.7f;
  const auto W0 = testing::random_floats(size_t(out * in), 1), A = testing::random_floats(size_t(r * in), 2),
             B = testing::random_floats(size_t(out * r), 3);
  std::vector<float> W = W0;
  lora_merge_weight(W.data(), A.data(), B.data(), out, in, r, scale);
  double worst = 0;
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) {
      double ba = 0;
      for (int64_t k = 0; k < r; ++k) ba += double(B[size_t(o * r + k)]) * double(A[size_t(k * in + i)]);
      const double want = double(W0[size_t(o * in + i)]) + double(scale) * ba;
      worst = std::max(worst, std::abs(double(W[size_t(o * in + i)]) - want));
    }
  INFO("max abs error " << worst);
  CHECK(worst < 1e-5);  // f32: |W| + |s BA| < 12, a few roundings of 6e-8 relative
  CHECK(worst > 0);     // it did round in f32 (the check can see a wrong order of operations)
}

TEST_CASE("the golden adapter merged at load equals torch's merged model", "[lora_adapter]") {
  const ModelSpec spec = golden_spec(DType::bf16);
  const LoraAdapter adapter = lora_adapter_read(testing::source_path(kAdapter), spec);
  CHECK(adapter.r == 3);
  CHECK(adapter.lora_alpha == 7.5);
  REQUIRE(adapter.pairs.size() == 12);  // 2 layers x 6 target kinds (up_proj is not targeted)
  for (const LoraPair& p : adapter.pairs) {
    CHECK(p.scale == 2.5f);
    CHECK(p.module.find("up_proj") == std::string::npos);
  }
  auto dev = device_create(DeviceOptions{});
  HostStoreOptions ho;
  ho.weights_only = true;
  HostStore merged(*dev, spec, ho), base(*dev, spec, ho);
  model_load_weights(merged, testing::source_path(kBase), &adapter);
  model_load_weights(base, testing::source_path(kBase));
  const SafetensorsDir torch_merged = SafetensorsDir::open(testing::source_path(kMerged));
  size_t changed = 0, elements = 0;
  for (size_t row = 0; row < spec.params.size(); ++row) {
    const TensorSpec& t = spec.params[row];
    std::vector<float> got(size_t(t.numel())), want(got.size()), before(got.size());
    merged.get_param(row, got.data());
    base.get_param(row, before.data());
    torch_merged.read(t.name, DType::f32, want.data());
    size_t differ = 0;
    for (size_t i = 0; i < got.size(); ++i) differ += got[i] != want[i];
    INFO(t.name << ": " << differ << " of " << got.size() << " values differ from torch's bf16 merge");
    CHECK(differ == 0);  // bit for bit: the f32 product and sum round to the same bf16
    for (size_t i = 0; i < got.size(); ++i) changed += got[i] != before[i];
    if (adapter.find(row)) elements += got.size();
    else CHECK(got == before);
  }
  INFO(changed << " of " << elements << " adapted weights changed");
  CHECK(changed > elements / 2);  // the merge is not a no-op
}

// A copy of the golden adapter in `dir`, with adapter_config.json's `key` set to `value` (JSON)
// when key is not empty.
std::string adapter_copy(const testing::TempDir& tmp, const std::string& key = "", const std::string& value = "") {
  const fs::path dir = tmp.path / "adapter";
  fs::create_directories(dir);
  fs::copy_file(testing::source_path(kAdapter + "/adapter_model.safetensors"), dir / "adapter_model.safetensors",
                fs::copy_options::overwrite_existing);
  nlohmann::json cfg = nlohmann::json::parse(testing::read_file(testing::source_path(kAdapter + "/adapter_config.json")));
  if (!key.empty()) cfg[key] = nlohmann::json::parse(value);
  testing::write_file((dir / "adapter_config.json").string(), cfg.dump(2));
  return dir.string();
}

// Rewrites the copy's safetensors with the golden tensors `keep` says to keep, and extra ones.
void rewrite_tensors(const std::string& dir, const std::function<bool(const std::string&)>& keep,
                     const std::vector<std::pair<std::string, std::vector<int64_t>>>& extra = {}) {
  const SafetensorsFile f = SafetensorsFile::open(testing::source_path(kAdapter + "/adapter_model.safetensors"));
  std::vector<std::vector<float>> values;
  values.reserve(f.entries().size() + extra.size());
  std::vector<TensorToWrite> out;
  for (const SafetensorsEntry& e : f.entries()) {
    if (!keep(e.name)) continue;
    values.emplace_back(size_t(e.numel()));
    f.read(e, DType::f32, values.back().data());
    out.emplace_back(e.name, DType::f32, e.shape, values.back().data());
  }
  for (const auto& [name, shape] : extra) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    values.emplace_back(size_t(n), 0.5f);
    out.emplace_back(name, DType::f32, shape, values.back().data());
  }
  safetensors_write_file(dir + "/adapter_model.safetensors", out);
}

TEST_CASE("a broken adapter is refused, naming what is wrong", "[lora_adapter]") {
  testing::TempDir tmp("lora_adapter_errors");
  const ModelSpec spec = golden_spec(DType::bf16);
  auto read = [&](const std::string& dir) { return testing::error_of([&] { lora_adapter_read(dir, spec); }); };
  const std::string q0 = "base_model.model.model.layers.0.self_attn.q_proj";

  CHECK_THAT(read((tmp.path / "nowhere").string()), Catch::Contains("is not a directory"));
  std::string dir = adapter_copy(tmp);
  CHECK_NOTHROW(lora_adapter_read(dir, spec));
  fs::remove(fs::path(dir) / "adapter_config.json");
  CHECK_THAT(read(dir), Catch::Contains("adapter_config.json"));

  dir = adapter_copy(tmp, "target_modules", R"(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "down_proj", "foo_proj"])");
  std::string msg = read(dir);
  CHECK_THAT(msg, Catch::Contains("target module 'foo_proj' is not a linear module"));
  CHECK_THAT(msg, Catch::Contains("q_proj"));
  dir = adapter_copy(tmp, "target_modules", R"(["q_proj"])");  // the file holds more than the config targets
  CHECK_THAT(read(dir), Catch::Contains("is not among adapter_config.json's target_modules"));
  dir = adapter_copy(tmp, "target_modules", R"("all-linear")");  // up_proj is targeted but absent
  CHECK_THAT(read(dir), Catch::Contains("model.layers.1.mlp.up_proj has no"));
  dir = adapter_copy(tmp, "r", "4");
  CHECK_THAT(read(dir), Catch::Contains(q0 + ".lora_A.weight is [3, 40], expected [4, 40]"));
  dir = adapter_copy(tmp, "fan_in_fan_out", "true");
  CHECK_THAT(read(dir), Catch::Contains("fan_in_fan_out"));
  dir = adapter_copy(tmp, "use_dora", "true");
  CHECK_THAT(read(dir), Catch::Contains("DoRA"));
  dir = adapter_copy(tmp, "peft_type", R"("IA3")");
  CHECK_THAT(read(dir), Catch::Contains("only \"LORA\""));

  dir = adapter_copy(tmp);
  rewrite_tensors(dir, [&](const std::string& n) { return n != q0 + ".lora_B.weight"; });
  CHECK_THAT(read(dir), Catch::Contains(q0 + ".lora_A.weight has no " + q0 + ".lora_B.weight"));
  rewrite_tensors(dir, [](const std::string&) { return true; },
                  {{"base_model.model.model.layers.7.self_attn.q_proj.lora_A.weight", {3, 40}},
                   {"base_model.model.model.embed_tokens.lora_embedding_A", {3, 97}}});
  msg = read(dir);
  CHECK_THAT(msg, Catch::Contains("the model has no linear module model.layers.7.self_attn.q_proj"));
  CHECK_THAT(msg, Catch::Contains("lora_embedding_A' is not a LoRA matrix"));

  // a truncated file: bad input naming it
  dir = adapter_copy(tmp);
  fs::resize_file(fs::path(dir) / "adapter_model.safetensors", 1000);
  CHECK_THAT(read(dir), Catch::Contains("adapter_model.safetensors"));
  fs::remove(fs::path(dir) / "adapter_model.safetensors");
  testing::write_file(dir + "/adapter_model.bin", "pickle");
  CHECK_THAT(read(dir), Catch::Contains("safe_serialization"));
}

TEST_CASE("rank_pattern, alpha_pattern and use_rslora set each module's scale", "[lora_adapter]") {
  testing::TempDir tmp("lora_adapter_patterns");
  const ModelSpec spec = golden_spec(DType::f32);
  std::string dir = adapter_copy(tmp, "alpha_pattern", R"({"layers.1.self_attn.q_proj": 3.0})");
  LoraAdapter a = lora_adapter_read(dir, spec);
  for (const LoraPair& p : a.pairs) CHECK(p.scale == (p.module == "model.layers.1.self_attn.q_proj" ? 1.0f : 2.5f));
  dir = adapter_copy(tmp, "use_rslora", "true");
  a = lora_adapter_read(dir, spec);
  for (const LoraPair& p : a.pairs) CHECK(p.scale == float(7.5 / std::sqrt(3.0)));
  dir = adapter_copy(tmp, "rank_pattern", R"({"down_proj": 5})");
  CHECK_THAT(testing::error_of([&] { lora_adapter_read(dir, spec); }),
             Catch::Contains("mlp.down_proj.lora_A.weight is [3, 72], expected [5, 72]"));
}

TEST_CASE("a weights-only host store holds the working weights alone", "[lora_adapter][host_store]") {
  const ModelSpec spec = golden_spec(DType::bf16);
  auto dev = device_create(DeviceOptions{});
  HostStoreOptions ho;
  ho.weights_only = true;
  HostStore store(*dev, spec, ho);
  const size_t working = HostStore::layout(spec).working.tier_bytes(Tier::host_pinned);
  CHECK(store.pinned_bytes() + store.host_bytes() == working);
  const HostMemoryEstimate e = HostStore::estimate(spec, ho);
  CHECK(e.total() == working);
  CHECK(e.master == 0);
  CHECK(e.moments == 0);
  CHECK(e.grads == 0);
  CHECK(store.grad() == nullptr);
  CHECK(store.m() == nullptr);
  CHECK(store.master() == nullptr);
  HostStore full(*dev, spec);  // training's store: working + master + m + v + grad
  CHECK(full.pinned_bytes() + full.host_bytes() == working + 4 * HostStore::layout(spec).f32.tier_bytes(Tier::host));
  // values round-trip through the working copy (bf16 values stay exact)
  model_load_weights(store, testing::source_path(kBase));
  model_load_weights(full, testing::source_path(kBase));
  for (size_t row = 0; row < spec.params.size(); ++row) {
    std::vector<float> a(size_t(spec.params[row].numel())), b(a.size());
    store.get_param(row, a.data());
    full.get_param(row, b.data());
    INFO(spec.params[row].name);
    CHECK(a == b);
  }
}

}  // namespace
}  // namespace strata
