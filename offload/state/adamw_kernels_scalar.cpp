// AdamW, the scalar variant: one element at a time, no vector instructions (auto-vectorisation
// is off for this file so it stays the plain fallback even under -march=native). The contract
// and the operation order are in adamw_kernels.h.
#pragma GCC optimize("fp-contract=off", "no-tree-vectorize")
#include "offload/state/adamw_kernels.h"

namespace strata::adamw_detail {

void adamw_kernel_scalar(const AdamWConstants& c, const AdamWSpan& s, int64_t begin, int64_t end) {
  adamw_span_scalar(c, s, begin, end);
}

}  // namespace strata::adamw_detail
