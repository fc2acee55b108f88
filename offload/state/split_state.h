// The optimizer state split between RAM and NVMe by parameter group (HostStoreOptions::
// nvme_first_group): groups [0, first) keep master, m and v in the store's RAM arrays, which cover
// only their prefix of the f32 arena ([0, f32_prefix_bytes(layout, first))); groups [first, n) —
// the head and the last layers, the ones the backward finishes first — live in an
// NvmeStatePlacement that holds files for those groups alone. Only the overflow of RAM goes to
// NVMe. AdamW is elementwise, so where a group lives changes no bit of the result.
//
// Routing: by group for the optimizer's pass (begin_pass hands the NVMe part its groups, in the
// pass's order, so its read-ahead runs while the RAM groups update), by byte offset for byte
// access (an element below the prefix's end is in RAM; a span never crosses, as it lies inside
// one row and a row inside one group).
#pragma once
#include <memory>
#include <vector>

#include "offload/state/nvme_state.h"
#include "offload/state/state_placement.h"

namespace strata {

class SplitStatePlacement final : public StatePlacement {
 public:
  // `ram`: the store's arrays (valid for groups below first_group); `prefix_bytes`: the f32
  // arena's bytes they cover; `moment_bytes`: the moments' element size (4 or 2).
  SplitStatePlacement(std::unique_ptr<StatePlacement> ram, std::unique_ptr<NvmeStatePlacement> nvme,
                      size_t first_group, size_t prefix_bytes, size_t moment_bytes);

  std::vector<StateRange> ranges(size_t group) const override { return part(group).ranges(group); }
  void begin_pass(const std::vector<size_t>& groups) override;
  GroupState acquire(size_t group, size_t range) override { return part(group).acquire(group, range); }
  void release(size_t group, size_t range) override { part(group).release(group, range); }
  void read(StateArray a, size_t offset, void* dst, size_t bytes) override;
  void write(StateArray a, size_t offset, const void* src, size_t bytes) override;
  void flush() override { nvme_->flush(); }
  // Every element of `a` in RAM: only the master, and only when it is the f32 working copy.
  bool in_ram(StateArray a) const override { return ram_->in_ram(a) && nvme_->in_ram(a); }
  size_t host_bytes() const override { return ram_->host_bytes() + nvme_->host_bytes(); }
  StateIoCounters counters() const override { return nvme_->counters(); }

  size_t first_group() const { return first_group_; }
  NvmeStatePlacement& nvme() { return *nvme_; }

 private:
  StatePlacement& part(size_t group) const { return group < first_group_ ? *ram_ : *nvme_; }
  // The part holding bytes [offset, offset + bytes) of array a (checked not to cross the split).
  StatePlacement& part_at(StateArray a, size_t offset, size_t bytes) const;

  std::unique_ptr<StatePlacement> ram_;
  std::unique_ptr<NvmeStatePlacement> nvme_;
  size_t first_group_, prefix_floats_, moment_bytes_;
};

// The NVMe part of a placement: the placement itself (all on NVMe), a split's NVMe groups, or
// null (all in RAM). Tests inject I/O faults through it; the trainer reads nothing else of it.
NvmeStatePlacement* state_placement_nvme(StatePlacement& p);

}  // namespace strata
