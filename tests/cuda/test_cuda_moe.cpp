// Mixture-of-experts on the CUDA backend: the combine kernels (kernels/cuda/moe.cu) against their
// plain-loop twins (kernels/cpu/ref/moe.h), and the MoE layers end to end in the streaming engine
// against transformers' float64 goldens (tests/golden/qwen3_moe, mixtral) and the CPU backend.
#include <catch2/catch.hpp>
#include <cmath>

#include "kernels/cpu/ref/moe.h"
#include "models/moe_routing.h"
#include "tests/cuda/cuda_testing.h"
#include "tests/models/moe_golden.h"

namespace strata {

TEST_CASE("CUDA moe_combine kernels match their plain-loop twins", "[cuda-emu][moe]") {
  auto dev = cuda_testing::test_device();
  if (!dev) return;
  for (auto [n, k, c] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {7, 3, 17}, {33, 8, 130}}) {
    INFO("n=" << n << " k=" << k << " c=" << c);
    const int64_t m = n * k;
    const std::vector<float> logits = random_floats(size_t(n * (k + 3)), uint64_t(n + c));
    const MoeRouting r = moe_route(logits.data(), n, k + 3, k, true);
    const std::vector<float> y = random_floats(size_t(m * c), 1), dout = random_floats(size_t(n * c), 2);
    const std::vector<float> out0 = random_floats(size_t(n * c), 3);
    // fp64 references
    const std::vector<double> y64(y.begin(), y.end()), dout64(dout.begin(), dout.end());
    const std::vector<double> w64(r.row_weight.begin(), r.row_weight.end());
    std::vector<double> out_ref(out0.begin(), out0.end()), dy_ref(size_t(m * c)), dw_ref(static_cast<size_t>(m));
    ref::moe_combine_forward(out_ref.data(), y64.data(), w64.data(), r.token_row.data(), n, k, c);
    ref::moe_combine_backward(dy_ref.data(), dw_ref.data(), dout64.data(), y64.data(), w64.data(),
                              r.row_token.data(), m, c);

    Buffer<float> out(*dev, out0), yb(*dev, y), wb(*dev, r.row_weight), doutb(*dev, dout);
    Buffer<int32_t> token_row(*dev, r.token_row), row_token(*dev, r.row_token);
    Buffer<float> dy(*dev, size_t(m * c)), dw(*dev, size_t(m));
    dev->moe_combine_forward(out, yb, wb, token_row, n, k, c, Stream::compute);
    dev->moe_combine_backward(dy, dw, doutb, yb, wb, row_token, m, c, Stream::compute);
    // f32 sums of k (forward) and c (the dot) terms of magnitude <= 1
    CHECK(max_rel_error(out.download(), out_ref) <= 1e-6);
    CHECK(max_rel_error(dy.download(), dy_ref) <= 1e-7);
    CHECK(max_rel_error(dw.download(), dw_ref) <= 1e-5);
  }
}

TEST_CASE("MoE layers on the CUDA backend match transformers' float64 goldens and the CPU backend",
          "[cuda-emu][moe]") {
  auto cuda = cuda_testing::test_device();
  if (!cuda) return;
  auto cpu = device_create(DeviceOptions{});
  EngineOptions eo;
  eo.weights = WeightsMode::stream;
  eo.checkpoints = CheckpointMode::host;
  for (const char* name : {"qwen3_moe", "mixtral"}) {
    INFO(name);
    testing::GoldenStep on_cuda, on_cpu;
    moe_testing::moe_golden_check(*cuda, name, DType::f32, eo, true, 1e-5, 1e-4, &on_cuda);
    moe_testing::moe_golden_check(*cpu, name, DType::f32, eo, true, 1e-5, 1e-4, &on_cpu);
    CHECK(std::abs(on_cuda.loss - on_cpu.loss) <= 1e-5 * std::abs(on_cpu.loss));
  }
}

}  // namespace strata
