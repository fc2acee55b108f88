#include "offload/zo_sgd.h"

#include <algorithm>

#include "kernels/cpu/zo.h"
#include "src/core/error.h"

namespace strata {

void HostZoSgd::set_estimate(ZoSgdEstimate estimate) {
  STRATA_ASSERT(!estimate.seeds.empty() && estimate.seeds.size() == estimate.coefs.size());
  estimate_ = std::move(estimate);
}

void HostZoSgd::update(size_t group, const AdamWParams& hyper, double weight_decay) {
  const ParamGroup& g = store_.groups()[group];
  const TensorTable& wt = store_.working_table();
  const TensorTable& ft = store_.f32_table();
  const int q = int(estimate_.seeds.size());
  const std::vector<StateRange> ranges = placement_.ranges(group);
  for (size_t k = 0; k < ranges.size(); ++k) {
    const StateRange rg = ranges[k];
    const GroupState st = placement_.acquire(group, k);
    for (size_t r = g.first_row; r < g.end_row; ++r) {  // the part of each row inside the range
      const size_t row_begin = ft[r].offset, row_end = row_begin + ft[r].bytes();
      const size_t lo = std::max(row_begin, rg.begin), hi = std::min(row_end, rg.end);
      if (lo >= hi) continue;
      const size_t at = count_of<float>(lo - rg.begin), first = count_of<float>(lo - row_begin);
      const float wd = wt[r].shape.size() == 2 ? float(weight_decay) : 0.f;  // no decay on norms, biases
      STRATA_ASSERT(wt[r].dtype == DType::f32 || wt[r].dtype == DType::bf16);
      char* working = static_cast<char*>(store_.working_of(r)) + first * dtype_size(wt[r].dtype);
      cpu::zo_sgd_update(st.master + at, working, wt[r].dtype == DType::bf16, estimate_.seeds.data(),
                         estimate_.coefs.data(), q, uint32_t(r), uint64_t(first), float(hyper.lr), wd,
                         int64_t(count_of<float>(hi - lo)));
    }
    placement_.release(group, k);
  }
}

}  // namespace strata
