// Scratch the CPU kernels keep on a thread from one call to the next (attention's bf16 inputs and
// kept dS, the lm_head loss's row tiles): vectors that only grow, and then to exactly what the
// call asks, so what a thread holds is the largest call's (kernels/cpu/ops.h, *_scratch_bytes),
// not a growth policy's multiple of it.
#pragma once
#include <cstddef>
#include <vector>

namespace strata::cpu {

// v holds at least n elements afterwards; when it grows, to exactly n.
template <class T>
T* scratch_grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) {
    v.reserve(n);
    v.resize(n);
  }
  return v.data();
}

}  // namespace strata::cpu
