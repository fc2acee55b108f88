// The CUDA mixture-of-experts ops (kernels/cuda/moe.cu; twins: cpu::moe_combine_* in
// kernels/cpu/ops.h, kernels/cpu/ref/moe.h). Kept out of ops.h so that adding them did not rebuild
// every kernel.
#pragma once
#include <cstdint>

#include <cuda_runtime_api.h>

namespace strata::cuda {

// out (N,C) += sum_j w[r] y[r] over token t's k rows r = token_row[t*k + j] (w null: 1), in j order.
void moe_combine_forward(float* out, const float* y, const float* w, const int32_t* token_row, int64_t n, int64_t k,
                         int64_t c, cudaStream_t stream);
// dy (M,C) = w[r] dout[row_token[r]], dw (M) = dout[row_token[r]] . y[r] (dw null: skipped).
void moe_combine_backward(float* dy, float* dw, const float* dout, const float* y, const float* w,
                          const int32_t* row_token, int64_t m, int64_t c, cudaStream_t stream);

}  // namespace strata::cuda
