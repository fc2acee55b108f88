// The zeroth-order step under both schedules (offload/engine/engine_zo.h), for the CPU backend's
// tests (tests/offload/test_engine_zo.cpp) and the emulated CUDA backend's
// (tests/cuda/test_cuda_zo_engine.cpp): `steps` steps of zo_step_run on a fresh copy of a model,
// the step's q x k dual forwards run `group` at a time (1: one at a time; q x k: layer-major), and
// what each gave — the outcomes, the weights after, and the weight bytes each step moved: its
// host-to-device bytes less the tokens and the embedding outputs, which both schedules send per
// micro-batch and pass.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "models/micro_batch.h"
#include "models/model_spec.h"
#include "offload/engine/engine_zo.h"
#include "offload/state/host_store.h"
#include "offload/state/model_io.h"
#include "src/device/device.h"
#include "tests/seeded_inputs.h"

namespace strata::testing {

struct ZoScheduleRun {
  std::vector<ZoStepOutcome> steps;
  std::vector<float> master;        // the f32 master after the steps
  std::vector<char> working;        // the working copy after the steps
  std::vector<size_t> weight_h2d;   // per step: h2d bytes less tokens and embedding outputs
  size_t W = 0;                     // ZoEngine::weight_link_bytes: the weights of one run
  size_t device_bytes = 0;          // what the engine allocated on the device
};

// B rows of T tokens over a vocabulary of V (the last position of each row unlabelled); packed:
// several documents per row (document starts, positions within each document).
inline MicroBatch zo_test_batch(int64_t B, int64_t T, int64_t V, bool packed, uint64_t seed) {
  MicroBatch mb;
  mb.B = B;
  mb.T = T;
  if (packed) mb.doc_start = make_doc_start(B, T, 7, seed);
  for (int64_t i = 0; i < B * T; ++i) {
    mb.ids.push_back(int32_t((i * 7 + int64_t(seed)) % V));
    mb.targets.push_back(i % T == T - 1 ? -100 : int32_t((i * 7 + 3) % V));
    mb.pos.push_back(int32_t(i % T) - (packed ? mb.doc_start[size_t(i)] : 0));
  }
  return mb;
}

// k (at most 3) micro-batches of awkward, unequal shapes, the second packed, the third shorter.
inline std::vector<MicroBatch> zo_uneven_batches(size_t k, int64_t V) {
  std::vector<MicroBatch> all = {zo_test_batch(2, 17, V, false, 0), zo_test_batch(2, 13, V, true, 5),
                                 zo_test_batch(1, 9, V, false, 2)};
  all.resize(k);
  return all;
}

// The bytes engine_tokens_upload sends for a micro-batch: ids, targets, positions (and document starts).
inline size_t zo_token_bytes(const MicroBatch& mb) { return (mb.doc_start.empty() ? 3 : 4) * mb.ids.size() * 4; }

inline ZoScheduleRun zo_schedule_run(Device& dev, const ModelSpec& spec, uint64_t init_seed,
                                     const std::vector<MicroBatch>& micro, int q, int64_t group, int steps,
                                     int64_t head_chunk_rows = 0) {
  HostStoreOptions so;
  so.needs = HostZoSgd::kState;
  HostStore store(dev, spec, so);
  model_init_weights(store, init_seed);
  EngineOptions eo;
  for (const MicroBatch& mb : micro) eo.max_batch = std::max(eo.max_batch, mb.B), eo.max_tokens = std::max(eo.max_tokens, mb.T);
  eo.checkpoints = CheckpointMode::host;
  eo.head_chunk_rows = head_chunk_rows;
  eo.group = group;
  const size_t used = dev.used_bytes();
  ZoEngine engine(dev, store, eo);
  ZoScheduleRun out;
  out.W = engine.weight_link_bytes();
  out.device_bytes = dev.used_bytes() - used;
  int64_t counted = 0;
  for (const MicroBatch& mb : micro) counted += mb.counted();
  // what a step sends besides weights: each run's micro-batches' tokens, each pass's embedding output
  const size_t pairs = size_t(q) * micro.size(), C = size_t(spec.config.hidden_size);
  size_t extra = 0;
  for (size_t first = 0; first < pairs; first += size_t(group)) {
    const size_t end = std::min(pairs, first + size_t(group));
    std::vector<bool> sent(micro.size(), false);
    for (size_t i = first; i < end; ++i) {
      const MicroBatch& mb = micro[i % micro.size()];
      if (!sent[i % micro.size()]) extra += zo_token_bytes(mb), sent[i % micro.size()] = true;
      extra += 2 * mb.ids.size() * C * sizeof(float);
    }
  }
  const ZoStepOptions options{77, 1e-3, q};
  for (int s = 1; s <= steps; ++s) {
    const DeviceCounters c0 = dev.counters();
    out.steps.push_back(zo_step_run(engine, options, micro, counted, s, 2e-3, 0.01));
    out.weight_h2d.push_back(dev.counters().h2d_bytes - c0.h2d_bytes - extra);
  }
  engine.synchronize();
  out.master.assign(store.master(), store.master() + store.f32_floats());
  size_t working = 0;
  for (const TensorSpec& t : store.working_table().rows()) working = std::max(working, t.offset + t.bytes());
  out.working.assign(store.working(), store.working() + working);
  return out;
}

// Whether two runs gave the same bits: every step's losses and projected gradients, the weights.
inline bool zo_schedule_runs_equal(const ZoScheduleRun& a, const ZoScheduleRun& b) {
  if (a.steps.size() != b.steps.size()) return false;
  for (size_t s = 0; s < a.steps.size(); ++s)
    if (a.steps[s].loss_plus != b.steps[s].loss_plus || a.steps[s].loss_minus != b.steps[s].loss_minus ||
        a.steps[s].projected != b.steps[s].projected)
      return false;
  return a.master == b.master && a.working == b.working;
}

}  // namespace strata::testing
