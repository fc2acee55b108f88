// The optimizer step's seams:
//   - StatePlacement (offload/state_placement.h): where a group's fp32 master, m and v live.
//     RamStatePlacement here (the host store's arrays; every call free); NvmeStatePlacement in
//     offload/nvme_state.h (files, pipelined read-ahead and write-back). The host store owns
//     the one its options choose.
//   - GroupOptimizer: updates one parameter group from its accumulated gradient, writes the
//     new working copy the device reads, and consumes (zeroes) the gradient. The engine runs it
//     on its host queue, group by group. Today: AdamW (offload/adamw.h). Next: ZO-SGD.
#pragma once
#include <cstddef>

#include "offload/adamw.h"
#include "offload/host_store.h"
#include "offload/state_placement.h"

namespace strata {

class RamStatePlacement final : public StatePlacement {
 public:
  explicit RamStatePlacement(HostStore& store) : store_(store) {}
  std::vector<StateRange> ranges(size_t group) const override;
  GroupState acquire(size_t group, size_t range) override;
  void release(size_t, size_t) override {}
  void read(StateArray a, size_t offset, void* dst, size_t bytes) override;
  void write(StateArray a, size_t offset, const void* src, size_t bytes) override;
  bool in_ram(StateArray) const override { return true; }

 private:
  float* array(StateArray a) const;
  HostStore& store_;
};

class GroupOptimizer {
 public:
  virtual ~GroupOptimizer() = default;
  // hyper: this step's hyperparameters (step, lr, clip scale); weight_decay applies to matrices.
  virtual void update(size_t group, const AdamWParams& hyper, double weight_decay) = 0;
};

// AdamW over the placement's ranges of a group: each range's rows (or the parts of rows it
// holds) are updated in place; the update is elementwise, so how a group is cut into ranges
// changes no bit of the result. In f32 compute mode the master is the working copy and is
// updated in place (no second write).
class HostAdamW final : public GroupOptimizer {
 public:
  HostAdamW(HostStore& store, StatePlacement& placement) : store_(store), placement_(placement) {}
  void update(size_t group, const AdamWParams& hyper, double weight_decay) override;

 private:
  HostStore& store_;
  StatePlacement& placement_;
};

}  // namespace strata
