// GRPO on an NF4 base (issues 40 and 41): train.objective = "grpo" with LoRA and
// lora.base_dtype = "nf4". The generator, the reference pass (beta > 0) and the training passes all
// read the packed base through the layer pass, which dequantizes each upload into its slot
// (offload/engine/layer_pass.cpp). Checked on the tiny llama of tests/golden, its base held as NF4
// (double-quantized):
//   - f32 compute (the dequantized bf16 weights widened): the generator with the adapters unmerged
//     samples exactly what a generator over the dequantized base with the adapters merged
//     (W + s B A, lora_merge_into) samples, greedy and seeded; GRPO steps sample each step from the
//     adapters as the last update left them, never write the packed codes, and rerun bit for bit;
//   - bf16 compute (as recipes run it): the steps, the beta reference pass included, equal those
//     on a plain bf16 base of the dequantized weights to the bit, and a step's update is the one
//     strata grad --objective grpo's path makes from the same batch and reference log-probs.
// Resume through strata train: tests/train/test_grpo_train.cpp; emulated CUDA: test_cuda_grpo.cpp.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>

#include "offload/engine/token_scorer.h"
#include "offload/state/model_io.h"
#include "tests/train/grpo_rig.h"

namespace strata {
namespace {

using testing::GrpoRig;
using testing::sample_like_step;
using testing::texts;

constexpr int64_t kRank = 4;

// A plain store in `dtype` holding `rig`'s NF4 base dequantized (the same values, unpacked), with
// `lora`'s adapters merged into it when given (f32: exact up to the sum's rounding).
std::unique_ptr<HostStore> dequantized_store(GrpoRig& rig, DType dtype, const LoraStore* lora = nullptr) {
  const ModelSpec spec = model_spec_build(hf_config_load(rig.dir), dtype);
  auto out = std::make_unique<HostStore>(*rig.dev, spec);
  std::vector<float> values;
  for (size_t r = 0; r < spec.params.size(); ++r) {
    values.resize(size_t(spec.params[r].numel()));
    rig.store.get_param(r, values.data());
    out->set_param(r, values.data());
  }
  if (lora) lora_merge_into(*out, *lora);
  return out;
}

}  // namespace

TEST_CASE("the generator on an NF4 base adds the adapters and samples what the dequantized base merged with them samples",
          "[grpo][qlora][generate]") {
  GrpoRig rig(1, device_create(DeviceOptions{}), "llama", 1, kRank, /*lora_random_b=*/true, 0, /*nf4=*/true);
  REQUIRE(rig.store.packed());
  std::unique_ptr<HostStore> merged = dequantized_store(rig, DType::f32, rig.lora.get());
  testing::check_generator_adds_adapters(rig, *merged);
}

TEST_CASE("GRPO steps on an NF4 base sample from the adapters and train them and never write the codes",
          "[grpo][grpo-step][qlora]") {
  std::vector<std::vector<std::string>> run_texts[2];
  std::vector<double> run_losses[2];
  std::vector<float> run_adapters[2];
  for (int run = 0; run < 2; ++run) {
    GrpoRig rig(1, device_create(DeviceOptions{}), "llama", 1, kRank, false, 0, /*nf4=*/true);
    const std::vector<char> codes = rig.weights();  // the packed base, as loaded
    const size_t n = rig.lora->layout().floats();
    const std::vector<float> start(rig.lora->master(), rig.lora->master() + n);
    for (int64_t s = 1; s <= 3; ++s) {
      // what the dequantized base merged with the adapters as they are now samples at this step
      std::unique_ptr<HostStore> merged = dequantized_store(rig, DType::f32, rig.lora.get());
      const std::vector<std::string> expected = sample_like_step(rig, *merged, nullptr, {0, 2}, s);
      const GrpoStepOutcome o = rig.step({0, 2}, s);
      INFO("run " << run << " step " << s);
      CHECK(texts(o) == expected);
      CHECK(std::isfinite(o.loss));
      CHECK(o.grad_norm > 0);
      run_texts[run].push_back(texts(o));
      run_losses[run].push_back(o.loss);
    }
    // by step 3 the trained adapters sample other completions than the base alone would
    CHECK(sample_like_step(rig, rig.store, nullptr, {0, 2}, 3) != run_texts[run][2]);
    CHECK(rig.weights() == codes);  // the NF4 codes and scales, bit for bit
    run_adapters[run].assign(rig.lora->master(), rig.lora->master() + n);
    CHECK(run_adapters[run] != start);
  }
  CHECK(run_texts[0] == run_texts[1]);
  CHECK(run_losses[0] == run_losses[1]);
  CHECK(run_adapters[0] == run_adapters[1]);
}

// bf16 compute, beta > 0 (the reference: the NF4 base with the adapters off), non-zero adapters
// from the start: two steps on the NF4 base equal two steps on a plain bf16 base of its dequantized
// weights bit for bit (completions, losses, KL, adapters); the reference pass's log-probs are a
// token scorer's over that plain base; and step 1's update is strata grad's from the same batch.
TEST_CASE("GRPO with beta on an NF4 base in bf16 equals its dequantized base and strata grad's update",
          "[grpo][grpo-step][grpo-beta][qlora]") {
  constexpr double kBeta = 0.5;
  GrpoRig a(1, device_create(DeviceOptions{}), "llama", 1, kRank, true, kBeta, /*nf4=*/true, DType::bf16);
  GrpoRig b(1, device_create(DeviceOptions{}), "llama", 1, kRank, true, kBeta, /*nf4=*/true, DType::bf16);
  GrpoRig plain(1, device_create(DeviceOptions{}), "llama", 1, kRank, true, kBeta, false, DType::bf16);
  // the plain rig's base: the NF4 base's dequantized bf16 weights (exact in bf16)
  std::vector<float> values;
  for (size_t r = 0; r < plain.store.spec().params.size(); ++r) {
    values.resize(size_t(plain.store.spec().params[r].numel()));
    a.store.get_param(r, values.data());
    plain.store.set_param(r, values.data());
  }
  const std::vector<char> codes = a.weights();
  const GrpoStepOutcome a1 = a.step({0, 2}, 1), p1 = plain.step({0, 2}, 1);
  CHECK(texts(a1) == texts(p1));
  CHECK(a1.loss == p1.loss);
  CHECK(a1.metrics["kl"].get<double>() == p1.metrics["kl"].get<double>());
  CHECK(a1.metrics["kl"].get<double>() > 1e-6);  // non-zero adapters: the policy is not the base
  CHECK(a1.grad_norm == p1.grad_norm);
  const size_t n = a.lora->layout().floats();
  CHECK(std::memcmp(a.lora->master(), plain.lora->master(), n * sizeof(float)) == 0);

  // the reference log-probs: a token scorer over the plain base at the temperature
  for (size_t m = 0; m < a1.batches.size(); ++m) {
    GrpoTemperature temperature(plain.store, plain.config.loss.temperature);
    TokenScorer scorer(*plain.dev, plain.store, a1.batches[m].B, a1.batches[m].T);
    const std::vector<double> want = scorer.token_logps(a1.batches[m]);
    REQUIRE(want.size() == a1.layouts[m].ref_logp.size());
    for (size_t i = 0; i < want.size(); ++i) {
      REQUIRE(std::isnan(want[i]) == std::isnan(a1.layouts[m].ref_logp[i]));
      if (!std::isnan(want[i])) CHECK(want[i] == a1.layouts[m].ref_logp[i]);
    }
  }

  // strata grad's path on b (the same starting adapters) with a's batch and reference log-probs
  const double norm = b.update_as_grad_does(a1.batches, a1.layouts, 1);
  INFO("grad norm " << a1.grad_norm << " vs " << norm);
  CHECK(std::abs(norm - a1.grad_norm) <= 1e-6 * a1.grad_norm);
  double wdiff = 0;
  for (size_t i = 0; i < n; ++i) wdiff = std::max(wdiff, double(std::abs(a.lora->master()[i] - b.lora->master()[i])));
  INFO("adapters after step 1: worst abs diff " << wdiff);
  CHECK(wdiff <= 1e-6);

  // step 2 from the updated adapters: still the plain base's step to the bit
  const GrpoStepOutcome a2 = a.step({1, 0}, 2), p2 = plain.step({1, 0}, 2);
  CHECK(texts(a2) == texts(p2));
  CHECK(a2.loss == p2.loss);
  CHECK(a2.grad_norm == p2.grad_norm);
  CHECK(std::memcmp(a.lora->master(), plain.lora->master(), n * sizeof(float)) == 0);
  CHECK(a.weights() == codes);
}

}  // namespace strata
