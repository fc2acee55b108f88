// GRPO with beta > 0 in training (issue 41): the reference model's per-token log-probs from the
// reference pass (offload/engine/token_scorer.h) — the starting weights' frozen copy in full
// fine-tuning, the base with the adapters off under LoRA — and TRL's KL term in the update.
// Checked on the tiny llama of tests/golden (f32): the reference pass's log-probs equal the
// training engine's own forward (GrpoHead's, the path `strata grad --objective grpo` takes) on the
// same weights; a step with beta > 0 updates the weights exactly as that path does when given those
// reference log-probs (strata grad's contract: ref_per_token_logps), full fine-tuning at step 2
// (step 1's policy is the reference: KL 0) and LoRA at step 1 (non-zero adapters: KL > 0).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>

#include "tests/train/grpo_rig.h"

namespace strata {
namespace {

using testing::GrpoRig;

constexpr double kBeta = 0.5;

// Micro-batch a's per-position log-probs from the engine's own forward on `rig`'s weights (a
// GRPO head with beta 0: the policy's log-probs, at the rig's temperature).
std::vector<std::vector<double>> engine_logps(GrpoRig& rig, const GrpoStepOutcome& o) {
  GrpoParams p = rig.config.loss;
  p.beta = 0;
  auto owned = std::make_unique<GrpoHead>(*rig.dev, p, rig.engine->options().max_batch * rig.engine->options().max_tokens);
  GrpoHead* head = owned.get();
  rig.engine->set_loss_objective(std::move(owned));
  std::vector<std::vector<double>> out;
  GrpoTemperature temperature(rig.store, p.temperature);
  for (size_t a = 0; a < o.batches.size(); ++a) {
    GrpoLayout l = o.layouts[a];
    l.ref_logp.clear();
    l.old_logp.clear();
    head->set_layout(std::move(l), o.batches[a]);
    rig.engine->forward_loss(o.batches[a]);
    out.push_back(head->token_logps(0));
  }
  return out;
}

// The largest |a - b| over the counted positions (NaN in both elsewhere).
double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    REQUIRE(std::isnan(a[i]) == std::isnan(b[i]));
    if (!std::isnan(a[i])) worst = std::max(worst, std::abs(a[i] - b[i]));
  }
  return worst;
}

}  // namespace

TEST_CASE("GRPO with beta trains full fine-tuning as the gradient with the reference log-probs given",
          "[grpo][grpo-step][grpo-beta]") {
  GrpoRig a(1, device_create(DeviceOptions{}), "llama", 1, 0, false, kBeta);
  GrpoRig b(1, device_create(DeviceOptions{}), "llama", 1, 0, false, kBeta);
  GrpoRig start(1);  // the starting weights, untouched
  REQUIRE(a.grpo->reference_store() != nullptr);
  // step 1: the policy is the reference, so the KL is 0 (up to the two passes' rounding)
  const GrpoStepOutcome a1 = a.step({0, 1}, 1), b1 = b.step({0, 1}, 1);
  CHECK(a1.metrics.contains("kl"));
  CHECK(std::abs(a1.metrics["kl"].get<double>()) <= 1e-9);
  CHECK(a1.metrics["reference_s"].get<double>() > 0);
  REQUIRE(a.weights() == b.weights());
  const GrpoStepOutcome a2 = a.step({2, 0}, 2);
  CHECK(a2.metrics["kl"].get<double>() > 1e-6);  // the policy moved away from the reference
  // the reference pass's log-probs are the starting model's, as the engine's own forward gives them
  const std::vector<std::vector<double>> ref = engine_logps(start, a2);
  REQUIRE(ref.size() == a2.layouts.size());
  double worst = 0;
  for (size_t m = 0; m < ref.size(); ++m) worst = std::max(worst, max_abs_diff(a2.layouts[m].ref_logp, ref[m]));
  INFO("reference log-probs vs the engine's forward: worst abs diff " << worst);
  CHECK(worst <= 1e-6);
  // b (at a's step-1 weights) takes step 2 on the same batch through strata grad's path with the
  // engine's reference log-probs: the same update
  std::vector<GrpoLayout> given = a2.layouts;
  for (size_t m = 0; m < given.size(); ++m) given[m].ref_logp = ref[m];
  const double norm = b.update_as_grad_does(a2.batches, given, 2);
  INFO("grad norm " << a2.grad_norm << " vs " << norm);
  CHECK(std::abs(norm - a2.grad_norm) <= 1e-6 * a2.grad_norm);
  const std::vector<char> wa = a.weights(), wb = b.weights();
  const float *fa = reinterpret_cast<const float*>(wa.data()), *fb = reinterpret_cast<const float*>(wb.data());
  double wdiff = 0;
  for (size_t i = 0; i < wa.size() / 4; ++i) wdiff = std::max(wdiff, double(std::abs(fa[i] - fb[i])));
  INFO("weights after step 2: worst abs diff " << wdiff);
  CHECK(wdiff <= 1e-6);
  // and the frozen reference is still the starting model
  CHECK(std::memcmp(a.grpo->reference_store()->working(), start.store.working(),
                    HostStore::layout(start.store.spec()).working.tier_bytes(Tier::host_pinned)) == 0);
}

TEST_CASE("GRPO with beta and LoRA takes the base with the adapters off as its reference",
          "[grpo][grpo-step][grpo-beta][lora]") {
  GrpoRig a(1, device_create(DeviceOptions{}), "llama", 1, 4, true, kBeta);
  GrpoRig b(1, device_create(DeviceOptions{}), "llama", 1, 4, true, kBeta);
  GrpoRig base(1);  // the base alone, full weights: the reference through the engine's forward
  CHECK(a.grpo->reference_store() == nullptr);  // no copy: the frozen base is the reference
  const GrpoStepOutcome a1 = a.step({0, 2}, 1);
  CHECK(a1.metrics["kl"].get<double>() > 1e-6);  // non-zero adapters: the policy is not the base
  const std::vector<std::vector<double>> ref = engine_logps(base, a1);
  double worst = 0;
  for (size_t m = 0; m < ref.size(); ++m) worst = std::max(worst, max_abs_diff(a1.layouts[m].ref_logp, ref[m]));
  INFO("reference log-probs vs the base's forward: worst abs diff " << worst);
  CHECK(worst <= 1e-6);
  std::vector<GrpoLayout> given = a1.layouts;
  for (size_t m = 0; m < given.size(); ++m) given[m].ref_logp = ref[m];
  const double norm = b.update_as_grad_does(a1.batches, given, 1);
  INFO("grad norm " << a1.grad_norm << " vs " << norm);
  CHECK(std::abs(norm - a1.grad_norm) <= 1e-6 * a1.grad_norm);
  const size_t n = a.lora->layout().floats();
  double wdiff = 0;
  for (size_t i = 0; i < n; ++i) wdiff = std::max(wdiff, double(std::abs(a.lora->master()[i] - b.lora->master()[i])));
  INFO("adapters after step 1: worst abs diff " << wdiff);
  CHECK(wdiff <= 1e-6);
  CHECK(a.weights() == base.weights());  // the base never changed
}

}  // namespace strata
