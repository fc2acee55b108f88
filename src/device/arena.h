// A budgeted arena: hands out aligned ranges of one reserved block (a cudaMalloc on the CUDA
// backend, a host mapping on the CPU backend) with best-fit reuse and coalescing, and keeps a
// high-water mark. Exceeding the budget is a clear error naming the tensor (exit code 3).
#pragma once
#include <cstddef>
#include <map>
#include <string>

#include "src/core/align.h"

namespace strata {

class Arena {
 public:
  // The bytes alloc(bytes) takes from the budget: rounded up to kBufferAlignment, at least one
  // unit (so every allocation has its own address). Budget pre-checks use this, not a copy.
  static constexpr size_t footprint(size_t bytes) { return align_up(bytes > 0 ? bytes : 1); }

  Arena() = default;
  Arena(char* base, size_t budget_bytes, std::string what);  // what: "device", for messages

  char* alloc(size_t bytes, const std::string& tensor);  // throws Error(budget) when it can't fit
  void free(void* p);
  size_t budget_bytes() const { return budget_; }
  size_t used_bytes() const { return used_; }
  size_t peak_bytes() const { return peak_; }
  void reset_peak() { peak_ = used_; }

 private:
  char* base_ = nullptr;
  size_t budget_ = 0, used_ = 0, peak_ = 0;
  std::string what_;
  std::map<size_t, size_t> free_;   // offset -> size
  std::map<size_t, size_t> live_;   // offset -> size
};

}  // namespace strata
