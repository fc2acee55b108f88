// Updates as gradients land (offload/engine/engine.h, forward_backward_update): with clipping off, the
// last micro-batch's AdamW runs group by group inside backward, and must give exactly what
// forward_backward + optimizer_step gives, for streamed and resident weights, tied or not.
#include <catch2/catch.hpp>
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
      for (size_t s = 0; s < after.norms.size(); ++s)  // summed per group: equal up to rounding
        CHECK(landed.norms[s] == Approx(after.norms[s]).epsilon(1e-12));
    }
}

}  // namespace strata
