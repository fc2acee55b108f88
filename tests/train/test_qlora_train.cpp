// QLoRA training (lora.base_dtype = "nf4", offload/state/nf4_layout.h) on the bundled tiny chat
// model: SFT lowers the held-out loss with the decoder layers packed on the host (the plan lists
// them apart), a run stopped and resumed equals the straight run bit for bit (layer-major
// accumulation too), and bad settings are refused naming the key.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "offload/state/model_io.h"
#include "offload/state/nf4_layout.h"
#include "src/recipe/recipe.h"
#include "src/train/trainer.h"
#include "tests/testing.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

std::string fresh(const char* name) { return testing::fresh_path("strata_qlora", name); }

Recipe qlora_recipe(const std::string& out, std::vector<std::string> extra) {
  std::vector<std::string> o = {"model.dtype=bf16", "lora.r=8", "lora.alpha=16", "lora.base_dtype=nf4", "offload.weights=stream",
                                "data.sequence_len=64", "train.micro_batch_size=2",
                                "train.gradient_accumulation_steps=2", "train.log_steps=100", "optim.learning_rate=3e-3",
                                "optim.warmup_steps=1", "checkpoint.save_steps=0", "device.cpu_threads=2",
                                "checkpoint.output_dir=" + out};
  o.insert(o.end(), extra.begin(), extra.end());
  return recipe_load(testing::source_path("recipes/sft-tiny/recipe.toml"), o);
}

}  // namespace

TEST_CASE("QLoRA SFT lowers the held-out loss with the decoder layers in NF4 on the host", "[qlora][train]") {
  const std::string out = fresh("sft");
  const TrainSummary s = train_run(qlora_recipe(out, {"train.max_steps=12", "train.eval_steps=4", "data.eval_split=0.1",
                                                      "lora.merge=true"}));
  REQUIRE(s.losses.size() == 12);
  const auto rec = testing::metrics_records(out, "eval_loss");
  REQUIRE(rec.size() >= 2);
  const double first = rec.front()["eval_loss"].get<double>(), last = rec.back()["eval_loss"].get<double>();
  std::printf("qlora sft: train loss %.4f -> %.4f, held-out %.4f -> %.4f\n", s.losses.front(), s.losses.back(), first,
              last);
  CHECK(last < first - 0.02);
  // the plan shows the packed decoder layers apart from the bf16 embeddings and lm_head
  const nlohmann::json plan = nlohmann::json::parse(testing::read_file(out + "/plan.json"));
  size_t layers = 0, rest = 0;
  for (const auto& st : plan["states"]) {
    const std::string kind = st["kind"];
    if (kind.rfind("working weights: decoder layers (NF4", 0) == 0) layers = st["bytes"].get<size_t>();
    if (kind.rfind("working weights: embeddings", 0) == 0) rest = st["bytes"].get<size_t>();
    CHECK(kind != "working weights (bf16)");
  }
  CHECK(layers > 0);
  CHECK(rest > 0);
  CHECK(fs::exists(out + "/final/adapter/adapter_model.safetensors"));

  // the merged export: the dequantized bf16 base + (alpha / r) B A, rounded once to bf16 (an NF4
  // store cannot hold merged weights: they are merged as they are written)
  const std::string tiny = testing::source_path("recipes/sft-tiny/models/tiny");
  ModelSpec spec = model_spec_build(hf_config_load(tiny), DType::bf16);
  nf4_base_enable(spec, true);
  auto dev = device_create(DeviceOptions{});
  HostStoreOptions so;
  so.weights_only = true;
  HostStore store(*dev, spec, so);
  model_load_weights(store, tiny);
  SafetensorsDir merged = SafetensorsDir::open(out + "/final/merged");
  SafetensorsFile adapter = SafetensorsFile::open(out + "/final/adapter/adapter_model.safetensors");
  CHECK_FALSE(nlohmann::json::parse(testing::read_file(out + "/final/merged/config.json")).contains("quantization_config"));
  for (const char* module : {"model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj"}) {
    INFO(module);
    const size_t row = spec.params.index_of(std::string(module) + ".weight");
    const int64_t o = spec.params[row].shape[0], in = spec.params[row].shape[1], r = 8;
    std::vector<float> base(size_t(o * in)), got(size_t(o * in)), A(size_t(r * in)), B(size_t(o * r));
    store.get_param(row, base.data());
    merged.read(std::string(module) + ".weight", DType::f32, got.data());
    adapter.read(*adapter.find(str_cat("base_model.model.", module, ".lora_A.weight")), DType::f32, A.data());
    adapter.read(*adapter.find(str_cat("base_model.model.", module, ".lora_B.weight")), DType::f32, B.data());
    size_t off = 0, changed = 0;
    for (int64_t i = 0; i < o; ++i)
      for (int64_t j = 0; j < in; ++j) {
        double d = 0;
        for (int64_t k = 0; k < r; ++k) d += double(B[size_t(i * r + k)]) * double(A[size_t(k * in + j)]);
        const float want = bf16_to_f32(f32_to_bf16(float(double(base[size_t(i * in + j)]) + 2.0 * d)));
        const float g = got[size_t(i * in + j)];
        changed += g != base[size_t(i * in + j)];
        if (g == want) continue;
        ++off;
        CHECK(std::abs(g - want) <= std::ldexp(std::abs(want), -7));  // one bf16 step
      }
    CHECK(changed > size_t(o * in) / 2);
    CHECK(off * 100 <= size_t(o * in));
  }
}

