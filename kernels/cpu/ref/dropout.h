// Plain-loop twin of kernels/cpu/dropout.h (same arguments): one element at a time through
// kernels/common/dropout_mask.h, no blocking, no threads. Compiled in kernels/cpu/dropout.cpp
// (contraction off), so only declared here; the CPU fast path and the CUDA kernel equal it bit
// for bit.
#pragma once
#include <cstdint>

namespace strata::ref {

void dropout_apply(float* out, const float* in, uint64_t seed, uint32_t tensor, double p, int64_t n,
                   bool accumulate);

}  // namespace strata::ref
