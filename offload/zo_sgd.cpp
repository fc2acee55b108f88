#include "offload/zo_sgd.h"

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
  const GroupState st = placement_.acquire(group);
  const int q = int(estimate_.seeds.size());
  for (size_t r = g.first_row; r < g.end_row; ++r) {
    const size_t at = count_of<float>(ft[r].offset - g.f32_offset);
    const float wd = wt[r].shape.size() == 2 ? float(weight_decay) : 0.f;  // no decay on norms, biases
    STRATA_ASSERT(wt[r].dtype == DType::f32 || wt[r].dtype == DType::bf16);
    cpu::zo_sgd_update(st.master + at, store_.working_of(r), wt[r].dtype == DType::bf16, estimate_.seeds.data(),
                       estimate_.coefs.data(), q, uint32_t(r), 0, float(hyper.lr), wd, wt[r].numel());
  }
  placement_.release(group);
}

}  // namespace strata
