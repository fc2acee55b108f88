// Two seams of the optimizer step, each with one implementation today:
//   - StatePlacement: where a parameter group's fp32 optimizer state (master weights, m, v)
//     lives. acquire() makes a group's state addressable, release() puts it back.
//     Today: RAM (the host store's arrays; both calls are free). Next: NVMe (read on acquire,
//     written back on release, pipelined across groups).
//   - GroupOptimizer: updates one parameter group from its accumulated gradient, writes the
//     new working copy the device reads, and consumes (zeroes) the gradient. The engine runs it
//     on its host queue, group by group. Today: AdamW (offload/adamw.h). Next: AdamW over
//     NVMe-placed state, ZO-SGD.
#pragma once
#include <cstddef>

#include "offload/adamw.h"
#include "offload/host_store.h"

namespace strata {

// A group's fp32 state: each array starts at the group's first f32-table row, so row r is at
// (f32_table[r].offset - group.f32_offset) bytes.
struct GroupState {
  float* master = nullptr;
  float* m = nullptr;
  float* v = nullptr;
};

class StatePlacement {
 public:
  virtual ~StatePlacement() = default;
  virtual GroupState acquire(size_t group) = 0;
  virtual void release(size_t group) = 0;
};

class RamStatePlacement final : public StatePlacement {
 public:
  explicit RamStatePlacement(HostStore& store) : store_(store) {}
  GroupState acquire(size_t group) override;
  void release(size_t) override {}

 private:
  HostStore& store_;
};

class GroupOptimizer {
 public:
  virtual ~GroupOptimizer() = default;
  // hyper: this step's hyperparameters (step, lr, clip scale); weight_decay applies to matrices.
  virtual void update(size_t group, const AdamWParams& hyper, double weight_decay) = 0;
};

class HostAdamW final : public GroupOptimizer {
 public:
  HostAdamW(HostStore& store, StatePlacement& placement) : store_(store), placement_(placement) {}
  void update(size_t group, const AdamWParams& hyper, double weight_decay) override;

 private:
  HostStore& store_;
  StatePlacement& placement_;
};

}  // namespace strata
