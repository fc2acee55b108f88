// GRPO on the CUDA backend (issue 41): the GRPO head (its per-token weighted backward is the
// preference head's CUDA kernel; the temperature is the final norm's weight / T, no op of its
// own) through the streaming engine on the CUDA device against TRL's float64 goldens
// (tests/models/grpo_golden.h: 1e-5 relative loss, 1e-4 relative L2 per gradient tensor) and
// against the CPU backend's run of the same case (the entropy metric too); and one-process GRPO steps (generate, score,
// train) on the CUDA device against the same steps on the CPU backend, full fine-tuning and LoRA
// (the generator adding the adapters unmerged), and LoRA on an NF4 base.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>

#include "tests/cuda/cuda_testing.h"
#include "tests/models/grpo_golden.h"
#include "tests/train/grpo_rig.h"

namespace strata {

TEST_CASE("GRPO on the CUDA backend matches TRL's goldens and the CPU backend", "[cuda-emu][grpo]") {
  auto cuda = cuda_testing::test_device();
  if (!cuda) return;
  auto cpu = device_create(DeviceOptions{});
  // every family; the loss types spread over them so each runs with and without beta
  const char* const cases[][2] = {{"grpo", "bnpo_kl"}, {"dr_grpo", "dapo_kl"}, {"bnpo", "grpo_kl"}, {"dapo", "dr_grpo_kl"}};
  for (size_t f = 0; f < 4; ++f)
    for (const char* name : cases[f]) {
      const char* family = grpo_golden::kFamilies[f];
      const grpo_golden::CaseResult on_cuda = grpo_golden::run_case(*cuda, family, name, WeightsMode::stream);
      const grpo_golden::CaseResult on_cpu = grpo_golden::run_case(*cpu, family, name, WeightsMode::stream);
      std::printf("cuda-emu grpo %-8s %-10s loss %.10f worst grad rel L2 %.2e (%s)\n", family, name, on_cuda.loss,
                  on_cuda.worst_grad_rel_l2, on_cuda.worst_name.c_str());
      // the golden's tolerance: a GRPO loss is a sum of terms that largely cancel (advantages sum
      // to zero per group), so its relative error runs above the terms' own (1.4e-6 measured)
      CHECK(std::abs(on_cuda.loss - on_cpu.loss) <= 1e-5 * std::abs(on_cpu.loss));
      CHECK(testing::max_rel_error(on_cuda.grads, on_cpu.grads) <= 1e-4);
      // the entropy metric's sum (the CUDA stats kernel's accumulator against the CPU one's)
      CHECK(on_cpu.metrics.entropy > 1);
      CHECK(std::abs(on_cuda.metrics.entropy - on_cpu.metrics.entropy) <= 1e-5 * on_cpu.metrics.entropy);
    }
}

TEST_CASE("GRPO steps on the CUDA backend follow the CPU backend's", "[cuda-emu][grpo]") {
  auto cuda = cuda_testing::test_device();
  if (!cuda) return;
  testing::GrpoRig on_cuda(1, std::move(cuda)), on_cpu(1);
  // Step 1 only: its passes see the same starting weights on both backends. After an update
  // the two drift apart by more than the arithmetic (Adam's first step moves a weight by about
  // lr · sign(g) whatever |g|, so gradient entries at the noise level flip whole steps).
  const GrpoStepOutcome a = on_cuda.step({0, 2}, 1), b = on_cpu.step({0, 2}, 1);
  // the same sampled tokens (the logits agree far closer than any draw's margin here), so the
  // same rewards; the norm of the gradient as close as the two backends' f32 arithmetic
  REQUIRE(a.completions.size() == b.completions.size());
  for (size_t i = 0; i < a.completions.size(); ++i) {
    CHECK(a.completions[i].completion == b.completions[i].completion);
    CHECK(a.completions[i].reward == b.completions[i].reward);
  }
  std::printf("cuda-emu grpo step loss %.3g (cpu %.3g) grad norm %.9f (cpu %.9f)\n", a.loss, b.loss, a.grad_norm,
              b.grad_norm);
  CHECK(std::abs(a.loss - b.loss) <= 1e-8);  // 0 up to rounding: the ratios are 1, the advantages sum to 0
  CHECK(b.grad_norm > 0.1);
  CHECK(std::abs(a.grad_norm - b.grad_norm) <= 1e-5 * b.grad_norm);
  // and the CUDA device's next step runs on its updated weights
  CHECK(std::isfinite(on_cuda.step({1}, 2).grad_norm));
}

// A GRPO step with beta on the CUDA backend (a) against the CPU backend's (b): the same
// completions and rewards, KL within 1e-3 relative (and not 0), the grad norm within 1e-5.
static void check_step_follows_cpu(const GrpoStepOutcome& a, const GrpoStepOutcome& b, const char* what) {
  REQUIRE(a.completions.size() == b.completions.size());
  for (size_t i = 0; i < a.completions.size(); ++i) {
    CHECK(a.completions[i].completion == b.completions[i].completion);
    CHECK(a.completions[i].reward == b.completions[i].reward);
  }
  const double kl_cuda = a.metrics["kl"].get<double>(), kl_cpu = b.metrics["kl"].get<double>();
  std::printf("cuda-emu grpo %s beta step grad norm %.9f (cpu %.9f) kl %.9g (cpu %.9g)\n", what, a.grad_norm, b.grad_norm,
              kl_cuda, kl_cpu);
  CHECK(kl_cpu > 1e-6);
  CHECK(std::abs(kl_cuda - kl_cpu) <= 1e-3 * kl_cpu);
  CHECK(b.grad_norm > 0);
  CHECK(std::abs(a.grad_norm - b.grad_norm) <= 1e-5 * b.grad_norm);
}

// LoRA with beta > 0: non-zero adapters from the start (B drawn, not PEFT's zeros), so the
// generator's adapter path decides step 1's samples on both backends and the reference pass (the
// base, adapters off: offload/engine/token_scorer.h) differs from the policy; the KL and the
// adapters' gradient norm as close as the backends' f32 arithmetic.
TEST_CASE("GRPO steps with LoRA and beta on the CUDA backend follow the CPU backend's", "[cuda-emu][grpo][lora]") {
  auto cuda = cuda_testing::test_device();
  if (!cuda) return;
  testing::GrpoRig on_cuda(1, std::move(cuda), "llama", 1, 4, true, 0.5),
      on_cpu(1, device_create(DeviceOptions{}), "llama", 1, 4, true, 0.5);
  const GrpoStepOutcome a = on_cuda.step({0, 2}, 1), b = on_cpu.step({0, 2}, 1);
  check_step_follows_cpu(a, b, "lora");
  for (size_t m = 0; m < a.layouts.size(); ++m)  // the reference pass's log-probs, backend against backend
    for (size_t i = 0; i < a.layouts[m].ref_logp.size(); ++i)
      if (!std::isnan(b.layouts[m].ref_logp[i]))
        CHECK(std::abs(a.layouts[m].ref_logp[i] - b.layouts[m].ref_logp[i]) <= 1e-5);
  CHECK(std::isfinite(on_cuda.step({1}, 2).grad_norm));
}

// QLoRA: the same with the base held as NF4 (double-quantized; f32 compute on the dequantized bf16
// weights), so the CUDA backend's nf4_dequantize feeds the generator, the reference pass and the
// training passes; the packed codes are never written.
TEST_CASE("GRPO steps with LoRA and beta on an NF4 base on the CUDA backend follow the CPU backend's",
          "[cuda-emu][grpo][qlora]") {
  auto cuda = cuda_testing::test_device();
  if (!cuda) return;
  testing::GrpoRig on_cuda(1, std::move(cuda), "llama", 1, 4, true, 0.5, /*nf4=*/true),
      on_cpu(1, device_create(DeviceOptions{}), "llama", 1, 4, true, 0.5, /*nf4=*/true);
  REQUIRE(on_cuda.store.packed());
  const std::vector<char> codes = on_cuda.weights();
  const GrpoStepOutcome a = on_cuda.step({0, 2}, 1), b = on_cpu.step({0, 2}, 1);
  check_step_follows_cpu(a, b, "qlora");
  CHECK(std::isfinite(on_cuda.step({1}, 2).grad_norm));
  CHECK(on_cuda.weights() == codes);
}

}  // namespace strata
