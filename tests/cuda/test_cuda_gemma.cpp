// Gemma 3 and OLMo 2 on the CUDA backend (emulated under cuemu): the GeGLU and affine kernels
// (kernels/cuda/geglu.cu) against the CPU kernels and their fp64 twin, the cached-attention
// kernel's sliding window and head dim 256 (Gemma 3's) against its twin, and end to end the
// transformers goldens of tools/golden/make_gemma_goldens.py: `strata grad`'s loss within 1e-5
// relative and every gradient within 1e-4 relative L2, and greedy generation token for token.
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/ref/attention_cached.h"
#include "kernels/cpu/ref/geglu.h"
#include "tests/cuda/cuda_testing.h"
#include "tests/models/gemma_testing.h"
#include "tests/seeded_inputs.h"
#include "tests/testing.h"

namespace strata {
namespace {

using cuda_testing::Buffer;
using testing::convert;
using testing::max_rel_error;
using testing::random_floats;

TEST_CASE("cuda geglu and affine match the CPU kernels and the fp64 twin", "[cuda-emu][gemma]") {
  auto dev = cuda_testing::test_device();
  if (!dev) return;
  for (const int64_t n : {1, 17, 4097}) {
    INFO("n=" << n);
    const auto gate = random_floats(static_cast<size_t>(n), 40 + n, -4.f, 4.f), up = random_floats(static_cast<size_t>(n), 50 + n);
    const auto dout = random_floats(static_cast<size_t>(n), 60 + n);
    Buffer<float> gg(*dev, gate), gu(*dev, up), gd(*dev, dout), go(*dev, static_cast<size_t>(n)), gdg(*dev, static_cast<size_t>(n)),
        gdu(*dev, static_cast<size_t>(n)), gy(*dev, static_cast<size_t>(n));
    dev->geglu_forward(go, gg, gu, n, Stream::compute);
    dev->geglu_backward(gdg, gdu, gd, gg, gu, n, Stream::compute);
    dev->affine(gy, gg, 6.3245554f, 1.f, n, Stream::compute);
    std::vector<double> ro(static_cast<size_t>(n)), rg(static_cast<size_t>(n)), ru(static_cast<size_t>(n)), ry(static_cast<size_t>(n));
    const auto g64 = convert<double>(gate), u64 = convert<double>(up), d64 = convert<double>(dout);
    ref::geglu_forward(ro.data(), g64.data(), u64.data(), n);
    ref::geglu_backward(rg.data(), ru.data(), d64.data(), g64.data(), u64.data(), n);
    ref::affine(ry.data(), g64.data(), double(6.3245554f), 1.0, n);
    // the CPU kernels' tolerances (test_geglu.cpp): f32 tanh and products
    CHECK(max_rel_error(go.download(), ro) <= 2e-6);
    CHECK(max_rel_error(gdg.download(), rg) <= 2e-6);
    CHECK(max_rel_error(gdu.download(), ru) <= 2e-6);
    CHECK(max_rel_error(gy.download(), ry) <= 1e-7);
  }
}

TEST_CASE("cuda cached attention with a sliding window and head dim 256 matches the fp64 twin", "[cuda-emu][gemma]") {
  auto dev = cuda_testing::test_device();
  if (!dev) return;
  struct Case {
    int64_t b, tq, tcap, h, hk, d, window;
    std::vector<int32_t> start;
  };
  const Case cases[] = {{2, 1, 70, 4, 2, 17, 5, {69, 33}},
                        {1, 2, 100, 2, 1, 256, 40, {65}},
                        {2, 3, 40, 2, 2, 24, 1, {0, 30}},
                        {1, 1, 80, 2, 1, 256, 0, {79}}};
  for (const Case& c : cases) {
    INFO("d=" << c.d << " window=" << c.window);
    const size_t nq = static_cast<size_t>(c.b * c.tq * c.h * c.d), nk = static_cast<size_t>(c.b * c.tcap * c.hk * c.d);
    const auto q = random_floats(nq, 71, -2.f, 2.f), k = random_floats(nk, 72, -2.f, 2.f), v = random_floats(nk, 73);
    const double scale = 1.0 / std::sqrt(double(c.d));
    std::vector<double> want(nq);
    const auto qd = convert<double>(q), kd = convert<double>(k), vd = convert<double>(v);
    ref::attention_cached_forward<double>(want.data(), qd.data(), kd.data(), vd.data(), c.start.data(), c.b, c.tq,
                                          c.tcap, c.h, c.hk, c.d, scale, c.window);
    Buffer<float> gq(*dev, q), gk(*dev, k), gv(*dev, v), gout(*dev, nq);
    Buffer<int32_t> gs(*dev, c.start);
    dev->attention_cached_forward(gout, gq, gk, gv, gs, c.b, c.tq, c.tcap, c.h, c.hk, c.d, float(scale), DType::f32,
                                  Stream::compute, c.window);
    CHECK(max_rel_error(gout.download(), want) <= 5e-6);  // test_cuda_generate.cpp's tolerance
  }
}

TEST_CASE("cuda strata grad matches transformers' float64 Gemma 3, OLMo 2 and windowed qwen2", "[cuda-emu][gemma]") {
  auto dev = cuda_testing::test_device();
  if (!dev) return;
  for (const char* name : {"gemma3", "olmo2", "qwen2_window"}) {
    INFO(name);
    const gemma_testing::GoldenCheck r = gemma_testing::check_golden(*dev, name, DType::f32, 1e-5, 1e-4);
    std::printf("cuda-emu golden %-12s f32: loss rel err %.2e, worst gradient rel L2 err %.2e (%s)\n", name,
                r.loss_error, r.worst_grad_error, r.worst_name.c_str());
  }
}

TEST_CASE("cuda greedy generation equals transformers' on Gemma 3, OLMo 2 and windowed qwen2", "[cuda-emu][gemma]") {
  auto dev = cuda_testing::test_device();
  if (!dev) return;
  for (const char* name : {"gemma3", "olmo2", "qwen2_window"}) {
    INFO(name);
    gemma_testing::check_generation(*dev, name);
  }
}

}  // namespace
}  // namespace strata
