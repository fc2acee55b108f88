// End to end on the CUDA backend: the step engine (offload/engine.h) streaming a model layer by
// layer through the CUDA device's h2d / compute / d2h streams and events, with every op of a
// decoder layer, the chunked lm_head loss and the gradient path. Checked against the fp64
// torch goldens of tests/golden (tolerances of tests/models/test_golden_grad.cpp) and against
// the CPU backend running the same schedule: in f32, in bf16, and with packed documents.
#include <catch2/catch.hpp>
#include <cmath>

#include "tests/cuda/cuda_testing.h"
#include "tests/testing.h"

namespace strata {
namespace {

using testing::Golden;
using testing::GoldenStep;

// One forward_backward with streamed weights and host-spilled checkpoints (the schedule with
// the most cross-stream traffic), on golden g's model and batch.
GoldenStep run_step(Device& dev, const Golden& g, DType dtype) {
  EngineOptions eo;
  eo.weights = "stream";
  eo.checkpoints = "host";
  return testing::golden_step(dev, g, dtype, eo);
}

// Checks every tensor of got against want within tol; returns the worst.
testing::TensorError check_tensors(const GoldenStep& got, const std::vector<float>& want, double tol) {
  const auto errors = testing::tensor_errors(got.table, got.grads, want);
  for (const auto& e : errors) {
    INFO(e.name);
    CHECK(e.error <= tol);
  }
  return testing::worst_tensor_error(errors);
}

}  // namespace

TEST_CASE("the streaming engine on the CUDA backend matches the fp64 goldens and the CPU backend", "[cuda-emu]") {
  auto cuda = cuda_testing::test_device();
  if (!cuda) return;
  auto cpu = device_create(DeviceOptions{});
  for (const char* name : {"llama", "mistral", "qwen2", "qwen3"}) {
    INFO(name);
    const Golden g = Golden::load(name);
    const GoldenStep on_cuda = run_step(*cuda, g, DType::f32);
    const GoldenStep on_cpu = run_step(*cpu, g, DType::f32);
    // The golden test's tolerances (f32 vs fp64 torch): loss 2e-6 relative, gradients 2e-5.
    CHECK(std::abs(on_cuda.loss - g.loss) <= 2e-6 * std::abs(g.loss));
    const auto worst = check_tensors(on_cuda, g.grads(on_cuda.table, on_cuda.grads.size()), 2e-5);
    std::printf("cuda-emu engine %-8s f32 loss %.9f (want %.9f) worst grad rel err %.2e (%s)\n",
                name, on_cuda.loss, g.loss, worst.error, worst.name.c_str());
    // And the two backends agree at least as closely as either does with fp64.
    CHECK(std::abs(on_cuda.loss - on_cpu.loss) <= 2e-6 * std::abs(on_cpu.loss));
    check_tensors(on_cuda, on_cpu.grads, 2e-5);
  }
}

TEST_CASE("the streaming engine on the CUDA backend in bf16 and with packed documents tracks the CPU backend", "[cuda-emu]") {
  auto cuda = cuda_testing::test_device();
  if (!cuda) return;
  auto cpu = device_create(DeviceOptions{});
  const Golden g = Golden::load("qwen3");

  SECTION("bf16 weights and matmul inputs") {
    const GoldenStep on_cuda = run_step(*cuda, g, DType::bf16);
    const GoldenStep on_cpu = run_step(*cpu, g, DType::bf16);
    const double want_loss = g.loss;
    // As the golden bf16 test: loss within 1%, gradients within 10% of the tensor's max; the
    // two backends round the same values to bf16, so they agree more closely.
    CHECK(std::abs(on_cuda.loss - want_loss) <= 1e-2 * std::abs(want_loss));
    check_tensors(on_cuda, g.grads(on_cuda.table, on_cuda.grads.size()), 0.1);
    CHECK(std::abs(on_cuda.loss - on_cpu.loss) <= 1e-3 * std::abs(on_cpu.loss));
    check_tensors(on_cuda, on_cpu.grads, 2e-2);
  }
  SECTION("packed documents: doc_start masks and per-document positions") {
    Golden packed = g;
    MicroBatch& mb = packed.batch;
    mb.doc_start.assign(mb.ids.size(), 0);
    for (int64_t b = 0; b < mb.B; ++b) {
      const int64_t split = 1 + (b * 3 + 4) % (mb.T - 1);  // a second document starts here
      for (int64_t t = 0; t < mb.T; ++t) {
        const size_t at = size_t(b * mb.T + t);
        mb.doc_start[at] = t < split ? 0 : int32_t(split);
        mb.pos[at] = int32_t(t - mb.doc_start[at]);
      }
    }
    const GoldenStep on_cuda = run_step(*cuda, packed, DType::f32);
    const GoldenStep on_cpu = run_step(*cpu, packed, DType::f32);
    const GoldenStep unpacked = run_step(*cpu, g, DType::f32);
    CHECK(std::abs(on_cpu.loss - unpacked.loss) > 1e-4);  // the packing does change the result
    CHECK(std::abs(on_cuda.loss - on_cpu.loss) <= 2e-6 * std::abs(on_cpu.loss));
    check_tensors(on_cuda, on_cpu.grads, 2e-5);
  }
}

}  // namespace strata
