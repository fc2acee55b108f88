// Generation on the CUDA backend: the cached-attention kernel (kernels/cuda/attention_cached.cu)
// against its fp64 twin (kernels/cpu/ref/attention_cached.h) on head dims 5, 17, 64, 128, caches
// longer than one 32-key tile and rows at different positions, and with bf16 dots against the CPU
// kernel; determinism; and greedy
// generation on a golden model giving the CPU backend's tokens.
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "kernels/cpu/attention_cached.h"
#include "kernels/cpu/ref/attention_cached.h"
#include "offload/engine/generator.h"
#include "offload/state/model_io.h"
#include "tests/cuda/cuda_testing.h"
#include "tests/seeded_inputs.h"
#include "tests/testing.h"

namespace strata {
namespace {

TEST_CASE("cuda attention_cached_forward matches the fp64 twin", "[cuda-emu]") {
  auto dev = cuda_testing::test_device();
  if (!dev) return;
  struct Case {
    int64_t b, tq, tcap, h, hk, d;
    std::vector<int32_t> start;
  };
  const Case cases[] = {{1, 1, 1, 1, 1, 5, {0}},
                        {2, 1, 70, 4, 2, 17, {69, 33}},
                        {3, 3, 40, 6, 2, 64, {0, 31, 37}},
                        {1, 2, 100, 2, 1, 128, {65}}};
  for (const Case& c : cases) {
    INFO("b=" << c.b << " tq=" << c.tq << " tcap=" << c.tcap << " h=" << c.h << " hk=" << c.hk << " d=" << c.d);
    const size_t nq = size_t(c.b * c.tq * c.h * c.d), nk = size_t(c.b * c.tcap * c.hk * c.d);
    const auto q = random_floats(nq, 91, -2.f, 2.f), k = random_floats(nk, 92, -2.f, 2.f), v = random_floats(nk, 93);
    const double scale = 1.0 / std::sqrt(double(c.d));
    std::vector<double> want(nq);
    const auto qd = convert<double>(q), kd = convert<double>(k), vd = convert<double>(v);
    ref::attention_cached_forward<double>(want.data(), qd.data(), kd.data(), vd.data(), c.start.data(), c.b, c.tq,
                                          c.tcap, c.h, c.hk, c.d, scale);
    Buffer<float> gq(*dev, q), gk(*dev, k), gv(*dev, v), gout(*dev, nq);
    Buffer<int32_t> gs(*dev, c.start);
    dev->attention_cached_forward(gout, gq, gk, gv, gs, c.b, c.tq, c.tcap, c.h, c.hk, c.d, float(scale), DType::f32,
                                  Stream::compute);
    const std::vector<float> out = gout.download();
    CHECK(max_rel_error(out, want) <= 5e-6);
    dev->attention_cached_forward(gout, gq, gk, gv, gs, c.b, c.tq, c.tcap, c.h, c.hk, c.d, float(scale), DType::f32,
                                  Stream::compute);
    CHECK(gout.download() == out);  // no atomics: the same bits again
    // bf16 dots (the bf16 prefill's): against the CPU twin kernel with bf16 dots, which rounds
    // q, k, v alike (tests/offload/test_generator.cpp checks it against the fp64 twin)
    std::vector<float> cpu_bf16(nq);
    cpu::attention_cached_forward(cpu_bf16.data(), q.data(), k.data(), v.data(), c.start.data(), c.b, c.tq, c.tcap, c.h,
                                  c.hk, c.d, float(scale), DType::bf16);
    dev->attention_cached_forward(gout, gq, gk, gv, gs, c.b, c.tq, c.tcap, c.h, c.hk, c.d, float(scale), DType::bf16,
                                  Stream::compute);
    const std::vector<float> out_bf16 = gout.download();
    CHECK(max_rel_error(out_bf16, convert<double>(cpu_bf16)) <= 5e-6);
    CHECK(max_rel_error(out_bf16, want) > 1e-4);  // the rounding is there
  }
}

TEST_CASE("cuda greedy generation gives the CPU backend's tokens", "[cuda-emu]") {
  auto dev = cuda_testing::test_device();
  if (!dev) return;
  const testing::Golden g = testing::Golden::load("qwen2");
  const ModelSpec spec = model_spec_build(hf_config_load(g.dir), DType::f32);
  const std::vector<std::vector<int32_t>> prompts = {{3, 9, 14, 2, 11}, {5, 6}};
  SamplingOptions so;
  so.max_new_tokens = 6;
  auto run = [&](Device& d) {
    HostStore store(d, spec);
    model_load_weights(store, g.dir);
    Generator gen(d, store, GeneratorShape{2, 5, 11});
    return gen.generate(prompts, so, 0);
  };
  auto cpu = device_create(DeviceOptions{});
  const auto want = run(*cpu), got = run(*dev);
  for (size_t r = 0; r < prompts.size(); ++r) CHECK(got[r].tokens == want[r].tokens);
}

// The KV cache of every layer spilled to pinned host memory (weights streamed, a budget that
// leaves no room for a third cache) against every cache on the device: the same tokens. The
// uploads of layer i + 1's cache overlap layer i on the emulator's h2d stream, so a missing event
// shows as a wrong token or a reuse of an in-flight pinned buffer.
TEST_CASE("cuda generation with the KV cache spilled to host memory gives the same tokens", "[cuda-emu]") {
  const ModelSpec spec = model_spec_build(testing::tiny_llama_config({48, 72, 5, 113, 64, false}), DType::f32);
  const std::vector<std::vector<int32_t>> prompts = {{3, 17, 99, 4, 56, 7, 81}, {12}, {44, 45, 46}};
  const GeneratorShape shape{3, 7, 16};
  SamplingOptions so;
  so.max_new_tokens = 9;
  // The backend takes its cuBLAS workspace from the budget at the first GEMM; the generator
  // leaves it free (Device::pending_workspace_bytes): a budget of the spilled placement plus that
  // workspace must give the spilled placement and run to the end (it would exit 3 at the first
  // GEMM, or pick a larger placement, if the workspace were not counted).
  auto warm = [](Device& d) {
    Buffer<float> one(d, std::vector<float>{1.f}), out(d, 1);
    d.matmul(out, one, one, DType::f32, 1, 1, 1, false, true, 0.f, Stream::compute);
    d.synchronize();
  };
  size_t backend_bytes = 0;
  {
    auto probe = cuda_testing::test_device();
    const size_t before = probe->used_bytes();
    warm(*probe);
    backend_bytes = probe->used_bytes() - before;
  }
  auto run = [&](size_t budget, GeneratorPlacement* placement) {
    auto dev = cuda_testing::test_device(budget + backend_bytes);
    CHECK(dev->pending_workspace_bytes(Stream::compute) == backend_bytes);
    HostStoreOptions ho;
    ho.weights_only = true;
    HostStore store(*dev, spec, ho);
    model_init_weights(store, 11, 0.3);
    Generator gen(*dev, store, shape);
    *placement = gen.placement();
    auto out = gen.generate(prompts, so, 0);
    CHECK(dev->pending_workspace_bytes(Stream::compute) == 0);  // taken by then
    CHECK(dev->peak_bytes() <= dev->budget_bytes());
    return out;
  };
  GeneratorPlacement all, spilled;
  const auto want = run(size_t(96) << 20, &all);
  const auto got = run(generator_device_bytes(spec, shape, GeneratorPlacement{false, 0}) + 1024, &spilled);
  CHECK(all.kv_device_layers == spec.layers.size());
  CHECK(spilled.kv_device_layers == 0);
  CHECK_FALSE(spilled.weights_resident);
  for (size_t r = 0; r < prompts.size(); ++r) CHECK(got[r].tokens == want[r].tokens);
}

}  // namespace
}  // namespace strata
