// The CUDA launcher of LoRA dropout (semantics in kernels/cpu/dropout.h and
// kernels/common/dropout_mask.h, kernel in dropout.cu), beside kernels/cuda/ops.h in the same
// argument order: out (n) = mask(seed, tensor, i) · in / (1 − p), or out += that when
// accumulate; p in [0, 1). Bit-identical to the CPU kernel. Checks its sizes (strata::Error),
// enqueues on `stream` and returns at once.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace strata::cuda {

void dropout_apply(float* out, const float* in, uint64_t seed, uint32_t tensor, double p, int64_t n,
                   bool accumulate, cudaStream_t stream);

}  // namespace strata::cuda
