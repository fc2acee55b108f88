// The tensor table (STYLE §4): one row per tensor (name, shape, dtype, tier, offset). Arenas
// are sized and filled from it, checkpoints and the estimator read the same rows; nothing
// allocates behind its back.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "src/core/align.h"
#include "src/core/dtype.h"

namespace strata {

enum class Tier : uint8_t { device, host_pinned, host, nvme };
const char* tier_name(Tier t);
constexpr int kTierCount = 4;

using Shape = std::vector<int64_t>;
int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);  // "[4, 8]"

struct TensorSpec {
  std::string name;
  Shape shape;
  DType dtype = DType::f32;
  Tier tier = Tier::device;
  size_t offset = 0;  // in its tier's arena, set by TensorTable::layout
  int64_t numel() const { return shape_numel(shape); }
  size_t bytes() const { return size_t(numel()) * dtype_size(dtype); }
};

class TensorTable {
 public:
  static constexpr size_t kAlignment = kBufferAlignment;  // src/core/align.h

  size_t add(TensorSpec spec);  // returns the row index; names must be unique
  size_t size() const { return rows_.size(); }
  TensorSpec& operator[](size_t i) { return rows_[i]; }
  const TensorSpec& operator[](size_t i) const { return rows_[i]; }
  const TensorSpec* find(const std::string& name) const;
  size_t index_of(const std::string& name) const;  // asserts presence
  const std::vector<TensorSpec>& rows() const { return rows_; }

  // Assigns offsets to every row of `tier`, in row order, aligned; returns the arena bytes.
  size_t layout(Tier tier);
  size_t tier_bytes(Tier tier) const;  // valid after layout
  std::string summary() const;         // "device 12.5 MiB (30 tensors), host ..."

 private:
  std::vector<TensorSpec> rows_;
  std::unordered_map<std::string, size_t> index_;
  size_t tier_bytes_[kTierCount] = {};
};

std::string format_bytes(size_t bytes);  // "1.5 MiB"

}  // namespace strata
