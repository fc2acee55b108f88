// LoRA training (offload/state/lora.h) on the bundled tiny chat model: the loss falls, the host holds
// the frozen base's bf16 working copy (2 bytes per parameter) plus the adapters' state, a
// micro-batch sends no base gradient over the link, resume is bit-exact, the exports are PEFT's
// adapter dir and (lora.merge) the merged model, and a preference objective runs on adapters.
#include <catch2/catch.hpp>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "offload/engine/engine.h"
#include "offload/state/lora.h"
#include "offload/state/model_io.h"
#include "src/recipe/recipe.h"
#include "src/train/trainer.h"
#include "tests/testing.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

std::string fresh(const char* name) { return testing::fresh_path("strata_lora", name); }

const std::string kTiny = testing::source_path("recipes/sft-tiny/models/tiny");

Recipe lora_recipe(const std::string& out, std::vector<std::string> extra) {
  std::vector<std::string> o = {"model.dtype=bf16", "lora.r=8", "lora.alpha=16", "data.sequence_len=64",
                                "train.micro_batch_size=2", "train.gradient_accumulation_steps=2", "train.log_steps=100",
                                "optim.learning_rate=3e-3", "optim.warmup_steps=1", "checkpoint.save_steps=0",
                                "device.cpu_threads=2", "checkpoint.output_dir=" + out};
  o.insert(o.end(), extra.begin(), extra.end());
  return recipe_load(testing::source_path("recipes/sft-tiny/recipe.toml"), o);
}

size_t plan_bytes(const nlohmann::json& plan, const std::string& kind, bool* found = nullptr) {
  for (const auto& s : plan["states"])
    if (s["kind"] == kind) {
      if (found) *found = true;
      return s["bytes"].get<size_t>();
    }
  if (found) *found = false;
  return 0;
}

}  // namespace

TEST_CASE("LoRA SFT lowers the loss with 2 bytes per base parameter on the host and exports PEFT's adapter", "[lora][train]") {
  const std::string out = fresh("sft");
  const TrainSummary s = train_run(lora_recipe(out, {"train.max_steps=8", "lora.merge=true"}));
  REQUIRE(s.losses.size() == 8);
  std::printf("lora sft: loss %.4f -> %.4f\n", s.losses.front(), s.losses.back());
  CHECK(s.losses.back() < s.losses.front() - 0.05);

  // the plan: the base's working copy alone; the adapters' master + moments and gradient + image
  const ModelSpec spec = model_spec_build(hf_config_load(kTiny), DType::bf16);
  LoraOptions lo;
  lo.r = 8;
  lo.alpha = 16;
  const LoraLayout layout = LoraLayout::of(spec, lo);
  const nlohmann::json plan = nlohmann::json::parse(testing::read_file(out + "/plan.json"));
  const size_t working = plan_bytes(plan, "working weights (bf16)");
  const double per_param = double(working) / double(spec.parameter_count());
  std::printf("lora sft: base %.3fM parameters, host working copy %.4f B/param, adapters %.3fM parameters\n",
              double(spec.parameter_count()) / 1e6, per_param, double(layout.parameter_count()) / 1e6);
  CHECK(per_param >= 2.0);
  CHECK(per_param < 2.01);  // alignment of each tensor only
  bool found = true;
  for (const char* kind : {"fp32 gradient accumulation", "fp32 master weights", "AdamW moments (f32 m and v)"}) {
    INFO(kind);
    plan_bytes(plan, kind, &found);
    CHECK_FALSE(found);
  }
  CHECK(plan_bytes(plan, "LoRA adapters: fp32 master, AdamW m and v") == 3 * layout.bytes);
  CHECK(plan_bytes(plan, "LoRA adapters: gradient and device image") == 2 * layout.bytes);
  // what the run held (metrics host_bytes: the store and the adapters) is the plan's
  const auto rec = testing::metrics_records(out, "host_bytes");
  REQUIRE(!rec.empty());
  CHECK(rec.back()["host_bytes"].get<size_t>() == working + 5 * layout.bytes);

  // exports: the PEFT adapter dir, and the merged model
  const nlohmann::json cfg = nlohmann::json::parse(testing::read_file(out + "/final/adapter/adapter_config.json"));
  CHECK(cfg["peft_type"] == "LORA");
  CHECK(cfg["task_type"] == "CAUSAL_LM");
  CHECK(cfg["r"] == 8);
  CHECK(cfg["lora_alpha"] == 16.0);
  CHECK(cfg["lora_dropout"] == 0.0);
  CHECK(cfg["target_modules"].size() == 7);
  CHECK(cfg["base_model_name_or_path"] == kTiny);
  SafetensorsFile adapter = SafetensorsFile::open(out + "/final/adapter/adapter_model.safetensors");
  CHECK(adapter.entries().size() == layout.table.size());
  CHECK(adapter.find("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"));
  CHECK(fs::exists(out + "/checkpoint-8/adapter/adapter_model.safetensors"));
  CHECK_FALSE(fs::exists(out + "/checkpoint-8/hf"));
  SafetensorsDir merged = SafetensorsDir::open(out + "/final/merged");
  CHECK(merged.find("model.layers.0.self_attn.q_proj.weight"));

  SECTION("lora.adapter continues from the saved adapters: the first loss is the last run's level") {
    const std::string more = fresh("continued");
    const TrainSummary c = train_run(lora_recipe(more, {"train.max_steps=1", "lora.adapter=" + out + "/final/adapter",
                                                       "optim.learning_rate=0"}));
    REQUIRE(c.losses.size() == 1);
    CHECK(c.losses[0] < s.losses.front() - 0.05);
  }
}

