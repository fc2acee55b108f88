#include "offload/state/zo_sgd.h"

#include <algorithm>

#include "src/core/error.h"
#include "src/device/host_ops.h"

namespace strata {

void HostZoSgd::set_estimate(ZoSgdEstimate estimate) {
  STRATA_ASSERT(!estimate.seeds.empty() && estimate.seeds.size() == estimate.coefs.size());
  estimate_ = std::move(estimate);
}

void HostZoSgd::update(size_t group, const AdamWParams& hyper, double weight_decay) {
  const TensorTable& wt = store_.working_table();
  const int q = int(estimate_.seeds.size());
  for_each_row_piece(store_, placement_, group, [&](const RowPiece& pc) {
    const size_t r = pc.row;
    const float wd = wt[r].shape.size() == 2 ? float(weight_decay) : 0.f;  // no decay on norms, biases
    STRATA_ASSERT(wt[r].dtype == DType::f32 || wt[r].dtype == DType::bf16);
    char* working = static_cast<char*>(store_.working_of(r)) + pc.first * dtype_size(wt[r].dtype);
    host_zo_sgd_update(pc.state.master, working, wt[r].dtype == DType::bf16, estimate_.seeds.data(),
                       estimate_.coefs.data(), q, uint32_t(r), uint64_t(pc.first), float(hyper.lr), wd, pc.n);
  });
}

}  // namespace strata
