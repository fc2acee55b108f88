// offload.recompute: a layer whose forward activations stay on the device skips the backward's
// recompute. The recompute is deterministic, so keeping them must give the same bits: losses,
// every gradient and the weights after optimizer steps, in f32 and bf16, streamed and resident,
// with every layer kept ("never"), none ("always") and some ("auto" under a budget that holds
// part of them), over micro-batches of two shapes (the second shorter than the capacity).
#include <catch2/catch.hpp>
#include <cstring>

#include "models/decoder_layer.h"
#include "offload/engine/engine.h"
#include "src/recipe/recipe_modes.h"
#include "offload/state/model_io.h"
#include "src/device/arena.h"
#include "tests/seeded_inputs.h"
#include "tests/testing.h"

namespace strata {
namespace {

struct RecomputeRun {
  std::vector<double> losses;
  std::vector<float> grads;    // after the last micro-batch, before its optimizer step
  std::vector<char> working;   // the weights after every step
  size_t kept_layers = 0;
  size_t device_used = 0;
};

constexpr int64_t kLayers = 4, kB = 2, kT = 33, kV = 97;

RecomputeRun run_steps(DType dtype, const std::string& weights, const std::string& recompute, size_t kept_budget_layers) {
  // The budget: what the "always" engine needs, plus room for kept_budget_layers layers' activations.
  EngineOptions eo;
  eo.weights = weights_mode_parse(weights);
  eo.checkpoints = CheckpointMode::device;
  eo.recompute = recompute_mode_parse(recompute);
  eo.max_batch = kB;
  eo.max_tokens = kT;
  const ModelSpec spec = model_spec_build(testing::tiny_llama_config({64, 96, kLayers, kV, 256, false}), dtype);
  size_t budget = 512ull << 20;
  if (recompute == "auto") {
    EngineOptions probe = eo;
    probe.recompute = RecomputeMode::always;
    auto dev = device_create(DeviceOptions{});
    HostStore store(*dev, spec);
    const size_t base = [&] {
      Engine e(*dev, store, probe);
      return dev->used_bytes();
    }();
    const EngineShape shape = EngineShape::of(spec, HostStore::layout(spec), eo);
    budget = base + (size_t(1) << 20) + kept_budget_layers * Arena::footprint(layer_activation_bytes(shape.layer_capacity)) + 100;
  }
  DeviceOptions dopt;
  dopt.memory_bytes = budget;
  auto dev = device_create(dopt);
  HostStore store(*dev, spec);
  model_init_weights(store, 7);
  Engine engine(*dev, store, eo);
  RecomputeRun r;
  r.kept_layers = engine.kept_activation_layers();
  r.device_used = dev->used_bytes();
  AdamWParams ap;
  ap.lr = 1e-2f;
  const MicroBatch full = testing::strided_batch(kB, kT, kV, 3), shorter = testing::strided_batch(1, 17, kV, 5, 11);
  for (int step = 0; step < 3; ++step) {
    r.losses.push_back(engine.forward_backward(full, 1.f / float(full.counted())));
    r.losses.push_back(engine.forward_backward(shorter, 1.f / float(shorter.counted())));
    if (step == 2) {
      engine.synchronize();
      r.grads.assign(store.grad(), store.grad() + store.f32_floats());
    }
    engine.optimizer_step(ap, 1.0, 0.01);
  }
  r.losses.push_back(engine.forward_loss(full));
  engine.synchronize();
  const size_t working_bytes = HostStore::layout(spec).working.tier_bytes(Tier::host_pinned);
  r.working.assign(store.working(), store.working() + working_bytes);
  return r;
}

}  // namespace

TEST_CASE("kept activations give the recompute's bits: losses, gradients, weights", "[engine][recompute]") {
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (const std::string weights : {"stream", "device"}) {
      INFO(dtype_name(dtype) << " " << weights);
      const RecomputeRun always = run_steps(dtype, weights, "always", 0);
      CHECK(always.kept_layers == 0);
      const RecomputeRun never = run_steps(dtype, weights, "never", 0);
      CHECK(never.kept_layers == kLayers);
      const RecomputeRun some = run_steps(dtype, weights, "auto", 2);  // room for 2 of the 4 layers
      CHECK(some.kept_layers == 2);
      CHECK(never.device_used > some.device_used);
      CHECK(some.device_used > always.device_used);
      for (const RecomputeRun* r : {&never, &some}) {
        INFO("kept layers " << r->kept_layers);
        REQUIRE(r->losses.size() == always.losses.size());
        for (size_t k = 0; k < r->losses.size(); ++k) CHECK(r->losses[k] == always.losses[k]);  // bit-identical
        REQUIRE(r->grads.size() == always.grads.size());
        CHECK(std::memcmp(r->grads.data(), always.grads.data(), r->grads.size() * 4) == 0);
        REQUIRE(r->working.size() == always.working.size());
        CHECK(std::memcmp(r->working.data(), always.working.data(), r->working.size()) == 0);
      }
      CHECK(always.losses.back() != always.losses.front());  // the steps moved the weights: not a comparison of nothing
    }
  }
}

TEST_CASE("offload.recompute = \"never\" on a budget too small for the activations is exit 3 naming the bytes",
          "[engine][recompute]") {
  const ModelSpec spec = model_spec_build(testing::tiny_llama_config({64, 96, kLayers, kV, 256, false}), DType::f32);
  EngineOptions eo;
  eo.checkpoints = CheckpointMode::device;
  eo.recompute = RecomputeMode::always;
  eo.max_batch = kB;
  eo.max_tokens = kT;
  size_t base = 0;
  {
    auto dev = device_create(DeviceOptions{});
    HostStore store(*dev, spec);
    Engine e(*dev, store, eo);
    base = dev->used_bytes();
  }
  const EngineShape shape = EngineShape::of(spec, HostStore::layout(spec), eo);
  DeviceOptions dopt;  // room for one layer's activations of the four
  dopt.memory_bytes = base + Arena::footprint(layer_activation_bytes(shape.layer_capacity));
  auto dev = device_create(dopt);
  HostStore store(*dev, spec);
  eo.recompute = RecomputeMode::never;
  try {
    Engine e(*dev, store, eo);
    FAIL("the engine was built");
  } catch (const Error& e) {
    CHECK(e.exit_code() == 3);
    CHECK_THAT(e.what(), Catch::Contains("offload.recompute = \"never\"") && Catch::Contains("raise [device] memory"));
  }
  CHECK(dev->used_bytes() == 0);  // nothing it allocated stays
  // a mode the recipe does not know is refused where the recipe's strings are parsed, once
  CHECK_THROWS_WITH(recompute_mode_parse("sometimes"), Catch::Contains("offload.recompute must be \"auto\", \"always\" or \"never\""));
}

}  // namespace strata
