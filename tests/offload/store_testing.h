// What the host-store tests (the NVMe placement, its RAM/NVMe split) read back and feed alike.
#pragma once
#include <vector>

#include "models/micro_batch.h"
#include "offload/state/host_store.h"
#include "tests/testing.h"

namespace strata::testing {

// Array `a` of the store's optimizer state (master, m or v), every row in order, as f32.
inline std::vector<float> state_array(const HostStore& store, StateArray a) {
  std::vector<float> out;
  for (size_t r = 0; r < store.spec().params.size(); ++r) {
    std::vector<float> row(size_t(store.f32_table()[r].numel()));
    store.read_state(a, r, 0, int64_t(row.size()), row.data());
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}

// Micro-batch `a` of step `step`: 2 rows of T tokens of a 300-token vocabulary, a different
// stride per step and micro-batch.
inline MicroBatch state_test_batch(int step, int a, int64_t T) {
  return strided_batch(2, T, 300, 37, step * 11 + a * 5);
}

}  // namespace strata::testing
