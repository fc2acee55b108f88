#include "src/device/arena.h"

#include "src/core/error.h"
#include "src/core/fault.h"
#include "src/core/tensor.h"

namespace strata {

Arena::Arena(char* base, size_t budget_bytes, std::string what)
    : base_(base), budget_(budget_bytes), what_(std::move(what)) {
  if (budget_ > 0) free_[0] = budget_;
}

char* Arena::alloc(size_t bytes, const std::string& tensor) {
  const size_t need = footprint(bytes);
  auto best = free_.end();
  for (auto it = free_.begin(); it != free_.end(); ++it)
    if (it->second >= need && (best == free_.end() || it->second < best->second)) best = it;
  if (fault_point("arena-alloc") == FaultKind::alloc) best = free_.end();  // STRATA_FAULT: as if out of budget
  STRATA_CHECK_BUDGET(best != free_.end(), "the ", what_, " memory budget of ", format_bytes(budget_),
                      " is exhausted allocating ", tensor, " (", format_bytes(bytes), "; ",
                      format_bytes(used_), " in use): raise [device] memory in the recipe, or "
                      "shorten sequence_len / micro_batch_size");
  size_t offset = best->first, size = best->second;
  free_.erase(best);
  if (size > need) free_[offset + need] = size - need;
  live_[offset] = need;
  used_ += need;
  peak_ = std::max(peak_, used_);
  return base_ + offset;
}

void Arena::free(void* p) {
  if (!p) return;
  size_t offset = size_t(static_cast<char*>(p) - base_);
  auto it = live_.find(offset);
  STRATA_ASSERT(it != live_.end(), "arena free of a pointer it did not allocate");
  size_t size = it->second;
  live_.erase(it);
  used_ -= size;
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && offset + size == next->first) {
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      prev->second += size;
      return;
    }
  }
  free_[offset] = size;
}

}  // namespace strata
