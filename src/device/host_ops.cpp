#include "src/device/host_ops.h"

#include "kernels/cpu/ops.h"

namespace strata {

void host_embedding_backward(float* dtable, const float* dout, const int32_t* ids, int64_t n,
                             int64_t c) {
  cpu::embedding_backward(dtable, dout, ids, n, c);
}

}  // namespace strata
