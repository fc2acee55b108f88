// The engine-level bit-for-bit tests' rig (tests/offload/test_engine_speculation.cpp,
// test_lean_host_state.cpp): a tiny 3-layer Llama in a HostStore, three training steps of two
// micro-batches through an Engine, a forward on the last weights, then the state read back —
// losses, norms, master, m and v — so two store or engine configurations can be compared to the bit.
#pragma once
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <unistd.h>
#include <vector>

#include "offload/engine/engine.h"
#include "offload/state/model_io.h"
#include "src/recipe/recipe_modes.h"
#include "tests/seeded_inputs.h"
#include "tests/testing.h"

namespace strata::engine_step_rig {

constexpr int kLayers = 3;  // groups: embedding, 3 layers, final norm + lm_head

struct Options {
  HostStoreOptions store;  // its NVMe path and block sizes are the rig's
  DType matrices = DType::bf16;  // f32: the master is the working copy (updated in place)
  const char* weights = "stream";
  bool layer_major = false;  // two micro-batches a pass
  size_t speculate_first = 0, speculate_end = 0;
  double clip = 1.0;
  bool gradients_first = true;  // the trainer's: every gradient before the update, when clipping
  bool norm_pass = false;        // clipping's norm from a first pass (StepWork::norm_pass; layer-major)
  size_t resident_layers = 0;    // with weights "stream": the first layers resident (EngineOptions)
  Device* device = nullptr;      // null: a CPU backend of the rig's own
};

struct Result {
  std::vector<double> losses, norms;
  std::vector<float> master;
  std::vector<char> m, v;  // of the groups whose state is in RAM
  double final_loss = 0;   // a forward on the last step's weights (the working copy the device reads)
  EngineStats stats;
};

inline ModelSpec spec(DType matrices) {
  return model_spec_build(testing::tiny_llama_config({32, 48, kLayers, 300, 64, false}), matrices);
}

// The run; `after` reads whatever else a test compares from the store before it goes.
inline Result run(const Options& o, const std::string& tag,
                  const std::function<void(const HostStore&)>& after = {}) {
  std::unique_ptr<Device> own = o.device ? nullptr : device_create(DeviceOptions{});
  Device* dev = o.device ? o.device : own.get();
  testing::TempDir dir(tag + "_" + std::to_string(::getpid()));  // ctest runs cases side by side
  HostStoreOptions so = o.store;
  so.nvme_path = dir.path.string();
  so.nvme_block_bytes = 4096;
  so.nvme_chunk_bytes = 8192;
  HostStore store(*dev, spec(o.matrices), so);
  model_init_weights(store, 11);
  EngineOptions eo;
  eo.weights = weights_mode_parse(o.weights);
  eo.max_batch = 2;
  eo.max_tokens = 17;
  eo.group = o.layer_major ? 2 : 1;
  eo.resident_layers = o.resident_layers;
  eo.speculate_first_group = o.speculate_first;
  eo.speculate_end_group = o.speculate_end;
  Engine engine(*dev, store, eo);
  Result r;
  for (int step = 1; step <= 3; ++step) {
    std::vector<MicroBatch> mbs;
    for (int a = 0; a < 2; ++a) mbs.push_back(testing::strided_batch(2, 17, 300, 37, step * 11 + a * 5));
    StepWork w;
    w.micro = &mbs;
    w.counted = mbs[0].counted() + mbs[1].counted();
    w.step = step;
    w.hyper.lr = 2e-3;
    w.hyper.step = step;
    w.max_grad_norm = o.clip;
    w.weight_decay = 0.01;
    w.gradients_first = o.gradients_first;
    w.norm_pass = o.norm_pass;
    const StepOutcome out = engine.train_step(w);
    r.losses.insert(r.losses.end(), out.losses.begin(), out.losses.end());
    r.norms.push_back(out.grad_norm);
  }
  r.final_loss = engine.forward_loss(testing::strided_batch(2, 17, 300, 37, 99));
  engine.synchronize();
  r.stats = engine.stats();
  for (size_t row = 0; row < store.spec().params.size(); ++row) {
    std::vector<float> v(size_t(store.f32_table()[row].numel()));
    store.get_param(row, v.data());
    r.master.insert(r.master.end(), v.begin(), v.end());
  }
  const size_t ram_floats = (so.state_on_nvme && so.nvme_first_group > 0
                                 ? f32_prefix_bytes(HostStore::layout(store.spec()), so.nvme_first_group) / 4
                                 : store.f32_floats());
  const size_t ram_bytes = ram_floats * dtype_size(so.moments);
  r.m.assign(static_cast<const char*>(store.m()), static_cast<const char*>(store.m()) + ram_bytes);
  r.v.assign(static_cast<const char*>(store.v()), static_cast<const char*>(store.v()) + ram_bytes);
  if (after) after(store);
  return r;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

}  // namespace strata::engine_step_rig
