// The zeroth-order engine (offload/engine/engine_zo.h) on the CUDA backend: the dual forward on the
// four golden families against the CPU backend, and the device's perturbation of the streamed
// layers, norm and lm_head chunks against the same model perturbed on the host by the plain-loop
// twin (kernels/cpu/ref/zo.h) and run clean on the same device: bit for bit, so the CUDA
// perturbation is exactly the z the host regenerates for the update. And a step's q x k dual
// forwards run layer-major (one run, the weights once) give the bits one at a time gives.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>

#include "kernels/cpu/ref/zo.h"
#include "offload/engine/engine_zo.h"
#include "tests/cuda/cuda_testing.h"
#include "tests/offload/zo_schedule_testing.h"
#include "tests/testing.h"

namespace strata {
namespace {

using testing::Golden;

ZoLosses dual(Device& dev, const Golden& g, DType dtype, uint64_t seed, float eps) {
  HostStore store(dev, model_spec_build(hf_config_load(g.dir), dtype));
  model_load_weights(store, g.dir);
  EngineOptions eo;
  eo.max_batch = g.batch.B;
  eo.max_tokens = g.batch.T;
  eo.head_chunk_rows = 40;  // several lm_head chunks
  ZoEngine engine(dev, store, eo);
  return engine.dual_forward(g.batch, seed, eps);
}

// The clean loss of the golden model with every parameter moved by sign·eps·z on the host.
double host_perturbed_loss(Device& dev, const Golden& g, DType dtype, uint64_t seed, float eps) {
  const ModelSpec spec = model_spec_build(hf_config_load(g.dir), dtype);
  HostStore store(dev, spec);
  model_load_weights(store, g.dir);
  for (size_t r = 0; r < spec.params.size(); ++r) {
    void* w = store.working_of(r);
    if (store.working_table()[r].dtype == DType::bf16)
      ref::zo_perturb_bf16(static_cast<bf16*>(w), seed, uint32_t(r), 0, eps, spec.params[r].numel());
    else
      ref::zo_perturb_f32(static_cast<float*>(w), seed, uint32_t(r), 0, eps, spec.params[r].numel());
  }
  EngineOptions eo;
  eo.max_batch = g.batch.B;
  eo.max_tokens = g.batch.T;
  eo.head_chunk_rows = 40;
  ZoEngine engine(dev, store, eo);
  return engine.forward_loss(g.batch);
}

}  // namespace

TEST_CASE("the ZO dual forward on the CUDA backend matches the CPU backend and the host-perturbed model", "[cuda-emu][zo]") {
  auto cuda = cuda_testing::test_device();
  if (!cuda) return;
  auto cpu = device_create(DeviceOptions{});
  for (const char* name : {"llama", "mistral", "qwen2", "qwen3"}) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      INFO(name << " " << dtype_name(dtype));
      const Golden g = Golden::load(name);
      const uint64_t seed = 555;
      const float eps = 1e-3f;
      const ZoLosses on_cuda = dual(*cuda, g, dtype, seed, eps), on_cpu = dual(*cpu, g, dtype, seed, eps);
      std::printf("cuda-emu zo %-8s %-4s L+ %.9f (cpu %.9f) L- %.9f (cpu %.9f)\n", name, dtype_name(dtype),
                  on_cuda.plus, on_cpu.plus, on_cuda.minus, on_cpu.minus);
      // the backends' matmuls and reductions round differently: the first-order engine test's 2e-6
      const double tol = dtype == DType::f32 ? 2e-6 : 2e-3;
      CHECK(std::abs(on_cuda.plus - on_cpu.plus) <= tol * std::abs(on_cpu.plus));
      CHECK(std::abs(on_cuda.minus - on_cpu.minus) <= tol * std::abs(on_cpu.minus));
      // on one backend, perturbing on the device equals perturbing on the host: the same bits
      CHECK(on_cuda.plus == host_perturbed_loss(*cuda, g, dtype, seed, eps));
      CHECK(on_cuda.minus == host_perturbed_loss(*cuda, g, dtype, seed, -eps));
    }
  }
}

TEST_CASE("ZO layer-major on the CUDA backend equals one dual forward at a time bit for bit, the weights crossing once", "[cuda-emu][zo][layer_major]") {
  auto cuda = cuda_testing::test_device();
  if (!cuda) return;
  for (DType dtype : {DType::f32, DType::bf16}) {
    // 4 layers and 4 lm_head chunks (25 of 97 vocab rows) through 2 slots each: none stays
    const ModelSpec spec = model_spec_build(testing::tiny_llama_config({64, 96, 4, 97, 256, dtype == DType::bf16}), dtype);
    for (const auto& [k, q] : {std::pair<size_t, int>{2, 2}, {3, 1}, {3, 2}}) {
      INFO(dtype_name(dtype) << ", k " << k << ", q " << q);
      const std::vector<MicroBatch> micro = testing::zo_uneven_batches(k, 97);
      const int64_t pairs = int64_t(k) * q;
      const testing::ZoScheduleRun one = testing::zo_schedule_run(*cuda, spec, 4, micro, q, 1, 2, 25);
      const testing::ZoScheduleRun major = testing::zo_schedule_run(*cuda, spec, 4, micro, q, pairs, 2, 25);
      CHECK(testing::zo_schedule_runs_equal(one, major));
      CHECK(major.steps[0].projected != major.steps[1].projected);  // the steps moved: the check can fail
      for (size_t s = 0; s < 2; ++s) {
        CHECK(major.weight_h2d[s] == major.W);
        CHECK(one.weight_h2d[s] > major.W);
      }
    }
  }
}

}  // namespace strata