TEST_CASE("a LoRA micro-batch sends no base gradient over the link, the step moves the adapters once", "[lora][engine]") {
  // checkpoints on the device: the only device -> host copy of a micro-batch is its loss (8
  // bytes); the optimizer step brings the adapters' gradients (their arena) and sends the new
  // adapters back, once per step whatever the accumulation.
  auto dev = device_create(DeviceOptions{});
  const testing::Golden g = testing::Golden::load("qwen3");
  const ModelSpec spec = model_spec_build(hf_config_load(g.dir), DType::bf16);
  HostStoreOptions so;
  so.weights_only = true;
  HostStore store(*dev, spec, so);
  model_load_weights(store, g.dir);
  CHECK(store.grad() == nullptr);
  CHECK(store.m() == nullptr);
  LoraOptions lo;
  lo.r = 4;
  LoraStore lora(*dev, spec, lo);
  lora.init(3);
  EngineOptions eo;
  eo.checkpoints = CheckpointMode::device;
  eo.max_batch = g.batch.B;
  eo.max_tokens = g.batch.T;
  eo.lora = lo;
  Engine engine(*dev, store, eo, &lora);
  const DeviceCounters c0 = dev->counters();
  engine.forward_backward(g.batch, 1.f);
  engine.forward_backward(g.batch, 1.f);
  engine.synchronize();
  const DeviceCounters c1 = dev->counters();
  std::printf("lora link: %zu bytes device->host over 2 micro-batches, %zu host->device; base %.0f bytes of bf16 weights\n",
              c1.d2h_bytes - c0.d2h_bytes, c1.h2d_bytes - c0.h2d_bytes, double(spec.parameter_count()) * 2);
  CHECK(c1.d2h_bytes - c0.d2h_bytes == 2 * sizeof(double));
  AdamWParams p;
  const double norm = engine.optimizer_step(p, 0.0, 0.0);
  engine.synchronize();
  const DeviceCounters c2 = dev->counters();
  CHECK(norm > 0);
  CHECK(c2.d2h_bytes - c1.d2h_bytes == lora.layout().bytes);
  CHECK(c2.h2d_bytes - c1.h2d_bytes == lora.layout().bytes);
}

TEST_CASE("LoRA dropout: one mask per (step, micro-batch) in the global order, forward-only passes see none",
          "[lora][engine][dropout]") {
  // The qwen3 golden's adapters (B != 0, so the adapter path matters), f32. The gradients against
  // torch are tests/models/test_lora_grad.cpp's; this checks which passes draw which masks.
  auto dev = device_create(DeviceOptions{});
  const testing::Golden g = testing::Golden::load("qwen3");
  const std::string dir = testing::source_path("tests/golden/lora_grad/qwen3");
  const nlohmann::json expected = nlohmann::json::parse(testing::read_file(dir + "/expected.json"));
  const ModelSpec spec = model_spec_build(hf_config_load(g.dir), DType::f32);
  HostStoreOptions so;
  so.weights_only = true;
  HostStore store(*dev, spec, so);
  model_load_weights(store, g.dir);
  auto run = [&](double dropout, const std::function<void(Engine&)>& body) {
    LoraOptions lo;
    lo.r = expected["r"].get<int64_t>();
    lo.alpha = expected["alpha"].get<double>();
    lo.targets = lora_targets_parse(expected["targets"].get<std::vector<std::string>>(), "expected.json");
    lo.dropout = dropout;
    lo.seed = 7;
    LoraStore lora(*dev, spec, lo);
    lora.load_peft(dir + "/adapter");
    EngineOptions eo;
    eo.max_batch = g.batch.B;
    eo.max_tokens = g.batch.T;
    eo.lora = lo;
    Engine engine(*dev, store, eo, &lora);
    body(engine);
  };
  double plain_eval = 0, plain_train = 0;
  run(0.0, [&](Engine& e) {
    plain_eval = e.forward_loss(g.batch);
    plain_train = e.forward_backward(g.batch, 1.f);
  });
  CHECK(plain_eval == plain_train);
  run(0.3, [&](Engine& e) {
    CHECK(e.forward_loss(g.batch) == plain_eval);  // eval: no dropout, bit for bit
    e.lora_dropout_begin_step(1);
    const double m0 = e.forward_backward(g.batch, 1.f);  // step 1, micro-batch 0
    const double m1 = e.forward_backward(g.batch, 1.f);  // micro-batch 1
    CHECK(e.forward_loss(g.batch) == plain_eval);        // and between training passes
    CHECK(m0 != plain_train);
    CHECK(m1 != m0);
    e.lora_dropout_begin_step(1);
    CHECK(e.forward_backward(g.batch, 1.f) == m0);  // the same key, the same masks
    e.lora_dropout_begin_step(2);
    const double s2 = e.forward_backward(g.batch, 1.f);
    CHECK(s2 != m0);
    // rank 1 of 2 (first 1, stride 2): its first pass is micro-batch 1 of the step, its next 3
    e.lora_dropout_begin_step(1, 1, 2);
    CHECK(e.forward_backward(g.batch, 1.f) == m1);
    std::printf("lora dropout 0.3: loss sums %.9f (none), %.9f, %.9f (step 1 micro-batches 0, 1), %.9f (step 2)\n",
                plain_train, m0, m1, s2);
  });
}

