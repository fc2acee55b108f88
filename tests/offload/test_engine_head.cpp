// The lm_head streamed in vocab chunks (offload/engine/engine.h): the device footprint of the head
// does not grow with V, the chunked loss and gradients agree with one whole-vocabulary chunk
// within f32 rounding, streamed and resident heads are bit-identical (also across an optimizer
// step and across thread counts), and the torch goldens still hold with many small chunks.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "src/recipe/recipe_modes.h"
#include "offload/engine/engine.h"
#include "offload/state/model_io.h"
#include "src/core/threads.h"
#include "tests/testing.h"
#include "tests/seeded_inputs.h"

namespace strata {
namespace {

ModelConfig head_config(int64_t vocab, bool tied) {
  return testing::tiny_llama_config({64, 96, 2, vocab, 256, tied});
}

// ids spread over the whole vocabulary, so every chunk has targets
MicroBatch head_batch(int64_t vocab) { return testing::strided_batch(2, 33, vocab, 7919); }

struct HeadRun {
  std::vector<double> losses;
  std::vector<float> grads, master;
  TensorTable table;
  size_t device_peak = 0;
  size_t kept_layers = 0, kept_chunks = 0;  // offload.recompute: activations and lm_head logits kept
};

// forward_backward, an optimizer step, forward_backward and forward_loss again: the losses, the
// gradients of the second step and the master weights after the update.
HeadRun run_head(const ModelConfig& cfg, DType dtype, const std::string& weights, int64_t head_chunk_rows = 0,
                 const std::string& recompute = "auto", size_t device_bytes = DeviceOptions{}.memory_bytes) {
  DeviceOptions dopt;
  dopt.memory_bytes = device_bytes;
  auto dev = device_create(dopt);
  HostStore store(*dev, model_spec_build(cfg, dtype));
  model_init_weights(store, 3);
  EngineOptions eo;
  eo.weights = weights_mode_parse(weights);
  eo.checkpoints = CheckpointMode::host;
  eo.max_batch = 2;
  eo.max_tokens = 33;
  eo.head_chunk_rows = head_chunk_rows;
  eo.recompute = recompute_mode_parse(recompute);
  Engine engine(*dev, store, eo);
  const MicroBatch mb = head_batch(cfg.vocab_size);
  HeadRun r;
  const float scale = 1.f / float(mb.counted());
  r.losses.push_back(engine.forward_backward(mb, scale));
  AdamWParams ap;
  ap.lr = 1e-3f;
  engine.optimizer_step(ap, 1.0, 0.0);
  r.losses.push_back(engine.forward_backward(mb, scale));
  r.losses.push_back(engine.forward_loss(mb));
  engine.synchronize();
  r.grads.assign(store.grad(), store.grad() + store.f32_floats());
  r.master.assign(store.master(), store.master() + store.f32_floats());
  r.table = store.f32_table();
  r.device_peak = dev->peak_bytes();
  r.kept_layers = engine.kept_activation_layers();
  r.kept_chunks = engine.kept_logit_chunks();
  return r;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

// Worst per-tensor relative error of got against want (same layout).
double worst_tensor_error(const TensorTable& table, const std::vector<float>& got, const std::vector<float>& want) {
  double worst = 0;
  for (auto& row : table.rows()) {
    const size_t at = row.offset / 4, n = size_t(row.numel());
    worst = std::max(worst, testing::max_rel_error(std::vector<float>(got.begin() + long(at), got.begin() + long(at + n)),
                                                   std::vector<float>(want.begin() + long(at), want.begin() + long(at + n))));
  }
  return worst;
}

}  // namespace

TEST_CASE("a large vocabulary's lm_head is streamed in chunks: the device peak does not scale with V", "[engine][head]") {
  const int64_t V = 50000, C = 64;
  for (bool tied : {false, true}) {
    INFO((tied ? "tied" : "untied"));
    // recompute = "always": no logits kept (those scale with V by design, as the budget allows)
    const HeadRun large = run_head(head_config(V, tied), DType::bf16, "stream", 0, "always");
    const HeadRun medium = run_head(head_config(9000, tied), DType::bf16, "stream", 0, "always");
    std::printf("lm_head streamed, %s, V %ld C %ld bf16: device peak %zu bytes (V x C x (2 + 4) = %ld)\n",
                tied ? "tied" : "untied", long(V), long(C), large.device_peak, long(V * C * 6));
    // Resident, the bf16 weights and f32 gradient of lm_head alone would be V x C x 6 = 19.2 MB.
    CHECK(large.device_peak * 4 < size_t(V * C * 6));
    // Both vocabularies need more than one 4096-row chunk: the same slots, the same peak.
    CHECK(large.device_peak == medium.device_peak);
    CHECK(std::isfinite(large.losses[0]));
  }
}

TEST_CASE("vocab-chunked loss and gradients match one whole-vocabulary chunk within f32 rounding", "[engine][head]") {
  for (bool tied : {false, true}) {
    INFO((tied ? "tied" : "untied"));
    const ModelConfig cfg = head_config(50000, tied);
    const HeadRun chunked = run_head(cfg, DType::f32, "stream");            // 13 chunks of <= 4096 rows
    const HeadRun whole = run_head(cfg, DType::f32, "stream", 50000);        // one chunk: the fused kernel's math
    for (size_t i = 0; i < whole.losses.size(); ++i)
      CHECK(std::abs(chunked.losses[i] - whole.losses[i]) <= 1e-6 * std::abs(whole.losses[i]));
    // dh sums 50,000 logits' terms in one GEMM or in 13 chunk sums: f32 rounding of such a sum
    // grows like sqrt(V) 2^-24 (~1.3e-5 relative), carried back through the layers. Measured:
    // ~1e-5 to 1.6e-5 as other kernels' rounding moved (the attention kernel's FMAs); a wrong
    // chunk (a row or a chunk dropped, counted twice, misweighted) is off by O(1).
    const double err = worst_tensor_error(whole.table, chunked.grads, whole.grads);
    INFO("worst per-tensor gradient error " << err);
    CHECK(err <= 5e-5);
    CHECK(err > 0);  // a different summation order: not the same arithmetic
  }
}

TEST_CASE("streamed and resident lm_head chunks are bit-identical, across an optimizer step and thread counts", "[engine][head]") {
  for (bool tied : {false, true}) {
    INFO((tied ? "tied" : "untied"));
    const ModelConfig cfg = head_config(20000, tied);  // 5 chunks: slots reused and refilled
    const HeadRun resident = run_head(cfg, DType::bf16, "device");
    const HeadRun streamed = run_head(cfg, DType::bf16, "stream");
    CHECK(std::memcmp(resident.losses.data(), streamed.losses.data(), resident.losses.size() * sizeof(double)) == 0);
    CHECK(same_bits(resident.grads, streamed.grads));
    CHECK(same_bits(resident.master, streamed.master));
    cpu_threads_set(1);
    const HeadRun one_thread = run_head(cfg, DType::bf16, "stream");
    cpu_threads_set(2);
    const HeadRun two_threads = run_head(cfg, DType::bf16, "stream");
    cpu_threads_set(0);
    CHECK(std::memcmp(one_thread.losses.data(), two_threads.losses.data(), one_thread.losses.size() * sizeof(double)) == 0);
    CHECK(same_bits(one_thread.grads, two_threads.grads));
    CHECK(same_bits(one_thread.grads, streamed.grads));
  }
}

TEST_CASE("kept lm_head logits: the backward reads the stats pass's logits, bit for bit a recompute", "[engine][head][recompute]") {
  // 13 chunks (12 of 4096 rows and one of 848); each kept chunk holds the 66 tokens' logits
  const size_t chunk_bytes = size_t(66 * 4096 + 64 - 1) / 64 * 64 * sizeof(float);
  for (bool tied : {false, true})
    for (DType dtype : {DType::f32, DType::bf16})
      for (const std::string weights : {"stream", "device"}) {
        INFO((tied ? "tied " : "untied ") << dtype_name(dtype) << " weights " << weights);
        const ModelConfig cfg = head_config(50000, tied);
        const HeadRun always = run_head(cfg, dtype, weights, 0, "always");
        const HeadRun all = run_head(cfg, dtype, weights, 0, "auto");
        CHECK(always.kept_chunks == 0);
        CHECK(all.kept_chunks == 13);
        CHECK(all.kept_layers == 2);
        // the activations first, then 13 chunks of logits
        const size_t activations = all.device_peak - always.device_peak - 13 * chunk_bytes;
        // a budget that leaves room for the activations and 5 chunks: the last 5 (the backward's first)
        const size_t budget = always.device_peak + (size_t(1) << 20) + activations + 5 * chunk_bytes + 100;
        const HeadRun some = run_head(cfg, dtype, weights, 0, "auto", budget);
        CHECK(some.kept_layers == 2);
        CHECK(some.kept_chunks == 5);
        for (const HeadRun* r : {&all, &some}) {
          CHECK(std::memcmp(always.losses.data(), r->losses.data(), always.losses.size() * sizeof(double)) == 0);
          CHECK(same_bits(always.grads, r->grads));
          CHECK(same_bits(always.master, r->master));
        }
      }
}

TEST_CASE("the torch goldens still hold with lm_head in many small chunks", "[engine][head][golden]") {
  // The tolerances of tests/models/test_golden_grad.cpp (f32 vs fp64 torch): loss 2e-6, gradients
  // 2e-5 of each tensor's max. 7-row chunks over vocabularies of 61 to 97 rows: 9 to 14 chunks,
  // an uneven last one; llama's lm_head is its tied embedding.
  for (const char* name : {"llama", "mistral", "qwen2", "qwen3"}) {
    INFO(name);
    auto dev = device_create(DeviceOptions{});
    const testing::Golden g = testing::Golden::load(name);
    EngineOptions eo;
    eo.weights = WeightsMode::stream;
    eo.checkpoints = CheckpointMode::host;
    eo.head_chunk_rows = 7;
    const testing::GoldenStep r = testing::golden_step(*dev, g, DType::f32, eo);
    CHECK(std::abs(r.loss - g.loss) <= 2e-6 * std::abs(g.loss));
    const auto errors = testing::tensor_errors(r.table, r.grads, g.grads(r.table, r.grads.size()));
    for (const auto& e : errors) {
      INFO(e.name);
      CHECK(e.error <= 2e-5);
    }
    const auto worst = testing::worst_tensor_error(errors);
    std::printf("golden %-8s f32, lm_head in 7-row chunks: loss %.9f (want %.9f) worst grad rel err %.2e (%s)\n", name,
                r.loss, g.loss, worst.error, worst.name.c_str());
  }
}

}  // namespace strata
