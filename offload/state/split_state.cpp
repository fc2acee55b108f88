#include "offload/state/split_state.h"

#include "src/core/error.h"

namespace strata {

SplitStatePlacement::SplitStatePlacement(std::unique_ptr<StatePlacement> ram, std::unique_ptr<NvmeStatePlacement> nvme,
                                         size_t first_group, size_t prefix_bytes, size_t moment_bytes)
    : ram_(std::move(ram)),
      nvme_(std::move(nvme)),
      first_group_(first_group),
      prefix_floats_(prefix_bytes / 4),
      moment_bytes_(moment_bytes) {
  STRATA_ASSERT(ram_ && nvme_ && first_group_ > 0 && prefix_bytes % 4 == 0);
  STRATA_ASSERT(moment_bytes_ == 4 || moment_bytes_ == 2);
}

void SplitStatePlacement::begin_pass(const std::vector<size_t>& groups) {
  std::vector<size_t> on_nvme;  // the pass's NVMe groups, in its order: their reads start now
  for (size_t g : groups)
    if (g >= first_group_) on_nvme.push_back(g);
  nvme_->begin_pass(on_nvme);
}

StatePlacement& SplitStatePlacement::part_at(StateArray a, size_t offset, size_t bytes) const {
  const size_t es = a == StateArray::master ? 4 : moment_bytes_;
  const size_t first = offset / es, end = (offset + bytes + es - 1) / es;
  if (end <= prefix_floats_) return *ram_;
  STRATA_ASSERT(first >= prefix_floats_, "a state span crosses the RAM/NVMe split: ", state_array_name(a),
                " elements [", first, ", ", end, ") against the split at element ", prefix_floats_);
  return *nvme_;
}

void SplitStatePlacement::read(StateArray a, size_t offset, void* dst, size_t bytes) {
  if (bytes) part_at(a, offset, bytes).read(a, offset, dst, bytes);
}

void SplitStatePlacement::write(StateArray a, size_t offset, const void* src, size_t bytes) {
  if (bytes) part_at(a, offset, bytes).write(a, offset, src, bytes);
}

NvmeStatePlacement* state_placement_nvme(StatePlacement& p) {
  if (auto* n = dynamic_cast<NvmeStatePlacement*>(&p)) return n;
  if (auto* s = dynamic_cast<SplitStatePlacement*>(&p)) return &s->nvme();
  return nullptr;
}

}  // namespace strata
