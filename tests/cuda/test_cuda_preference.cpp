// The CUDA backend's preference head ops (kernels/cuda/cross_entropy.cu: per-sequence log-prob
// sums, the per-token weighted chunk backward) against their CPU twins on the same seeded inputs,
// a DPO step of the streaming engine on CUDA against the CPU backend, and a layer-major DPO pass
// against the micro-batch schedule.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "kernels/cpu/ops.h"
#include "offload/engine/engine.h"
#include "offload/state/model_io.h"
#include "offload/objective/preference_head.h"
#include "tests/cuda/cuda_testing.h"
#include "tests/testing.h"

namespace strata {
namespace {

struct StepOut {
  double loss = 0;
  std::vector<PreferencePair> pairs;
  std::vector<float> grads;
};

StepOut dpo_step(Device& dev, const std::string& family) {
  const std::string model = testing::source_path("tests/golden/" + family);
  std::ifstream in(testing::source_path("tests/golden/preference/" + family + "/batch.json"));
  const nlohmann::json b = nlohmann::json::parse(in);
  auto rows = [](const nlohmann::json& j) {
    std::vector<std::vector<int32_t>> r;
    for (auto& x : j) r.push_back(x.get<std::vector<int32_t>>());
    return r;
  };
  PreferenceLayout layout;
  const MicroBatch mb = preference_micro_batch(rows(b["chosen_input_ids"]), rows(b["chosen_labels"]),
                                               rows(b["rejected_input_ids"]), rows(b["rejected_labels"]), &layout);
  layout.ref_chosen = b["ref_chosen_logps"].get<std::vector<double>>();
  layout.ref_rejected = b["ref_rejected_logps"].get<std::vector<double>>();
  layout.totals = preference_layout_totals(mb, layout);
  HostStore store(dev, model_spec_build(hf_config_load(model), DType::f32));
  model_load_weights(store, model);
  EngineOptions eo;
  eo.weights = WeightsMode::stream;
  eo.checkpoints = CheckpointMode::host;
  eo.head_chunk_rows = 16;  // several vocab chunks
  eo.max_batch = mb.B;
  eo.max_tokens = mb.T;
  Engine engine(dev, store, eo);
  PreferenceParams params;
  params.beta = 0.3;
  auto owned = std::make_unique<PreferenceHead>(dev, params, mb.B * mb.T);
  PreferenceHead* head = owned.get();
  head->set_layout(layout);
  engine.set_loss_objective(std::move(owned));
  StepOut r;
  r.loss = engine.forward_backward(mb, 1.f);
  engine.synchronize();
  r.pairs = head->pairs();
  r.grads.assign(store.grad(), store.grad() + store.f32_floats());
  return r;
}

}  // namespace

TEST_CASE("cuda preference head ops match the CPU twins", "[cuda-emu]") {
  auto dev = cuda_testing::test_device();
  if (!dev) return;
  // 130 rows cross the 128-row tile; sequences of 9 rows, every 7th row without one
  const int64_t n = 130, c = 8, v = 71, rows = 16, S = (n + 8) / 9;
  const auto h = random_floats(size_t(n * c), 81, -2.f, 2.f);
  const auto w = random_floats(size_t(v * c), 82, -1.f, 1.f);
  std::vector<int32_t> targets(static_cast<size_t>(n)), seq(static_cast<size_t>(n));
  std::vector<float> weight(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    targets[size_t(i)] = (i % 5 == 3) ? -100 : int32_t((i * 13) % v);
    seq[size_t(i)] = i % 7 == 3 ? -1 : int32_t(i / 9);
    weight[size_t(i)] = float(std::cos(double(i)) * 0.6);
  }
  for (DType wt : {DType::f32, DType::bf16}) {
    INFO(dtype_name(wt));
    const auto wb = testing::to_bf16(w);
    // the CPU twins
    std::vector<double> stats(size_t(3 * n));
    const int64_t chunks = (v + rows - 1) / rows;
    for (int64_t k = 0; k < chunks; ++k) {
      const int64_t v0 = k * rows, vc = std::min(rows, v - v0);
      if (wt == DType::bf16)
        cpu::lm_head_ce_chunk_stats_bf16(stats.data(), h.data(), wb.data() + v0 * c, targets.data(), n, c, v, v0, vc, k == 0, nullptr);
      else
        cpu::lm_head_ce_chunk_stats(stats.data(), h.data(), w.data() + v0 * c, targets.data(), n, c, v, v0, vc, k == 0, nullptr);
    }
    std::vector<double> want_sums(size_t(2 * S));
    cpu::lm_head_ce_stats_seq_sums(want_sums.data(), stats.data(), targets.data(), seq.data(), n, v, S);
    std::vector<float> want_dh(size_t(n * c), 0.f), want_dw(size_t(v * c), 0.f);
    for (int64_t k = chunks - 1; k >= 0; --k) {
      const int64_t v0 = k * rows, vc = std::min(rows, v - v0);
      if (wt == DType::bf16)
        cpu::lm_head_ce_chunk_backward_weighted_bf16(want_dh.data(), want_dw.data() + v0 * c, h.data(), wb.data() + v0 * c,
                                                     stats.data(), targets.data(), weight.data(), n, c, v, v0, vc, 0.7f, nullptr);
      else
        cpu::lm_head_ce_chunk_backward_weighted(want_dh.data(), want_dw.data() + v0 * c, h.data(), w.data() + v0 * c,
                                                stats.data(), targets.data(), weight.data(), n, c, v, v0, vc, 0.7f, nullptr);
    }
    // the device: the same stats (from the device's own stats pass), chunks in their own buffers
    Buffer<float> bh(*dev, h), bdh(*dev, std::vector<float>(size_t(n * c), 0.f)), bweight(*dev, weight);
    Buffer<float> bw(*dev, w), bdw(*dev, std::vector<float>(size_t(v * c), 0.f));
    Buffer<bf16> bwb(*dev, wb);
    Buffer<int32_t> bt(*dev, targets), bseq(*dev, seq);
    Buffer<double> bstats(*dev, size_t(3 * n)), bsums(*dev, std::vector<double>(size_t(2 * S), -5.0));
    auto wp = [&](int64_t v0) -> const void* {
      return wt == DType::bf16 ? static_cast<const void*>(bwb.get() + v0 * c) : bw.get() + v0 * c;
    };
    for (int64_t k = 0; k < chunks; ++k)
      dev->lm_head_ce_chunk_stats(bstats, bh, wp(k * rows), wt, bt, n, c, v, k * rows, std::min(rows, v - k * rows),
                                  k == 0, nullptr, Stream::compute);
    dev->lm_head_ce_stats_seq_sums(bsums, bstats, bt, bseq, n, v, S, Stream::compute);
    for (int64_t k = chunks - 1; k >= 0; --k)
      dev->lm_head_ce_chunk_backward_weighted(bdh, bdw.get() + k * rows * c, bh, wp(k * rows), wt, bstats, bt, bweight,
                                              n, c, v, k * rows, std::min(rows, v - k * rows), 0.7f, nullptr, Stream::compute);
    const auto sums = bsums.download();
    for (size_t q = 0; q < sums.size(); ++q) {
      INFO("sum entry " << q);
      CHECK(std::abs(sums[q] - want_sums[q]) <= 2e-6 * (1 + std::abs(want_sums[q])));
    }
    const double tol = wt == DType::f32 ? 1e-5 : 1e-2;
    CHECK(max_rel_error(bdh.download(), want_dh) <= tol);
    CHECK(max_rel_error(bdw.download(), want_dw) <= tol);
  }
}

namespace {

// The qwen3 golden's pairs as two micro-batches of one step (pairs [0, 2) and [2, 3)), one at a
// time or in one layer-major pass (EngineOptions::group = 2): the losses and the gradients.
std::pair<std::vector<double>, std::vector<float>> dpo_two_micro_batches(Device& dev, bool layer_major) {
  const std::string model = testing::source_path("tests/golden/qwen3");  // an untied lm_head
  std::ifstream in(testing::source_path("tests/golden/preference/qwen3/batch.json"));
  const nlohmann::json b = nlohmann::json::parse(in);
  std::vector<MicroBatch> mbs;
  std::vector<PreferenceLayout> layouts;
  PreferenceStepTotals totals;
  for (auto [first, end] : {std::pair{0, 2}, std::pair{2, 3}}) {
    auto rows = [&](const char* key) {
      std::vector<std::vector<int32_t>> r;
      for (int i = first; i < end; ++i) r.push_back(b[key][size_t(i)].get<std::vector<int32_t>>());
      return r;
    };
    PreferenceLayout layout;
    mbs.push_back(preference_micro_batch(rows("chosen_input_ids"), rows("chosen_labels"), rows("rejected_input_ids"),
                                         rows("rejected_labels"), &layout));
    for (int i = first; i < end; ++i) {
      layout.ref_chosen.push_back(b["ref_chosen_logps"][size_t(i)].get<double>());
      layout.ref_rejected.push_back(b["ref_rejected_logps"][size_t(i)].get<double>());
    }
    const PreferenceStepTotals t = preference_layout_totals(mbs.back(), layout);
    totals.pairs += t.pairs;
    totals.chosen_tokens += t.chosen_tokens;
    layouts.push_back(std::move(layout));
  }
  for (PreferenceLayout& l : layouts) l.totals = totals;
  HostStore store(dev, model_spec_build(hf_config_load(model), DType::f32));
  model_load_weights(store, model);
  EngineOptions eo;
  eo.weights = WeightsMode::stream;
  eo.checkpoints = CheckpointMode::host;
  eo.head_chunk_rows = 16;
  eo.max_batch = std::max(mbs[0].B, mbs[1].B);
  eo.max_tokens = std::max(mbs[0].T, mbs[1].T);
  eo.group = layer_major ? 2 : 1;
  Engine engine(dev, store, eo);
  PreferenceParams params;
  params.beta = 0.3;
  auto owned = std::make_unique<PreferenceHead>(dev, params, eo.max_batch * eo.max_tokens, size_t(eo.group));
  PreferenceHead* head = owned.get();
  engine.set_loss_objective(std::move(owned));
  std::vector<double> losses;
  if (layer_major) {
    head->set_layouts(layouts);
    losses = engine.forward_backward_group(mbs, 1.f);
  } else {
    for (size_t m = 0; m < 2; ++m) head->set_layout(layouts[m]), losses.push_back(engine.forward_backward(mbs[m], 1.f));
  }
  engine.synchronize();
  return {losses, std::vector<float>(store.grad(), store.grad() + store.f32_floats())};
}

}  // namespace

TEST_CASE("cuda engine: a layer-major DPO pass equals the micro-batch schedule bit for bit", "[cuda-emu][layer_major]") {
  auto cuda = cuda_testing::test_device();
  if (!cuda) return;
  const auto mb = dpo_two_micro_batches(*cuda, false), lm = dpo_two_micro_batches(*cuda, true);
  REQUIRE(mb.first.size() == 2);
  CHECK(lm.first == mb.first);
  REQUIRE(lm.second.size() == mb.second.size());
  CHECK(std::memcmp(lm.second.data(), mb.second.data(), mb.second.size() * sizeof(float)) == 0);
  CHECK(mb.first[0] != mb.first[1]);  // two micro-batches with their own pairs and weights
}

TEST_CASE("cuda engine: a DPO step with lm_head in chunks matches the CPU backend", "[cuda-emu]") {
  auto cuda = cuda_testing::test_device();
  if (!cuda) return;
  auto cpu = device_create(DeviceOptions{});
  for (const char* family : {"llama", "qwen3"}) {
    INFO(family);
    const StepOut want = dpo_step(*cpu, family);
    const StepOut got = dpo_step(*cuda, family);
    CHECK(std::abs(got.loss - want.loss) <= 1e-6 * std::abs(want.loss));
    REQUIRE(got.pairs.size() == want.pairs.size());
    for (size_t i = 0; i < got.pairs.size(); ++i) {
      CHECK(std::abs(got.pairs[i].chosen_logp - want.pairs[i].chosen_logp) <= 1e-5 * std::abs(want.pairs[i].chosen_logp));
      CHECK(got.pairs[i].chosen_tokens == want.pairs[i].chosen_tokens);
      CHECK(got.pairs[i].rejected_tokens == want.pairs[i].rejected_tokens);
    }
    CHECK(max_rel_error(got.grads, want.grads) <= 1e-4);
  }
}

}  // namespace strata
