#include "offload/optimizer.h"

#include <algorithm>
#include <cstring>

#include "src/core/error.h"

namespace strata {

const char* state_array_name(StateArray a) {
  switch (a) {
    case StateArray::master: return "master";
    case StateArray::m: return "exp_avg";
    case StateArray::v: return "exp_avg_sq";
  }
  return "?";
}

float* RamStatePlacement::array(StateArray a) const {
  switch (a) {
    case StateArray::master: return store_.master();
    case StateArray::m: return store_.m();
    case StateArray::v: return store_.v();
  }
  return nullptr;
}

std::vector<StateRange> RamStatePlacement::ranges(size_t group) const {
  const ParamGroup& g = store_.groups()[group];
  return {StateRange{g.f32_offset, g.f32_offset + g.f32_bytes}};
}

GroupState RamStatePlacement::acquire(size_t group, size_t range) {
  STRATA_ASSERT(range == 0);
  const size_t first = count_of<float>(store_.groups()[group].f32_offset);
  return {store_.master() + first, store_.m() + first, store_.v() + first};
}

void RamStatePlacement::read(StateArray a, size_t offset, void* dst, size_t bytes) {
  std::memcpy(dst, reinterpret_cast<const char*>(array(a)) + offset, bytes);
}

void RamStatePlacement::write(StateArray a, size_t offset, const void* src, size_t bytes) {
  std::memcpy(reinterpret_cast<char*>(array(a)) + offset, src, bytes);
}

void HostAdamW::update(size_t group, const AdamWParams& hyper, double weight_decay) {
  const ParamGroup& g = store_.groups()[group];
  const TensorTable& wt = store_.working_table();
  const TensorTable& ft = store_.f32_table();
  const bool in_place = store_.master_is_working();
  AdamWParams p = hyper;
  const std::vector<StateRange> ranges = placement_.ranges(group);
  for (size_t k = 0; k < ranges.size(); ++k) {
    const StateRange rg = ranges[k];
    const GroupState st = placement_.acquire(group, k);
    for (size_t r = g.first_row; r < g.end_row; ++r) {  // the part of each row inside the range
      const size_t row_begin = ft[r].offset, row_end = row_begin + ft[r].bytes();
      const size_t lo = std::max(row_begin, rg.begin), hi = std::min(row_end, rg.end);
      if (lo >= hi) continue;
      const size_t at = count_of<float>(lo - rg.begin), first = count_of<float>(lo - row_begin);
      char* working = in_place ? nullptr : static_cast<char*>(store_.working_of(r)) + first * dtype_size(wt[r].dtype);
      p.weight_decay = wt[r].shape.size() == 2 ? weight_decay : 0.0;  // no decay on norms, biases
      adamw_update(st.master + at, st.m + at, st.v + at, store_.grad_of(r) + first, working, wt[r].dtype,
                   int64_t(count_of<float>(hi - lo)), p);
    }
    placement_.release(group, k);
  }
  std::memset(store_.grad() + count_of<float>(g.f32_offset), 0, g.f32_bytes);  // consumed
}

}  // namespace strata
