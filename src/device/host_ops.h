// Host-side ops: math the engine runs on host memory (on its host queue) rather than on a
// device stream, with the CPU kernels whatever the device backend is. The embedding lives
// here: its (V, C) table and gradient stay on the host (no V x C upload), so its backward is a
// scatter-add into the host gradient.
#pragma once
#include <cstdint>

namespace strata {

// dtable (V,C) += scatter of dout (N,C) by ids (N), in token order (kernels/cpu/ops.h).
void host_embedding_backward(float* dtable, const float* dout, const int32_t* ids, int64_t n,
                             int64_t c);

}  // namespace strata