TEST_CASE("a LoRA run stopped and resumed equals the straight run bit for bit", "[lora][checkpoint]") {
  // no clipping: the last micro-batch's update path (forward_backward_update) is the one taken
  const std::string a = fresh("straight"), b = fresh("resumed");
  // with LoRA dropout: the resumed steps draw the straight run's masks (keyed by step and micro-batch)
  const std::vector<std::string> common = {"train.max_steps=5", "checkpoint.save_steps=2", "optim.max_grad_norm=0",
                                           "lora.dropout=0.1"};
  const TrainSummary straight = train_run(lora_recipe(a, common));
  TrainOptions stop;
  stop.stop_at_step = 3;
  const TrainSummary first = train_run(lora_recipe(b, common), stop);
  REQUIRE(first.interrupted);
  TrainOptions resume;
  resume.resume_latest = true;
  const TrainSummary rest = train_run(lora_recipe(b, common), resume);
  REQUIRE(straight.losses.size() == 5);
  REQUIRE(rest.losses.size() == 2);
  for (size_t i = 0; i < 3; ++i) CHECK(first.losses[i] == straight.losses[i]);
  for (size_t i = 0; i < 2; ++i) CHECK(rest.losses[i] == straight.losses[3 + i]);
  CHECK(testing::read_file(a + "/final/adapter/adapter_model.safetensors") ==
        testing::read_file(b + "/final/adapter/adapter_model.safetensors"));
  CHECK(testing::read_file(a + "/checkpoint-4/optimizer_state.safetensors") ==
        testing::read_file(b + "/checkpoint-4/optimizer_state.safetensors"));
}

TEST_CASE("DPO trains LoRA adapters on the frozen base", "[lora][preference]") {
  const std::string out = fresh("dpo");
  const TrainSummary s = train_run(lora_recipe(out, {"train.max_steps=4", "train.objective=dpo",
                                                     "data.path=" + testing::source_path("recipes/dpo-tiny/data/pairs.jsonl"),
                                                     "train.gradient_accumulation_steps=1", "train.micro_batch_size=4"}));
  REQUIRE(s.losses.size() == 4);
  CHECK(std::abs(s.losses[0] - std::log(2.0)) < 1e-3);  // the policy starts as the reference (B = 0)
  CHECK(s.losses.back() < s.losses.front());
  CHECK(fs::exists(out + "/final/adapter/adapter_config.json"));
}

TEST_CASE("LoRA recipes: bad settings are refused with what to write", "[lora][recipe]") {
  const std::string recipe = testing::source_path("recipes/sft-tiny/recipe.toml");
  auto error_of = [&](std::vector<std::string> o) {
    try {
      recipe_load(recipe, o);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(testing::contains(error_of({"lora.dropout=1.0"}), "must be in [0, 1)"));
  CHECK(testing::contains(error_of({"lora.dropout=-0.1"}), "must be in [0, 1)"));
  CHECK(recipe_load(recipe, {"lora.r=4", "lora.dropout=0.05"}).lora_dropout == 0.05);
  CHECK(testing::contains(error_of({"lora.target_modules=q_proj,qkv"}), "\"qkv\""));
  CHECK(testing::contains(error_of({"lora.r=0"}), "lora.r must be at least 1"));
  CHECK(testing::contains(error_of({"lora.rank=4"}), "did you mean 'lora.r'"));
  const Recipe on = recipe_load(recipe, {"lora.target_modules=q_proj,v_proj"});
  CHECK(on.lora_enabled);
  CHECK(on.lora_target_modules == std::vector<std::string>{"q_proj", "v_proj"});
  CHECK(on.lora_r == 16);
  CHECK(on.lora_alpha == 32);
  CHECK_FALSE(recipe_load(recipe, {}).lora_enabled);
  CHECK(testing::contains(recipe_load(recipe, {"lora.r=4"}).to_toml(), "[lora]\nr = 4"));
}

}  // namespace strata
