#include "src/core/tensor.h"

#include <cstdio>

#include "src/core/error.h"

namespace strata {

const char* tier_name(Tier t) {
  switch (t) {
    case Tier::device: return "device";
    case Tier::host_pinned: return "host_pinned";
    case Tier::host: return "host";
    case Tier::nvme: return "nvme";
  }
  STRATA_ASSERT(false, "bad tier");
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

std::string format_bytes(size_t bytes) {
  char buf[64];
  double b = double(bytes);
  if (b >= 1024.0 * 1024 * 1024) std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1024.0 * 1024 * 1024));
  else if (b >= 1024.0 * 1024) std::snprintf(buf, sizeof buf, "%.1f MiB", b / (1024.0 * 1024));
  else if (b >= 1024.0) std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
  else std::snprintf(buf, sizeof buf, "%zu B", bytes);
  return buf;
}

size_t TensorTable::add(TensorSpec spec) {
  STRATA_ASSERT(!index_.count(spec.name), "duplicate tensor ", spec.name);
  for (int64_t d : spec.shape) STRATA_ASSERT(d >= 0, "negative dim in ", spec.name);
  index_[spec.name] = rows_.size();
  rows_.push_back(std::move(spec));
  return rows_.size() - 1;
}

const TensorSpec* TensorTable::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &rows_[it->second];
}

size_t TensorTable::index_of(const std::string& name) const {
  auto it = index_.find(name);
  STRATA_ASSERT(it != index_.end(), "no tensor named ", name);
  return it->second;
}

size_t TensorTable::layout(Tier tier) {
  size_t offset = 0;
  for (auto& r : rows_) {
    if (r.tier != tier) continue;
    r.offset = offset;
    offset += align_up(r.bytes());
  }
  tier_bytes_[int(tier)] = offset;
  return offset;
}

size_t TensorTable::tier_bytes(Tier tier) const { return tier_bytes_[int(tier)]; }

std::string TensorTable::summary() const {
  std::string out;
  for (int t = 0; t < kTierCount; ++t) {
    size_t count = 0;
    for (auto& r : rows_) count += r.tier == Tier(t);
    if (!count) continue;
    if (!out.empty()) out += ", ";
    out += str_cat(tier_name(Tier(t)), " ", format_bytes(tier_bytes_[t]), " (", count, " tensors)");
  }
  return out;
}

}  // namespace strata
