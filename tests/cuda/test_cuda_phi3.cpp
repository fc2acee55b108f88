// Phi-3 on the CUDA backend (emulated under cuemu): the kind adds no device op (its fused
// projections are row ranges of one tensor for the dense layer's kernels, LongRoPE a second RoPE
// table), so end to end against the transformers goldens of tools/golden/make_phi3_goldens.py:
// `strata grad`'s loss within 1e-5 relative and every gradient within 1e-4 relative L2, and greedy
// generation token for token; phi3_partial's partial rotary (12 of 16 dims) through the rope op's rot.
#include <catch2/catch.hpp>
#include <cstdio>

#include "tests/cuda/cuda_testing.h"
#include "tests/models/gemma_testing.h"
#include "tests/models/phi3_testing.h"

namespace strata {
namespace {

TEST_CASE("cuda strata grad matches transformers' float64 Phi-3 (LongRoPE short and long)", "[cuda-emu][phi3]") {
  auto dev = cuda_testing::test_device();
  if (!dev) return;
  for (const char* name : {"phi3", "phi3_long", "phi3_partial"}) {
    INFO(name);
    const gemma_testing::GoldenCheck r = gemma_testing::check_golden(*dev, name, DType::f32, 1e-5, 1e-4);
    std::printf("cuda-emu golden %-10s f32: loss rel err %.2e, worst gradient rel L2 err %.2e (%s)\n", name,
                r.loss_error, r.worst_grad_error, r.worst_name.c_str());
  }
}

TEST_CASE("cuda greedy generation equals transformers' on Phi-3", "[cuda-emu][phi3]") {
  auto dev = cuda_testing::test_device();
  if (!dev) return;
  for (const char* name : {"phi3", "phi3_long", "phi3_partial"}) {
    INFO(name);
    phi3_testing::check_generation_each(*dev, name);
  }
}

}  // namespace
}  // namespace strata
