#include "offload/optimizer.h"

#include <cstring>

namespace strata {

GroupState RamStatePlacement::acquire(size_t group) {
  const size_t first = count_of<float>(store_.groups()[group].f32_offset);
  return {store_.master() + first, store_.m() + first, store_.v() + first};
}

void HostAdamW::update(size_t group, const AdamWParams& hyper, double weight_decay) {
  const ParamGroup& g = store_.groups()[group];
  const TensorTable& wt = store_.working_table();
  const TensorTable& ft = store_.f32_table();
  const GroupState st = placement_.acquire(group);
  AdamWParams p = hyper;
  for (size_t r = g.first_row; r < g.end_row; ++r) {
    const size_t at = count_of<float>(ft[r].offset - g.f32_offset);
    p.weight_decay = wt[r].shape.size() == 2 ? weight_decay : 0.0;  // no decay on norms, biases
    adamw_update(st.master + at, st.m + at, st.v + at, store_.grad_of(r), store_.working_of(r), wt[r].dtype,
                 wt[r].numel(), p);
  }
  placement_.release(group);
  std::memset(store_.grad() + count_of<float>(g.f32_offset), 0, g.f32_bytes);  // consumed
}

}  // namespace strata
