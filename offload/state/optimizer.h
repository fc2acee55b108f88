// The optimizer step's seams:
//   - StatePlacement (offload/state/state_placement.h): where a group's fp32 master, m and v live.
//     RamStatePlacement (offload/state/host_store.h: the store's arrays; every call free); NvmeStatePlacement in
//     offload/state/nvme_state.h (files, pipelined read-ahead and write-back). The host store owns
//     the one its options choose.
//   - GroupOptimizer: updates one parameter group from its accumulated gradient, writes the
//     new working copy the device reads, and consumes (zeroes) the gradient. The engine runs it
//     on its host queue, group by group: AdamW (offload/state/adamw.h), ZO-SGD (offload/state/zo_sgd.h).
//     Each says what state it needs (kState): the host store allocates only that.
#pragma once
#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "offload/state/adamw.h"
#include "offload/state/host_store.h"
#include "offload/state/state_placement.h"

namespace strata {

// One group's update walk over its placed state: for each range of the group (acquired, then
// released), for each parameter row with elements inside it, piece(row, state, first, n):
// `state` points at the row's element `first` in master, m and v, and n elements follow.
struct RowPiece {
  size_t row = 0;
  GroupState state;   // master, m, v at the piece's first element
  size_t first = 0;   // the piece's first element within the row
  int64_t n = 0;
};
template <class F>
void for_each_row_piece(HostStore& store, StatePlacement& placement, size_t group, F&& piece) {
  const ParamGroup& g = store.groups()[group];
  const TensorTable& ft = store.f32_table();
  const std::vector<StateRange> ranges = placement.ranges(group);
  for (size_t k = 0; k < ranges.size(); ++k) {
    const StateRange rg = ranges[k];
    const GroupState st = placement.acquire(group, k);
    for (size_t r = g.first_row; r < g.end_row; ++r) {
      const size_t row_begin = ft[r].offset, row_end = row_begin + ft[r].bytes();
      const size_t lo = std::max(row_begin, rg.begin), hi = std::min(row_end, rg.end);
      if (lo >= hi) continue;
      const size_t at = count_of<float>(lo - rg.begin);
      const size_t mb = store.state_elem_bytes(StateArray::m);
      auto moment = [&](void* a) -> void* { return a ? static_cast<char*>(a) + at * mb : nullptr; };
      piece(RowPiece{r, {st.master ? st.master + at : nullptr, moment(st.m), moment(st.v)},
                     count_of<float>(lo - row_begin), int64_t(count_of<float>(hi - lo))});
    }
    placement.release(group, k);
  }
}

class GroupOptimizer {
 public:
  virtual ~GroupOptimizer() = default;
  // hyper: this step's hyperparameters (step, lr, clip scale); weight_decay applies to matrices.
  virtual void update(size_t group, const AdamWParams& hyper, double weight_decay) = 0;
};

// AdamW over the placement's ranges of a group: each range's rows (or the parts of rows it
// holds) are updated in place; the update is elementwise, so how a group is cut into ranges
// changes no bit of the result. In f32 compute mode the master is the working copy and is
// updated in place (no second write). bf16 moments are rounded back stochastically, keyed by
// (step, row) and counted from the row's first element (adamw_round_keys): the same bits in RAM
// and on NVMe, and after a resume.
class HostAdamW final : public GroupOptimizer {
 public:
  static constexpr OptimizerStateNeeds kState = optimizer_state_needs(OptimizerKind::adamw);  // m, v, fp32 grad
  HostAdamW(HostStore& store, StatePlacement& placement) : store_(store), placement_(placement) {}
  void update(size_t group, const AdamWParams& hyper, double weight_decay) override;

  // Speculation (engine.cpp, offload.speculative_update): a clipped step's update of a group
  // started as its gradient lands, before the global norm is known. speculate() copies the
  // group's master, m and v into `backup` (speculation_backup_bytes), then updates with `hyper`
  // (clip scale 1) and keeps the gradient. Once the norm is known: commit() when it did not clip
  // (consumes the gradient: the state is what update() with clip scale 1 leaves), or redo() when
  // it did (master, m and v back from `backup`, then update() with the clip scale; the working
  // copy is written again from the restored master). Either way bit-identical to a plain
  // update() after the norm. Groups whose state is in RAM only (the backup and the restore are
  // copies of the placement's ranges, which must stay put).
  static size_t speculation_backup_bytes(const HostStore& store, size_t group);
  void speculate(size_t group, const AdamWParams& hyper, double weight_decay, char* backup);
  void commit(size_t group);
  void redo(size_t group, const AdamWParams& hyper, double weight_decay, const char* backup);

 private:
  void step_rows(size_t group, const AdamWParams& hyper, double weight_decay);  // AdamW, gradient kept
  // Copies each row piece's master, m and v into `backup` (save) or back from it, in walk order.
  void copy_state(size_t group, char* backup, bool save);

  HostStore& store_;
  StatePlacement& placement_;
};

}  // namespace strata
