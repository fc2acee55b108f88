// A one-process GRPO rig for tests (tests/train/test_grpo_step.cpp, tests/cuda/test_cuda_grpo.cpp):
// the tiny llama of tests/golden, 3 prompts, G = 4 completions of up to 6 tokens at temperature
// 0.8, an external reward command, the engine with every weight resident, full fine-tuning or
// LoRA (lora_r > 0: the store frozen, adapters of rank lora_r on every linear; B drawn non-zero
// when lora_random_b, so the adapters change what the generator samples from step 1); beta > 0:
// TRL's KL term to the reference model (the starting weights, or the base under LoRA). A QLoRA
// rig (nf4, with LoRA) holds the base as NF4 (double-quantized) with the matrices computed in
// `dtype` (bf16 as recipes run it, or f32: the same dequantized bf16 weights widened) and
// streams its weights, as QLoRA runs do.
#pragma once
#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "offload/engine/generator.h"
#include "offload/state/lora.h"
#include "offload/state/nf4_layout.h"
#include "src/train/grpo_step.h"
#include "tests/testing.h"

namespace strata::testing {

// reward = the number of even token ids in the completion (a sh read loop: one reply per line)
constexpr const char* kEvenCount =
    "while IFS= read -r line; do c=${line#*\\\"completion\\\":\\\"}; c=${c%%\\\"*}; e=0; "
    "for t in $c; do [ $((t % 2)) -eq 0 ] && e=$((e + 1)); done; printf '{\"reward\": %d}\\n' $e; done";

inline std::string decode_ids(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) {
    if (!s.empty()) s += ' ';
    s += std::to_string(id);
  }
  return s;
}

struct GrpoRig {
  std::string dir;
  std::unique_ptr<Device> dev;
  HostStore store;
  std::unique_ptr<LoraStore> lora;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<Rewards> rewards;
  std::unique_ptr<GrpoStep> grpo;
  std::vector<GrpoPrompt> prompts;
  GrpoConfig config;

  // group > 1: the engine's layer-major passes of that many micro-batches (an untied family:
  // layer-major is not built for a tied lm_head outside LoRA)
  explicit GrpoRig(int64_t num_iterations = 1, std::unique_ptr<Device> device = device_create(DeviceOptions{}),
                   const std::string& family = "llama", int64_t group = 1, int64_t lora_r = 0,
                   bool lora_random_b = false, double beta = 0, bool nf4 = false, DType dtype = DType::f32)
      : dir(testing::source_path("tests/golden/" + family)), dev(std::move(device)),
        store(*dev, spec_of(dir, nf4, dtype), store_options(lora_r)) {
    model_load_weights(store, dir);
    GrpoConfig& c = config;
    c.num_generations = 4;
    c.num_iterations = num_iterations;
    c.loss.max_completion_length = 6;
    c.loss.temperature = 0.8;
    c.loss.loss_type = GrpoLossType::grpo;
    c.loss.beta = beta;
    c.micro_batch_rows = 4;
    c.seed = 17;
    c.eos_ids = {2};
    for (int p = 0; p < 3; ++p) {
      GrpoPrompt pr;
      pr.ids = {1, 10 + p, 20 + 3 * p, 30 + p};
      pr.text = decode_ids(pr.ids);
      prompts.push_back(pr);
    }
    EngineOptions eo;
    eo.weights = nf4 ? WeightsMode::stream : WeightsMode::device;
    eo.checkpoints = nf4 ? CheckpointMode::host : CheckpointMode::device;
    eo.max_batch = c.micro_batch_rows;
    eo.max_tokens = 4 + 6 + 1;
    eo.group = group;
    if (lora_r > 0) {
      eo.lora.r = lora_r;
      eo.lora.alpha = 16;
      eo.lora.seed = 5;
      lora = std::make_unique<LoraStore>(*dev, store.spec(), eo.lora);
      lora->init(5);
      if (lora_random_b) {  // B = U(-0.5, 0.5) instead of PEFT's zeros: the adapters matter at once
        uint64_t z = 99;
        for (size_t row : lora->layout().b_rows) {
          const TensorSpec& b = lora->layout().table[row];
          for (int64_t i = 0; i < b.numel(); ++i) {
            z = z * 6364136223846793005ull + 1442695040888963407ull;
            lora->master()[b.offset / 4 + size_t(i)] = float(double(z >> 11) * 0x1.0p-53 - 0.5);
          }
        }
        lora->refresh_image();
      }
    }
    engine = std::make_unique<Engine>(*dev, store, eo, lora.get());
    if (lora) engine->lora_upload();
    RewardOptions ro;
    ro.funcs = {};
    ro.command = kEvenCount;
    rewards = std::make_unique<Rewards>(ro);
    grpo = std::make_unique<GrpoStep>(c, *dev, store, *engine, GeneratorShape{4, 4, 4 + 6}, *rewards, decode_ids,
                                      lora.get());
  }
  static ModelSpec spec_of(const std::string& dir, bool nf4, DType dtype) {
    ModelSpec spec = model_spec_build(hf_config_load(dir), dtype);
    if (nf4) nf4_base_enable(spec, /*double_quant=*/true);
    return spec;
  }
  static HostStoreOptions store_options(int64_t lora_r) {
    HostStoreOptions so;
    so.weights_only = lora_r > 0;  // LoRA: the base is frozen
    return so;
  }
  static AdamWParams adamw(int64_t step) {
    AdamWParams ap;
    ap.lr = 3e-2;
    ap.step = step;
    return ap;
  }
  GrpoStepOutcome step(const std::vector<int64_t>& which, int64_t step) {
    std::vector<const GrpoPrompt*> ps;
    for (int64_t i : which) ps.push_back(&prompts[size_t(i)]);
    return grpo->run(ps, which, step, adamw(step), 1.0, 0.0);
  }
  // `strata grad --objective grpo`'s path at the current weights: a GRPO head with the rig's
  // parameters and the given layouts (advantages, reference log-probs; old: the policy's own),
  // forward and backward per micro-batch at the temperature, then the AdamW update of `step`.
  // Returns the gradient norm.
  double update_as_grad_does(const std::vector<MicroBatch>& batches, std::vector<GrpoLayout> layouts, int64_t step) {
    auto owned = std::make_unique<GrpoHead>(*dev, config.loss, engine->options().max_batch * engine->options().max_tokens);
    GrpoHead* head = owned.get();
    engine->set_loss_objective(std::move(owned));
    GrpoTemperature temperature(store, config.loss.temperature);
    for (size_t a = 0; a < batches.size(); ++a) {
      head->set_layout(std::move(layouts[a]), batches[a]);
      engine->forward_backward(batches[a], 1.f);
    }
    engine->synchronize();
    temperature.finish();
    return engine->optimizer_step(adamw(step), 1.0, 0.0);
  }
  std::vector<char> weights() {
    engine->synchronize();
    const size_t bytes = HostStore::layout(store.spec()).working.tier_bytes(Tier::host_pinned);
    return std::vector<char>(store.working(), store.working() + bytes);
  }
};

