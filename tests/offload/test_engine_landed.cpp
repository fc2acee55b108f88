// Updates as gradients land (offload/engine/engine.h, forward_backward_update): with clipping off, the
// last micro-batch's AdamW runs group by group inside backward, and must give exactly what
// forward_backward + optimizer_step gives, for streamed and resident weights, tied or not.
// With clipping on, the step's last pass gathers each group's squares as its gradient lands
// (forward_backward_last / forward_backward_group_last, what train_step runs): the same norm,
// clip and bits as the norm summed after backward.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "io/hf_config.h"
#include "src/recipe/recipe_modes.h"
#include "offload/engine/engine.h"
#include "offload/state/model_io.h"
#include "tests/testing.h"
#include "tests/seeded_inputs.h"

namespace strata {
namespace {

struct Result {
  std::vector<double> losses, norms;
  std::vector<float> master, m, v;
};

Result run(bool landed, bool tied, const std::string& weights) {
  auto dev = device_create(DeviceOptions{});
  HostStore store(*dev, model_spec_build(testing::tiny_llama_config({32, 48, 3, 300, 64, tied}), DType::bf16));
  model_init_weights(store, 11);
  EngineOptions eo;
  eo.weights = weights_mode_parse(weights);
  eo.max_batch = 2;
  eo.max_tokens = 17;
  Engine engine(*dev, store, eo);
  Result r;
  for (int step = 1; step <= 3; ++step) {
    std::vector<MicroBatch> mbs;
    for (int a = 0; a < 2; ++a)  // two accumulation micro-batches
      mbs.push_back(testing::strided_batch(2, 17, 300, 37, step * 11 + a * 5));
    AdamWParams ap;
    ap.lr = 2e-3f;
    ap.step = step;
    const float scale = 1.f / float(mbs[0].counted() + mbs[1].counted());
    double loss = engine.forward_backward(mbs[0], scale);
    if (landed) {
      loss += engine.forward_backward_update(mbs[1], scale, ap, 0.01);
      r.norms.push_back(engine.landed_update_norm());
    } else {
      loss += engine.forward_backward(mbs[1], scale);
      r.norms.push_back(engine.optimizer_step(ap, 0.0, 0.01));
    }
    r.losses.push_back(loss);
  }
  engine.synchronize();
  r.master.assign(store.master(), store.master() + store.f32_floats());
  const float* m = static_cast<const float*>(store.m());  // f32 moments (the default)
  const float* v = static_cast<const float*>(store.v());
  r.m.assign(m, m + store.f32_floats());
  r.v.assign(v, v + store.f32_floats());
  return r;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

}  // namespace

TEST_CASE("updating as gradients land equals the optimizer step after backward, bit for bit", "[engine]") {
  for (bool tied : {false, true})
    for (const char* weights : {"stream", "device"}) {
      INFO((tied ? "tied " : "untied ") << weights);
      const Result after = run(false, tied, weights), landed = run(true, tied, weights);
      CHECK(landed.losses == after.losses);  // the next steps saw the same updated weights
      CHECK(same_bits(landed.master, after.master));
      CHECK(same_bits(landed.m, after.m));
      CHECK(same_bits(landed.v, after.v));
      CHECK(landed.norms == after.norms);  // both the per-group squares summed in group order
    }
}

namespace {

struct ClipRun {
  bool gathered = false;     // the last pass gathers the norm (train_step) or optimizer_step sums it
  bool layer_major = false;  // the step's 2 micro-batches in one layer-major pass
  double clip = 0;           // optim.max_grad_norm
  bool on_nvme = false;      // the optimizer state in NVMe files
  bool stale_pass = false;   // a gathered pass, then one more forward_backward before the update
};

Result run_clipped(const ClipRun& c, std::vector<double>* reference_norms = nullptr) {
  auto dev = device_create(DeviceOptions{});
  testing::TempDir dir("landed_clip");
  HostStoreOptions so;
  so.state_on_nvme = c.on_nvme;
  so.nvme_path = dir.path.string();
  so.nvme_block_bytes = 4096;
  so.nvme_chunk_bytes = 8192;
  HostStore store(*dev, model_spec_build(testing::tiny_llama_config({32, 48, 3, 300, 64, false}), DType::bf16), so);
  model_init_weights(store, 11);
  EngineOptions eo;
  eo.max_batch = 2;
  eo.max_tokens = 17;
  eo.group = c.layer_major ? 2 : 1;
  Engine engine(*dev, store, eo);
  Result r;
  for (int step = 1; step <= 3; ++step) {
    std::vector<MicroBatch> mbs;
    for (int a = 0; a < 2; ++a) mbs.push_back(testing::strided_batch(2, 17, 300, 37, step * 11 + a * 5));
    AdamWParams ap;
    ap.lr = 2e-3f;
    ap.step = step;
    const float scale = 1.f / float(mbs[0].counted() + mbs[1].counted());
    double loss = 0;
    if (c.stale_pass) {  // the gathered squares miss the second pass's additions: not to be used
      loss += engine.forward_backward_last(mbs[0], scale);
      loss += engine.forward_backward(mbs[1], scale);
    } else if (c.layer_major) {
      for (double l : c.gathered ? engine.forward_backward_group_last(mbs, scale) : engine.forward_backward_group(mbs, scale))
        loss += l;
    } else {
      loss += engine.forward_backward(mbs[0], scale);
      loss += c.gathered ? engine.forward_backward_last(mbs[1], scale) : engine.forward_backward(mbs[1], scale);
    }
    if (reference_norms) {  // an independent fp64 norm of the step's whole gradient
      engine.synchronize();
      double sq = 0;
      for (size_t i = 0; i < store.f32_floats(); ++i) sq += double(store.grad()[i]) * double(store.grad()[i]);
      reference_norms->push_back(std::sqrt(sq));
    }
    r.norms.push_back(engine.optimizer_step(ap, c.clip, 0.01));
    r.losses.push_back(loss);
  }
  engine.synchronize();
  for (size_t row = 0; row < store.spec().params.size(); ++row) {
    std::vector<float> v(size_t(store.f32_table()[row].numel()));
    store.get_param(row, v.data());
    r.master.insert(r.master.end(), v.begin(), v.end());
  }
  if (!c.on_nvme) {
    const float* m = static_cast<const float*>(store.m());
    const float* v = static_cast<const float*>(store.v());
    r.m.assign(m, m + store.f32_floats());
    r.v.assign(v, v + store.f32_floats());
  }
  return r;
}

}  // namespace

TEST_CASE("the clipped step's norm gathered as gradients land equals the norm summed after backward, bit for bit", "[engine]") {
  std::vector<double> reference;
  const Result probe = run_clipped({false, false, 0.0, false, false}, &reference);
  REQUIRE(reference.size() == 3);
  for (size_t s = 0; s < 3; ++s) CHECK(probe.norms[s] == Approx(reference[s]).epsilon(1e-12));  // fp64 twin
  // clipping that triggers every step (below the smallest norm) and that never does (above the largest)
  const double low = 0.5 * *std::min_element(reference.begin(), reference.end());
  const double high = 2 * *std::max_element(reference.begin(), reference.end());
  for (double clip : {low, high})
    for (bool layer_major : {false, true})
      for (bool on_nvme : {false, true}) {
        INFO("clip " << clip << (layer_major ? " layer-major" : " micro-batch") << (on_nvme ? " NVMe" : " RAM"));
        const Result after = run_clipped({false, layer_major, clip, on_nvme, false});
        const Result gathered = run_clipped({true, layer_major, clip, on_nvme, false});
        CHECK(gathered.norms == after.norms);
        CHECK(gathered.losses == after.losses);
        CHECK(same_bits(gathered.master, after.master));
        CHECK(same_bits(gathered.m, after.m));
        CHECK(same_bits(gathered.v, after.v));
        if (layer_major) continue;
        const Result stale = run_clipped({true, false, clip, on_nvme, true});  // recomputed, not reused
        CHECK(stale.norms == after.norms);
        CHECK(same_bits(stale.master, after.master));
      }
  // the two clips did differ: the low one changed the weights the high one left unclipped
  CHECK_FALSE(same_bits(run_clipped({true, false, low, false, false}).master, run_clipped({true, false, high, false, false}).master));
}

}  // namespace strata
