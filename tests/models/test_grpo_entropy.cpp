// GRPO's `entropy` metric through the streaming engine (offload/objective/grpo_head.h): each
// counted token's entropy of softmax(logits / T), which the head reads from its online
// accumulator (Device::lm_head_ce_chunk_stats_entropy), against the entropy computed in fp64
// from the whole distribution: every vocabulary entry's log-probability at that position, scored
// by the reference pass (offload/engine/token_scorer.h, an engine of its own) as the target of a
// row holding the position's prefix, then H = -Σ_v p_v log p_v. On the TRL golden batch
// (tests/golden/grpo, temperature 0.7) of llama and qwen3, lm_head in chunks of 16 vocab rows (the
// running max moves), two micro-batches: qwen3's in one layer-major pass (the head's
// per-micro-batch buffers), tied llama's one a pass. Also the metric's masked mean as GrpoMetricSums carries it.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>

#include "offload/engine/engine.h"
#include "offload/engine/token_scorer.h"
#include "offload/objective/grpo_head.h"
#include "offload/state/model_io.h"
#include "tests/models/grpo_golden.h"
#include "tests/testing.h"

namespace strata {
namespace {

using Rows = std::vector<std::vector<int32_t>>;

Rows rows_of(const nlohmann::json& j, size_t first, size_t count) {
  Rows r;
  for (size_t b = first; b < first + count; ++b) r.push_back(j[b].get<std::vector<int32_t>>());
  return r;
}

// The fp64 entropy at position t of `row` (predicting token t + 1): the V log-probs of every
// candidate next token, each the scored target of the row's prefix [0, t] followed by it.
double entropy_from_all_logps(TokenScorer& scorer, const std::vector<int32_t>& row, size_t t, int64_t V) {
  Rows ids(static_cast<size_t>(V)), mask(static_cast<size_t>(V));
  for (int64_t v = 0; v < V; ++v) {
    ids[size_t(v)].assign(row.begin(), row.begin() + long(t + 1));
    ids[size_t(v)].push_back(int32_t(v));
    mask[size_t(v)].assign(t + 2, 0);
    mask[size_t(v)][t + 1] = 1;
  }
  const MicroBatch mb = grpo_micro_batch(ids, mask);
  const std::vector<double> lp = scorer.token_logps(mb);
  double H = 0, mass = 0;
  for (int64_t v = 0; v < V; ++v) {
    const double l = lp[size_t(v) * size_t(mb.T) + t];
    H -= std::exp(l) * l;
    mass += std::exp(l);
  }
  CHECK(std::abs(mass - 1) < 1e-5);  // the whole distribution
  return H;
}

}  // namespace

TEST_CASE("the GRPO head's per-token entropy equals the fp64 entropy of the whole distribution", "[grpo][models]") {
  auto dev = device_create(DeviceOptions{});
  for (const char* family : {"llama", "qwen3"}) {
    const bool tied = std::string(family) == "llama";  // layer-major passes need an untied lm_head
    const std::string model_dir = testing::source_path(std::string("tests/golden/") + family);
    const nlohmann::json all = grpo_golden::read_cases(family);
    const GrpoParams params = grpo_golden::case_params(all["cases"]["grpo"]);
    REQUIRE(params.temperature != 1);
    HostStore store(*dev, model_spec_build(hf_config_load(model_dir), DType::f32));
    model_load_weights(store, model_dir);
    const int64_t V = store.spec().config.vocab_size;
    // two micro-batches of two rows, one layer-major pass
    const MicroBatch mb0 = grpo_micro_batch(rows_of(all["input_ids"], 0, 2), rows_of(all["completion_mask"], 0, 2));
    const MicroBatch mb1 = grpo_micro_batch(rows_of(all["input_ids"], 2, 2), rows_of(all["completion_mask"], 2, 2));
    EngineOptions eo;
    eo.weights = WeightsMode::stream;
    eo.checkpoints = CheckpointMode::host;
    eo.max_batch = 2;
    eo.max_tokens = std::max(mb0.T, mb1.T);
    eo.head_chunk_rows = 16;
    eo.group = tied ? 1 : 2;
    Engine engine(*dev, store, eo);
    auto owned = std::make_unique<GrpoHead>(*dev, params, eo.max_batch * eo.max_tokens, size_t(eo.group));
    GrpoHead* head = owned.get();
    engine.set_loss_objective(std::move(owned));
    const std::vector<double> adv = all["advantages"].get<std::vector<double>>();
    std::vector<GrpoLayout> layouts(2);
    const MicroBatch* mbs[2] = {&mb0, &mb1};
    for (size_t m = 0; m < 2; ++m) {
      layouts[m].rows = mbs[m]->B;
      layouts[m].cols = mbs[m]->T;
      layouts[m].advantages = {adv[2 * m], adv[2 * m + 1]};
      layouts[m].totals = {2, mb0.counted() + mb1.counted()};
    }
    GrpoTemperature temperature(store, params.temperature);
    std::vector<double> entropies[2];  // per micro-batch, by position
    GrpoMetricSums ms;
    if (tied) {  // one micro-batch a pass
      for (size_t m = 0; m < 2; ++m) {
        head->set_layouts({layouts[m]}, {mbs[m]});
        engine.forward_backward_group({*mbs[m]}, 1.f);
        entropies[m] = head->token_entropies(0);
        ms.add(head->result(0).metrics);
      }
    } else {  // both in one layer-major pass: the head's per-micro-batch buffers
      head->set_layouts(layouts, {&mb0, &mb1});
      engine.forward_backward_group({mb0, mb1}, 1.f);
      for (size_t m = 0; m < 2; ++m) entropies[m] = head->token_entropies(m), ms.add(head->result(m).metrics);
    }
    engine.synchronize();
    TokenScorer scorer(*dev, store, V, eo.max_tokens + 1);  // the norm as the passes saw it: g / T
    double worst = 0, sum = 0;
    int64_t counted = 0;
    for (size_t m = 0; m < 2; ++m) {
      const std::vector<double>& got = entropies[m];
      for (int64_t b = 0; b < 2; ++b) {
        const std::vector<int32_t> row = all["input_ids"][2 * m + size_t(b)].get<std::vector<int32_t>>();
        for (int64_t t = 0; t < mbs[m]->T; ++t) {
          const size_t i = size_t(b * mbs[m]->T + t);
          if (mbs[m]->targets[i] == -100) {
            CHECK(std::isnan(got[i]));
            continue;
          }
          const double want = entropy_from_all_logps(scorer, row, size_t(t), V);
          INFO(family << " micro-batch " << m << " row " << b << " position " << t << " got " << got[i] << " want " << want);
          REQUIRE(want > 0.5);  // a spread distribution, not a trivial one
          CHECK(std::abs(got[i] - want) <= 1e-5 * want);
          worst = std::max(worst, std::abs(got[i] - want) / want);
          sum += got[i];
          ++counted;
        }
      }
    }
    temperature.finish();
    // the metric's sums: the counted tokens' entropies, micro-batch by micro-batch
    CHECK(ms.tokens == counted);
    CHECK(std::abs(ms.entropy - sum) <= 1e-12 * sum);
    std::printf("grpo entropy %-6s %ld tokens, mean %.6f, worst rel err vs the fp64 entropy of all %ld log-probs %.2e\n",
                family, long(counted), sum / double(counted), long(V), worst);
  }
}

}  // namespace strata