// Each prompt's G = 4 completions as GrpoStep samples them at `step` (seed 17, temperature 0.8,
// at most 6 tokens, EOS 2, first request prompt index x G), from `store` (with `lora`'s adapters
// unmerged when given).
inline std::vector<std::string> sample_like_step(GrpoRig& rig, HostStore& store, LoraStore* lora,
                                                 const std::vector<int64_t>& which, int64_t step) {
  Generator gen(*rig.dev, store, GeneratorShape{4, 4, 4 + 6},
                lora ? GeneratorLora{lora->layout().r, lora->layout().bytes} : GeneratorLora{});
  if (lora) gen.set_adapters(lora->layout(), lora->image());
  SamplingOptions so;
  so.max_new_tokens = 6;
  so.temperature = 0.8;
  so.seed = grpo_step_seed(17, step);
  so.eos_ids = {2};
  std::vector<std::string> out;
  for (int64_t p : which) {
    const std::vector<std::vector<int32_t>> rows(4, rig.prompts[size_t(p)].ids);
    for (const GenerateResult& r : gen.generate(rows, so, uint64_t(p) * 4)) out.push_back(decode_ids(r.tokens));
  }
  return out;
}

// A step's completions as text, in order.
inline std::vector<std::string> texts(const GrpoStepOutcome& o) {
  std::vector<std::string> t;
  for (const GrpoCompletion& c : o.completions) t.push_back(c.completion);
  return t;
}

// The generator with `rig`'s adapters unmerged (GeneratorLora, set_adapters) samples what a
// generator over `merged` — the base with those adapters merged — samples, greedy and at T 0.8,
// for the rig's prompts and a shorter one, and not what the base alone samples.
inline void check_generator_adds_adapters(GrpoRig& rig, HostStore& merged) {
  const GeneratorShape shape{4, 4, 4 + 8};
  const GeneratorLora lora{rig.lora->layout().r, rig.lora->layout().bytes};
  std::vector<std::vector<int32_t>> prompts;
  for (const GrpoPrompt& p : rig.prompts) prompts.push_back(p.ids);
  prompts.push_back({1, 7});  // a shorter prompt: right padding in the prefill
  for (const double temperature : {0.0, 0.8}) {
    SamplingOptions so;
    so.max_new_tokens = 8;
    so.temperature = temperature;
    so.seed = 3;
    std::vector<GenerateResult> with, as_merged, base;
    {
      Generator gen(*rig.dev, rig.store, shape, lora);
      gen.set_adapters(rig.lora->layout(), rig.lora->image());
      with = gen.generate(prompts, so, 0);
    }
    {
      Generator gen(*rig.dev, merged, shape);
      as_merged = gen.generate(prompts, so, 0);
    }
    {
      Generator gen(*rig.dev, rig.store, shape);
      base = gen.generate(prompts, so, 0);
    }
    size_t differ = 0;
    for (size_t r = 0; r < prompts.size(); ++r) {
      INFO("temperature " << temperature << " row " << r);
      CHECK(with[r].tokens.size() == 8);
      CHECK(with[r].tokens == as_merged[r].tokens);
      differ += with[r].tokens != base[r].tokens;
    }
    CHECK(differ > 0);  // the adapters change what is sampled
  }
}

}  // namespace strata::testing
