// LoRA dropout on the CPU (kernels/common/dropout_mask.h; plain-loop twin kernels/cpu/ref/dropout.h):
//   out (n) = mask(seed, tensor, i) · in / (1 − p)          (accumulate false)
//   out (n) = out + mask(seed, tensor, i) · in / (1 − p)    (accumulate true: the backward's dx +=)
// mask(i) is 1 (kept) or 0 (dropped, probability p); element i of the call is element i of the
// tensor (index 0 at `out`). p in [0, 1). In place (out == in, accumulate false) is allowed.
// Every element is a function of its index alone: bitwise the twin's, whatever the thread count.
// kernels/cpu/dropout.cpp is compiled with -ffp-contract=off (CMakeLists.txt), as on the GPU.
#pragma once
#include <cstdint>

namespace strata::cpu {

void dropout_apply(float* out, const float* in, uint64_t seed, uint32_t tensor, double p, int64_t n,
                   bool accumulate);

}  // namespace strata::cpu
