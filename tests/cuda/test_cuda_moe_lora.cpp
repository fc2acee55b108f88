// LoRA on a mixture-of-experts layer's router and experts (PEFT's target_parameters) on the
// emulated CUDA backend: the adapter gradients against PEFT's float64 goldens and the CPU backend,
// and greedy generation with the adapters unmerged (tests/models/moe_lora_testing.h).
#include <catch2/catch.hpp>
#include <cstdio>

#include "tests/cuda/cuda_testing.h"
#include "tests/models/moe_lora_testing.h"

namespace strata {

TEST_CASE("cuda LoRA on MoE routers and experts matches PEFT's float64 gradients and the CPU backend",
          "[cuda-emu][lora][moe]") {
  auto cuda = cuda_testing::test_device();
  if (!cuda) return;
  auto cpu = device_create(DeviceOptions{});
  for (const char* name : {"qwen3_moe_experts", "mixtral_experts"}) {
    INFO(name);
    const moe_lora_testing::Case c = moe_lora_testing::Case::load(name);
    const moe_lora_testing::Step on_cuda = moe_lora_testing::step(*cuda, c, DType::f32);
    const moe_lora_testing::Step on_cpu = moe_lora_testing::step(*cpu, c, DType::f32);
    const double want = c.expected["loss"].get<double>(), err = moe_lora_testing::golden_error(on_cuda, c);
    double vs_cpu = 0;
    for (size_t i = 0; i < on_cuda.grads.size(); ++i)
      vs_cpu = std::max(vs_cpu, moe_lora_testing::rel_l2(on_cuda.grads[i].second, on_cpu.grads[i].second.data()));
    std::printf("cuda-emu moe lora %-18s loss %.9f (cpu %.9f, PEFT %.9f) worst adapter grad rel L2 %.2e vs fp64, "
                "%.2e vs cpu\n", name, on_cuda.loss, on_cpu.loss, want, err, vs_cpu);
    CHECK(std::abs(on_cuda.loss - want) <= 1e-5 * want);
    CHECK(err <= 1e-4);
    CHECK(vs_cpu <= 1e-4);
    moe_lora_testing::generate_check(*cuda, c);
  }
}

}  // namespace strata
