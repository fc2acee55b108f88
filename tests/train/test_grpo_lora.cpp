// GRPO with LoRA (issue 41): the generator adds the current adapters unmerged in its layer pass
// (offload/engine/generator.h), so each step samples from the policy being trained. Checked on
// the tiny llama of tests/golden (f32): the generator with non-zero adapters samples exactly what a
// generator over the merged weights (W + s B A, src: lora_merge_into) samples, greedy and seeded,
// and not what the base alone samples; GRPO steps with LoRA change the adapters and not the base,
// each step's completions are those of a generator over the base merged with the adapters as the
// previous update left them, and a rerun is bit-identical.
#include <catch2/catch.hpp>
#include <cstring>

#include "offload/state/model_io.h"
#include "tests/train/grpo_rig.h"

namespace strata {
namespace {

using testing::GrpoRig;
using testing::sample_like_step;
using testing::texts;

constexpr int64_t kRank = 4;

// The base of `rig` with its adapters merged (lora_merge_into: f32, exact up to the sum's rounding).
std::unique_ptr<HostStore> merged_store(GrpoRig& rig) {
  auto merged = std::make_unique<HostStore>(*rig.dev, rig.store.spec());
  model_load_weights(*merged, rig.dir);
  lora_merge_into(*merged, *rig.lora);
  return merged;
}

}  // namespace

TEST_CASE("the generator adds unmerged LoRA adapters and samples what the merged weights sample",
          "[grpo][lora][generate]") {
  GrpoRig rig(1, device_create(DeviceOptions{}), "llama", 1, kRank, /*lora_random_b=*/true);
  std::unique_ptr<HostStore> merged = merged_store(rig);
  testing::check_generator_adds_adapters(rig, *merged);
}

TEST_CASE("GRPO with LoRA trains the adapters and samples each step from them", "[grpo][grpo-step][lora]") {
  std::vector<std::vector<std::string>> run_texts[2];
  std::vector<double> run_losses[2];
  std::vector<float> run_adapters[2];
  for (int run = 0; run < 2; ++run) {
    GrpoRig rig(1, device_create(DeviceOptions{}), "llama", 1, kRank);
    const std::vector<char> base = rig.weights();
    const size_t n = rig.lora->layout().floats();
    const std::vector<float> start(rig.lora->master(), rig.lora->master() + n);
    for (int64_t s = 1; s <= 3; ++s) {
      // what the base merged with the adapters as they are now samples at this step
      std::unique_ptr<HostStore> merged = merged_store(rig);
      const std::vector<std::string> expected = sample_like_step(rig, *merged, nullptr, {0, 2}, s);
      CHECK(sample_like_step(rig, rig.store, rig.lora.get(), {0, 2}, s) == expected);
      const GrpoStepOutcome o = rig.step({0, 2}, s);
      INFO("step " << s);
      CHECK(texts(o) == expected);
      CHECK(std::isfinite(o.loss));
      CHECK(o.grad_norm > 0);
      run_texts[run].push_back(texts(o));
      run_losses[run].push_back(o.loss);
    }
    // by step 3 the trained adapters sample other completions than the base alone would
    CHECK(sample_like_step(rig, rig.store, nullptr, {0, 2}, 3) != run_texts[run][2]);
    rig.engine->synchronize();
    CHECK(rig.weights() == base);  // the frozen base is never merged into
    run_adapters[run].assign(rig.lora->master(), rig.lora->master() + n);
    CHECK(run_adapters[run] != start);
  }
  CHECK(run_texts[0] == run_texts[1]);
  CHECK(run_losses[0] == run_losses[1]);
  CHECK(run_adapters[0] == run_adapters[1]);
}

}  // namespace strata