TEST_CASE("a QLoRA run stopped and resumed equals the straight run bit for bit", "[qlora][checkpoint]") {
  for (const char* accumulation : {"micro_batch", "layer_major"}) {
    INFO(accumulation);
    const std::string a = fresh(("straight_" + std::string(accumulation)).c_str());
    const std::string b = fresh(("resumed_" + std::string(accumulation)).c_str());
    const std::vector<std::string> common = {"train.max_steps=4", "checkpoint.save_steps=2", "optim.max_grad_norm=0",
                                             std::string("offload.accumulation=") + accumulation};
    const TrainSummary straight = train_run(qlora_recipe(a, common));
    TrainOptions stop;
    stop.stop_at_step = 3;
    const TrainSummary first = train_run(qlora_recipe(b, common), stop);
    REQUIRE(first.interrupted);
    TrainOptions resume;
    resume.resume_latest = true;
    const TrainSummary rest = train_run(qlora_recipe(b, common), resume);
    REQUIRE(straight.losses.size() == 4);
    REQUIRE(first.losses.size() == 3);  // stopped during step 3: saved there
    REQUIRE(rest.losses.size() == 1);
    for (size_t i = 0; i < 3; ++i) CHECK(first.losses[i] == straight.losses[i]);
    CHECK(rest.losses[0] == straight.losses[3]);
    CHECK(testing::read_file(a + "/final/adapter/adapter_model.safetensors") ==
          testing::read_file(b + "/final/adapter/adapter_model.safetensors"));
  }
}

TEST_CASE("QLoRA recipes: bad settings are refused with what to write", "[qlora][recipe]") {
  const std::string recipe = testing::source_path("recipes/sft-tiny/recipe.toml");
  auto error_of = [&](std::vector<std::string> o) {
    try {
      recipe_load(recipe, o);
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::input);
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(testing::contains(error_of({"lora.r=4", "lora.base_dtype=nf4", "model.dtype=f32"}), "model.dtype = \"bf16\""));
  CHECK(testing::contains(error_of({"lora.r=4", "lora.base_dtype=fp4", "model.dtype=bf16"}), "\"nf4\""));
  const Recipe r = recipe_load(recipe, {"lora.r=4", "lora.base_dtype=nf4", "model.dtype=bf16", "lora.double_quant=false"});
  CHECK(r.lora_base_dtype == "nf4");
  CHECK_FALSE(r.lora_double_quant);
  CHECK(recipe_load(recipe, {"lora.r=4"}).lora_base_dtype == "auto");
}

}  // namespace strata
