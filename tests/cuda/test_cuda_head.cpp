// The CUDA backend's vocab-chunked lm_head loss (kernels/cuda/cross_entropy.cu) against its CPU
// twins, the streaming engine on CUDA with lm_head in many small chunks against the CPU backend,
// and the engine on CUDA when pinned host memory falls back to pageable memory.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "offload/plan/plan_search.h"
#include "kernels/cpu/ops.h"
#include "src/recipe/recipe_modes.h"
#include "offload/engine/engine.h"
#include "offload/state/model_io.h"
#include "offload/plan/placement_plan.h"
#include "tests/cuda/cuda_testing.h"
#include "tests/kernels/ce_chunked.h"
#include "tests/seeded_inputs.h"
#include "tests/testing.h"

namespace strata {
namespace {

using testing::ChunkedResult;

// testing::ce_chunked_cpu on a device, each chunk's weights and gradient in their own buffers as
// the engine keeps them.
ChunkedResult device_chunked(Device& dev, const std::vector<float>& h, const std::vector<float>& w, DType wt,
                             const std::vector<int32_t>& targets, int64_t n, int64_t c, int64_t v, int64_t rows,
                             float scale, const std::vector<float>& dw0, bool keep = false) {
  Buffer<float> bh(dev, h), bdh(dev, std::vector<float>(h.size(), 0.f));
  Buffer<int32_t> bt(dev, targets);
  Buffer<double> bstats(dev, size_t(3 * n)), bloss(dev, std::vector<double>{0.25});  // the loss adds into it
  const int64_t chunks = (v + rows - 1) / rows;
  std::vector<std::unique_ptr<Buffer<float>>> w32, dwc;
  std::vector<std::unique_ptr<Buffer<bf16>>> w16;
  std::vector<const void*> wp;
  for (int64_t k = 0; k < chunks; ++k) {
    const int64_t v0 = k * rows, vc = std::min(rows, v - v0);
    std::vector<float> part(w.begin() + long(v0 * c), w.begin() + long((v0 + vc) * c));
    if (wt == DType::bf16) {
      w16.push_back(std::make_unique<Buffer<bf16>>(dev, testing::to_bf16(part)));
      wp.push_back(w16.back()->get());
    } else {
      w32.push_back(std::make_unique<Buffer<float>>(dev, part));
      wp.push_back(w32.back()->get());
    }
    dwc.push_back(std::make_unique<Buffer<float>>(
        dev, std::vector<float>(dw0.begin() + long(v0 * c), dw0.begin() + long((v0 + vc) * c))));
  }
  // keep: each chunk's logits kept by the stats pass (device, N x rows) for the backward
  std::vector<std::unique_ptr<Buffer<float>>> kept;
  for (int64_t k = 0; keep && k < chunks; ++k)
    kept.push_back(std::make_unique<Buffer<float>>(dev, std::vector<float>(size_t(n * rows), -3.f)));
  auto kept_of = [&](int64_t k) -> float* { return keep ? kept[size_t(k)]->get() : nullptr; };
  for (int64_t k = 0; k < chunks; ++k)
    dev.lm_head_ce_chunk_stats(bstats, bh, wp[size_t(k)], wt, bt, n, c, v, k * rows,
                               std::min(rows, v - k * rows), k == 0, kept_of(k), Stream::compute);
  dev.lm_head_ce_stats_loss(bloss, bstats, bt, n, v, Stream::compute);
  for (int64_t k = chunks - 1; k >= 0; --k)
    dev.lm_head_ce_chunk_backward(bdh, *dwc[size_t(k)], bh, wp[size_t(k)], wt, bstats, bt, n, c, v,
                                  k * rows, std::min(rows, v - k * rows), scale, kept_of(k), Stream::compute);
  ChunkedResult r;
  r.loss = bloss.download()[0] - 0.25;
  r.dh = bdh.download();
  for (auto& d : dwc) {
    auto part = d->download();
    r.dw.insert(r.dw.end(), part.begin(), part.end());
  }
  return r;
}

using testing::GoldenStep;

GoldenStep golden_step(Device& dev, const std::string& name, int64_t head_chunk_rows) {
  EngineOptions eo;
  eo.weights = WeightsMode::stream;
  eo.checkpoints = CheckpointMode::host;
  eo.head_chunk_rows = head_chunk_rows;
  return testing::golden_step(dev, testing::Golden::load(name), DType::f32, eo);
}

}  // namespace

TEST_CASE("cuda vocab-chunked lm_head cross-entropy matches the CPU twins, f32 and bf16", "[cuda-emu]") {
  auto dev = cuda_testing::test_device();
  if (!dev) return;
  struct Shape {
    int64_t n, c, v, rows;
  };
  // 130 rows cross the 128-row tile; 300 in chunks of 64 leaves 44; rows = v is one chunk.
  for (Shape s : {Shape{1, 5, 71, 71}, Shape{17, 24, 300, 64}, Shape{130, 8, 71, 16}, Shape{130, 8, 71, 1}}) {
    for (DType wt : {DType::f32, DType::bf16}) {
      INFO("n=" << s.n << " c=" << s.c << " v=" << s.v << " rows=" << s.rows << " " << dtype_name(wt));
      const auto h = random_floats(size_t(s.n * s.c), 71, -2.f, 2.f);
      const auto w = random_floats(size_t(s.v * s.c), 72, -1.f, 1.f);
      const auto dw0 = random_floats(size_t(s.v * s.c), 73, -0.1f, 0.1f);
      std::vector<int32_t> targets(size_t(s.n));
      for (int64_t i = 0; i < s.n; ++i) targets[size_t(i)] = (i % 5 == 3) ? -100 : int32_t((i * 13) % s.v);
      const float scale = 0.37f;
      const ChunkedResult want = testing::ce_chunked_cpu(h, w, wt, targets, s.n, s.c, s.v, s.rows, scale, dw0);
      const ChunkedResult got = device_chunked(*dev, h, w, wt, targets, s.n, s.c, s.v, s.rows, scale, dw0);
      CHECK(std::abs(got.loss - want.loss) <= 2e-6 * std::abs(want.loss));
      // bf16: both round dlogits to bf16; an f32 rounding apart can round to neighbouring values.
      const double tol = wt == DType::f32 ? 1e-5 : 1e-2;
      CHECK(max_rel_error(got.dh, want.dh) <= tol);
      CHECK(max_rel_error(got.dw, want.dw) <= tol);
      // kept logits (Device::lm_head_ce_chunk_stats' keep_logits): the backward reads what the
      // stats pass kept instead of recomputing it, and gives the recompute's bits
      const ChunkedResult kept = device_chunked(*dev, h, w, wt, targets, s.n, s.c, s.v, s.rows, scale, dw0, true);
      CHECK(std::memcmp(&kept.loss, &got.loss, sizeof(double)) == 0);
      CHECK(std::memcmp(kept.dh.data(), got.dh.data(), got.dh.size() * sizeof(float)) == 0);
      CHECK(std::memcmp(kept.dw.data(), got.dw.data(), got.dw.size() * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("cuda vocab-chunked cross-entropy reports a target outside the vocabulary", "[cuda-emu]") {
  auto dev = cuda_testing::test_device();
  if (!dev) return;
  const int64_t n = 4, c = 3, v = 9;
  Buffer<float> bh(*dev, random_floats(size_t(n * c), 1)), bw(*dev, random_floats(size_t(v * c), 2));
  Buffer<int32_t> bt(*dev, std::vector<int32_t>{0, -100, 9, 2});
  Buffer<double> bstats(*dev, size_t(3 * n));
  dev->lm_head_ce_chunk_stats(bstats, bh, bw.get(), DType::f32, bt, n, c, v, 0, 5, true, nullptr, Stream::compute);
  REQUIRE_THROWS_WITH(dev->stream_synchronize(Stream::compute), Catch::Contains("target id"));
}

TEST_CASE("the streaming engine on CUDA with lm_head in small chunks tracks the CPU backend", "[cuda-emu]") {
  auto cuda = cuda_testing::test_device();
  if (!cuda) return;
  auto cpu = device_create(DeviceOptions{});
  for (const char* name : {"llama", "qwen3"}) {  // tied and untied lm_head
    INFO(name);
    const GoldenStep on_cuda = golden_step(*cuda, name, 7);
    const GoldenStep on_cpu = golden_step(*cpu, name, 7);
    CHECK(std::abs(on_cuda.loss - on_cpu.loss) <= 2e-6 * std::abs(on_cpu.loss));
    for (const auto& e : testing::tensor_errors(on_cuda.table, on_cuda.grads, on_cpu.grads)) {
      INFO(e.name);
      CHECK(e.error <= 2e-5);
    }
  }
}

TEST_CASE("the engine on CUDA with pinned memory fallen back to pageable gives the same results", "[cuda-emu]") {
  auto pinned = cuda_testing::test_device();
  if (!pinned) return;
  setenv("STRATA_FAKE_PINNED_FAIL", "1", 1);
  auto pageable = cuda_testing::test_device();
  unsetenv("STRATA_FAKE_PINNED_FAIL");
  const GoldenStep a = golden_step(*pinned, "qwen3", 0);
  const GoldenStep b = golden_step(*pageable, "qwen3", 0);
  CHECK(a.pageable_bytes == 0);
  CHECK(b.pageable_bytes > 0);
  CHECK(std::memcmp(&a.loss, &b.loss, sizeof(double)) == 0);
  CHECK(std::memcmp(a.grads.data(), b.grads.data(), a.grads.size() * 4) == 0);
}

TEST_CASE("the engine on CUDA keeps activations and logits only in what the backend's workspaces leave", "[cuda-emu]") {
  // 5 lm_head chunks of 4096 rows (V 20000) at 66 tokens: ~1.1 MB of logits each. The cuBLAS
  // workspace (8 MiB) and the lm_head_ce workspace (~3 MB) are taken at the first GEMM and loss:
  // counted as free, kept logits would fill them and the first step would run out of budget.
  const ModelConfig cfg = testing::tiny_llama_config({64, 96, 2, 20000, 256, false});
  struct Run {
    double loss = 0;
    size_t peak = 0, kept_chunks = 0, kept_layers = 0;
    std::vector<float> grads;
  };
  auto run = [&](size_t budget, const std::string& recompute) {
    auto dev = cuda_testing::test_device(budget);
    HostStore store(*dev, model_spec_build(cfg, DType::bf16));
    model_init_weights(store, 3);
    EngineOptions eo;
    eo.checkpoints = CheckpointMode::host;
    eo.max_batch = 2;
    eo.max_tokens = 33;
    eo.recompute = recompute_mode_parse(recompute);
    Engine engine(*dev, store, eo);
    const MicroBatch mb = testing::strided_batch(2, 33, cfg.vocab_size, 7919);
    Run r;
    r.loss = engine.forward_backward(mb, 1.f / float(mb.counted()));
    engine.synchronize();
    r.peak = dev->peak_bytes();
    r.kept_chunks = engine.kept_logit_chunks();
    r.kept_layers = engine.kept_activation_layers();
    r.grads.assign(store.grad(), store.grad() + store.f32_floats());
    return r;
  };
  auto probe = cuda_testing::test_device();
  if (!probe) return;
  const Run always = run(size_t(96) << 20, "always");
  REQUIRE(always.kept_chunks == 0);
  const size_t chunk = size_t(66 * 4096) * sizeof(float);
  const size_t budget = always.peak + (size_t(1) << 20) + 5 * chunk / 2;  // room for ~2 chunks
  const Run tight = run(budget, "auto");
  CHECK(tight.kept_chunks >= 1);
  CHECK(tight.kept_chunks < 5);
  CHECK(tight.peak <= budget);
  // the placement plan for a CUDA device counts those workspaces and keeps what the engine keeps
  PlanInputs in;
  in.weights = WeightsMode::stream;  // as the engine above
  in.checkpoints = CheckpointMode::host;
  in.recompute = RecomputeMode::automatic;
  in.optimizer = StateTier::host;
  in.micro_batch = 2;
  in.sequence_len = 33;
  in.device_is_cuda = true;
  PlanBudgets b;
  b.device_bytes = budget;
  const RunPlan plan = placement_plan(model_spec_build(cfg, DType::bf16), in, b);
  CHECK(plan.bytes_of("CUDA backend workspaces (cuBLAS, lm_head loss)") == cuda_backend_workspace_bytes(64, 4096));
  CHECK(plan.kept_logit_chunks == tight.kept_chunks);
  CHECK(plan.kept_activation_layers == tight.kept_layers);
  CHECK(std::memcmp(&tight.loss, &always.loss, sizeof(double)) == 0);
  CHECK(std::memcmp(tight.grads.data(), always.grads.data(), always.grads.size() * sizeof(float)) == 0);
}

}  // namespace strata
