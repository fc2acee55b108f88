// The engine's device footprint does not grow with depth: with weights streamed and
// checkpoints on the host, a 4-layer and a 32-layer model have the same device high-water mark.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "offload/engine/engine.h"
#include "src/recipe/recipe_modes.h"
#include "offload/state/model_io.h"
#include "tests/testing.h"
#include "src/core/align.h"
#include "tests/seeded_inputs.h"

namespace strata {

static size_t device_peak_for(int64_t layers, const std::string& checkpoints) {
  auto dev = device_create(DeviceOptions{});
  HostStore store(*dev, model_spec_build(testing::tiny_llama_config({64, 96, layers, 97, 256, false}), DType::bf16));
  model_init_weights(store, 3);
  EngineOptions eo;
  eo.weights = WeightsMode::stream;
  eo.checkpoints = checkpoint_mode_parse(checkpoints);
  eo.recompute = RecomputeMode::always;  // one layer's activations at a time: depth must cost nothing more
  eo.max_batch = 2;
  eo.max_tokens = 33;
  Engine engine(*dev, store, eo);
  const MicroBatch mb = testing::strided_batch(2, 33, 97, 1);
  engine.forward_backward(mb, 1.f / float(mb.counted()));
  AdamWParams ap;
  engine.optimizer_step(ap, 1.0, 0.0);
  engine.forward_backward(mb, 1.f / float(mb.counted()));
  engine.synchronize();
  return dev->peak_bytes();
}

TEST_CASE("the device high-water mark is the same at 4 and at 32 layers", "[engine]") {
  const size_t shallow = device_peak_for(4, "host"), deep = device_peak_for(32, "host");
  CHECK(shallow == deep);
  // with checkpoints kept on the device, depth costs exactly one (N, C) f32 buffer per layer
  const size_t act = align_up(2 * 33 * 64 * 4);
  CHECK(device_peak_for(32, "device") - device_peak_for(4, "device") == 28 * act);
}

}  // namespace strata
